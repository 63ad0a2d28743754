"""``EmbeddingStoreClient``: the remote embedding store, with the in-process store's methods.

A request for ``n`` keys is deduplicated, split by shard (``streamrec.keyhash.shard_of``),
sent to every shard at once and reassembled in the caller's order::

    keys     [7, 3, 7, 9]            (n,) int64, any order, duplicates allowed
    unique   [7, 3, 9]               first occurrence (C++ hash), inverse = [0, 1, 0, 2]
    by shard shard 0: [3, 9]   shard 1: [7]       (stable sort of unique keys by shard)
    replies  shard 0: rows of 3, 9   shard 1: row of 7   (sent together, then received)
    out      rows of [7, 3, 7, 9]    one gather: grouped_rows[rank[inverse]]

A table whose batches repeat few keys (uniform ids) skips the dedup (see
:data:`DEDUP_MIN_REPEATS`): its keys go as they are, and with one shard the reply is the
caller's rows without a copy.

``push`` sums the gradients, shows and clicks of duplicate keys before sending, and checks
them for NaN/Inf first, so a bad push writes nothing on any shard. The push of a training
step sends the keys its pull sent: the client keeps its recent routes (dedup + split; up to
:data:`ROUTE_CACHE_KEYS` keys, checked equal before reuse) so the push does not route again.

A shard's part of a ``pull`` or ``push`` larger than ``max_request_keys`` keys or
:data:`MAX_REQUEST_ROW_BYTES` of rows goes as several requests in flight at once (their
replies may come in any order; ``RpcClient`` sorts them).
The reply rows are spread back and the push's repeats summed by C++ ops over every core
(``take_rows``, ``sum_rows``: repeats in float64, in key order, as the store's update).

``pull_many``/``push_many`` do the same for every table of a batch and send ONE request per
shard holding each table's part for that shard (``counts`` per table, arrays concatenated and
flattened, see :mod:`~streamrec.embedding_store.server`): a batch of 15 tables costs one round
trip per shard instead of 15.

Threads: the client may be shared by several threads (a prefetch thread pulls while the main
thread pushes). Each thread gets its own ZeroMQ socket per shard (``threading.local``), so
requests of different threads are in flight at the same time and never see each other's
replies. A thread's sockets are closed when the thread ends (with its ``threading.local``)
or at :meth:`close`, which closes those of every thread.

Failures: a request that fails on one shard raises after every shard has answered; the other
shards may have applied their part (a push is then partly applied, as with any parameter
server; the client refuses malformed input before sending to avoid that in the common case).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from streamrec.embedding_store import _C
from streamrec.embedding_store.config import shard_dir_name
from streamrec.embedding_store.errors import InvalidInput, NonFiniteGradient, UnknownTable
from streamrec.embedding_store.options import TableOptions
from streamrec.embedding_store.store import check_aligned, unique_keys
from streamrec.errors import BadRequest, RemoteError
from streamrec.keyhash import shard_of
from streamrec.malloc import keep_freed_memory
from streamrec.wire import DEFAULT_MAX_MESSAGE_BYTES, Arrays, Meta, RpcClient

SAVE_MODES = ("checkpoint", "base", "delta", "batch")


def _as_keys(keys: Any) -> torch.Tensor:
    """(n,) int64 tensor from a tensor or array of int64 (or uint64, bit pattern kept)."""
    if isinstance(keys, torch.Tensor):
        t = keys.detach().cpu()
    else:
        arr = np.asarray(keys)
        if arr.dtype == np.uint64:
            arr = arr.view(np.int64)
        if arr.dtype != np.int64:
            raise InvalidInput(f"keys: dtype must be int64, got {arr.dtype}")
        t = torch.from_numpy(np.ascontiguousarray(arr))
    if t.dtype != torch.int64:
        raise InvalidInput(f"keys: dtype must be int64, got {t.dtype}")
    if t.dim() != 1:
        raise InvalidInput(f"keys: shape must be (n,), got {tuple(t.shape)}")
    return t.contiguous()


def _as_float(name: str, value: Any, shape: tuple[int, ...]) -> torch.Tensor:
    t = (
        value.detach().cpu()
        if isinstance(value, torch.Tensor)
        else torch.from_numpy(np.ascontiguousarray(np.asarray(value)))
    )
    if t.dtype != torch.float32:
        raise InvalidInput(f"{name}: dtype must be float32, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise InvalidInput(f"{name}: shape must be {shape}, got {tuple(t.shape)}")
    return t.contiguous()


def _sum_numeric(dicts: list[Any]) -> Any:
    """Sums numeric leaves of same-shaped dicts (rates and ratios are left out)."""
    first = dicts[0]
    if isinstance(first, dict):
        out = {}
        for key in first:
            if any(s in str(key) for s in ("rate", "ratio")):
                continue
            vals = [d.get(key) for d in dicts if isinstance(d, dict) and key in d]
            summed = _sum_numeric(vals) if len(vals) == len(dicts) else None
            if summed is not None:
                out[key] = summed
        return out
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in dicts):
        return sum(dicts)
    return first if all(v == first for v in dicts) else None


#: keys per pull/push request: a shard's larger part goes as several requests in flight at
#: once, so a message stays bounded whatever the batch (a 1M-key dim-64 pull would otherwise
#: be one 256 MB reply, near the 1 GiB cap). Not smaller: on the 2-core benchmark machine
#: parts of 32k keys cost 1-2 ms per 100k-key dim-16 step (more requests, each taking the
#: table's lock)
MAX_REQUEST_KEYS = 1 << 17
#: and rows of at most this many bytes per request (128k keys at dim 16, 32k at dim 64): while
#: one part of a wide table's pull or push crosses the wire the shard works on the one before
#: (a 100k-key dim-64 step over loopback tcp: 58.7 -> 54.9 ms, medians of 4 runs)
MAX_REQUEST_ROW_BYTES = 8 << 20

#: keys and routes held by the recent routes a push may reuse (pull_many of batch i + 1 is
#: routed before the push_many of batch i, so two batches of every table fit)
ROUTE_CACHE_KEYS = 1 << 22
ROUTE_CACHE_SIZE = 256

#: a table whose last measured batch repeated fewer than this share of its keys sends its
#: keys as they are, repeats included (the shard sums them itself, in the same float64 order,
#: so the rows come out the same): for nearly distinct keys the dedup, the spread back and the
#: summing cost more than the few rows they save on the wire (a 100k-key uniform dim-64 step:
#: about 9 ms against 0.1 ms of transport)
DEDUP_MIN_REPEATS = 0.1
#: of the routes a table makes (a push reusing its pull's route does not count), every this
#: many-th deduplicates again to measure anew
DEDUP_RECHECK = 16
DEDUP_MODES = ("auto", "always", "never")


@dataclass
class _Route:
    """One table's keys routed to the shards.

    keys: (u,) int64, the distinct keys (or all, without dedup) grouped by shard, shard 0 first.
    inverse: (n,) int64, the row among ``keys`` of each of the caller's keys.
    bounds: N + 1 offsets; shard k gets ``keys[bounds[k]:bounds[k + 1]]``.
    identity: ``keys`` is the caller's keys in their order (one shard; no duplicates, or
        not deduplicated).
    """

    keys: torch.Tensor
    inverse: torch.Tensor
    bounds: list[int]
    identity: bool


class _ThreadSockets:
    """One thread's RpcClients; closed when the thread ends and its local storage goes."""

    def __init__(self, clients: list[RpcClient]) -> None:
        self.clients = clients

    def __del__(self) -> None:
        for c in self.clients:
            c.close()


class EmbeddingStoreClient:
    """The embedding store served by N shard processes, behind the in-process interface.

    Args:
        endpoints: one ZeroMQ endpoint per shard, shard K at index K.
        tables: the tables (a list or name -> TableOptions); None asks shard 0. When given,
            their names and dims must match the shards'.
        timeout_s: per request and shard; :class:`~streamrec.errors.RpcTimeout` after it.
        max_message_bytes: cap on one message each way.
        check: ping every shard at start-up and check its index and shard count.
        max_request_keys: keys per request of ``pull``/``push``; a shard's larger part goes
            as several requests in flight at once (see :data:`MAX_REQUEST_KEYS`).
        dedup: ``"auto"`` (deduplicate a table's keys unless its batches repeat few of them,
            :data:`DEDUP_MIN_REPEATS`), ``"always"`` or ``"never"``; the rows are the same
            either way, only the bytes sent and the client's work differ.

    Example:
        >>> store = EmbeddingStoreClient(["tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556"])
        >>> rows = store.pull("user", torch.tensor([3, 7, 3]))      # (3, dim) float32
        >>> store.push("user", torch.tensor([3, 7, 3]), grads)      # grads (3, dim) float32
    """

    def __init__(
        self,
        endpoints: list[str],
        tables: Iterable[TableOptions] | Mapping[str, TableOptions] | None = None,
        timeout_s: float = 30.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        check: bool = True,
        max_request_keys: int = MAX_REQUEST_KEYS,
        dedup: str = "auto",
    ) -> None:
        if not endpoints:
            raise BadRequest("endpoints: at least one shard endpoint is needed, got []")
        keep_freed_memory()  # 25 MB replies and sums reuse the heap's pages (streamrec.malloc)
        if not isinstance(max_request_keys, int) or max_request_keys < 1:
            raise BadRequest(f"max_request_keys must be an integer >= 1, got {max_request_keys!r}")
        self.max_request_keys = max_request_keys
        if dedup not in DEDUP_MODES:
            raise BadRequest(f"dedup must be one of {list(DEDUP_MODES)}, got {dedup!r}")
        self.dedup = dedup
        self.endpoints = list(endpoints)
        self.num_shards = len(self.endpoints)
        self.timeout_s = timeout_s
        self.max_message_bytes = max_message_bytes
        self._local = threading.local()
        # fingerprint -> (caller's keys copied, route) of recent pulls and pushes, oldest first
        self._routes: dict[tuple[int, ...], tuple[torch.Tensor, _Route]] = {}
        self._routes_keys = 0
        self._routes_lock = threading.Lock()
        #: per table: (share of repeated keys in its last deduplicated batch, routes since)
        self._repeats: dict[str, tuple[float, int]] = {}
        # weak: the sockets of a thread that ended go with its threading.local storage
        self._all_clients: weakref.WeakSet[RpcClient] = weakref.WeakSet()
        self._clients_lock = threading.Lock()
        self._closed = False
        try:
            self._tables = self._check_shards(tables, check)
        except BaseException:
            self.close()
            raise

    def _check_shards(
        self, tables: Iterable[TableOptions] | Mapping[str, TableOptions] | None, ping: bool
    ) -> dict[str, TableOptions]:
        """Pings every shard (index and count) and returns the tables they serve."""
        if ping:
            for k, meta in enumerate(self._broadcast("ping")):
                if meta.get("shard_id") != k or meta.get("num_shards") != self.num_shards:
                    raise BadRequest(
                        f"endpoints[{k}] ({self.endpoints[k]}) serves shard "
                        f"{meta.get('shard_id')} of {meta.get('num_shards')}, expected shard "
                        f"{k} of {self.num_shards}: list endpoints in shard order"
                    )
        served = self._fetch_tables()
        if tables is None:
            return served
        given = dict(tables) if isinstance(tables, Mapping) else {t.name: t for t in tables}
        theirs = {n: t.dim for n, t in served.items()}
        ours = {n: t.dim for n, t in given.items()}
        if ours != theirs:
            raise BadRequest(f"tables {ours} (name: dim) differ from the shards' {theirs}")
        return given

    # -- plumbing ---------------------------------------------------------------------

    def _clients(self) -> list[RpcClient]:
        """This thread's RpcClient per shard (made on first use)."""
        if self._closed:
            raise BadRequest("the EmbeddingStoreClient is closed")
        held = getattr(self._local, "sockets", None)
        if held is None:
            held = _ThreadSockets(
                [
                    RpcClient(e, timeout_s=self.timeout_s, max_message_bytes=self.max_message_bytes)
                    for e in self.endpoints
                ]
            )
            with self._clients_lock:
                self._all_clients.update(held.clients)
            self._local.sockets = held
        return held.clients

    def _exchange(self, requests: list[tuple[int, str, Meta, Arrays]]) -> list[tuple[Meta, Arrays]]:
        """Sends every (shard, op, meta, arrays) at once, then receives every reply in order.

        Raises the first error only after every reply is in (or timed out), so no reply is
        left behind on a socket.
        """
        clients = self._clients()
        sent: list[tuple[int, int | None, BaseException | None]] = []
        for shard, op, meta, arrays in requests:
            try:
                sent.append((shard, clients[shard].send(op, meta, arrays), None))
            except Exception as exc:  # refused before sending (e.g. over the size cap)
                sent.append((shard, None, exc))
        replies: list[tuple[Meta, Arrays]] = []
        error: BaseException | None = None
        for shard, request_id, exc in sent:
            if exc is None and request_id is not None:
                try:
                    replies.append(clients[shard].receive(request_id))
                    continue
                except Exception as e:
                    exc = e
            replies.append(({}, {}))
            if error is None:
                error = exc
                if isinstance(exc, RemoteError):
                    exc.args = (f"shard {shard} ({self.endpoints[shard]}): {exc}",)
        if error is not None:
            raise error
        return replies

    def _broadcast(self, op: str, meta: Meta | None = None) -> list[Meta]:
        return [
            m for m, _ in self._exchange([(k, op, meta or {}, {}) for k in range(self.num_shards)])
        ]

    def _fetch_tables(self) -> dict[str, TableOptions]:
        meta, _ = self._exchange([(0, "tables", {}, {})])[0]
        return {
            t["name"]: TableOptions.parse(t, source="tables from shard 0") for t in meta["tables"]
        }

    def _table(self, table: str) -> TableOptions:
        if not isinstance(table, str) or table not in self._tables:
            raise UnknownTable(f"unknown table {table!r}; tables: {sorted(self._tables)}")
        return self._tables[table]

    def _split(self, unique: torch.Tensor) -> tuple[torch.Tensor | None, list[int]]:
        """Stable order of ``unique`` keys by shard and the shard boundaries in it.

        Returns:
            order: (u,) int64 with ``unique[order]`` grouped by shard 0, 1, ...; None when
                there is one shard (no reordering needed).
            bounds: N + 1 offsets into the grouped keys.
        """
        u = unique.numel()
        if self.num_shards == 1:
            return None, [0, u]
        shard = shard_of(unique.numpy(), self.num_shards)
        # small integers: numpy's stable sort is a radix sort here, O(u)
        small = shard.astype(np.int16 if self.num_shards < 2**15 else np.int64)
        order = np.argsort(small, kind="stable")
        bounds = np.zeros(self.num_shards + 1, dtype=np.int64)
        np.cumsum(np.bincount(shard, minlength=self.num_shards), out=bounds[1:])
        return torch.from_numpy(order), bounds.tolist()

    def _cuts(self, bounds: list[int], dim: int) -> list[tuple[int, int, int]]:
        """(shard, start, end) of each request: every shard's rows in parts of at most
        ``max_request_keys`` keys and :data:`MAX_REQUEST_ROW_BYTES` of ``dim`` floats, in
        order."""
        step = min(self.max_request_keys, max(1, MAX_REQUEST_ROW_BYTES // (4 * dim)))
        return [
            (k, a, min(a + step, bounds[k + 1]))
            for k in range(self.num_shards)
            for a in range(bounds[k], bounds[k + 1], step)
        ]

    def _requests(
        self, op: str, meta: Meta, grouped: dict[str, np.ndarray], cuts: list[tuple[int, int, int]]
    ) -> list[tuple[int, str, Meta, Arrays]]:
        """One request per cut, each array's rows [start, end)."""
        return [
            (k, op, meta, {name: arr[a:b] for name, arr in grouped.items()}) for k, a, b in cuts
        ]

    def _route(self, table: str, keys: torch.Tensor) -> _Route:
        """``keys`` (n,) int64 of ``table`` grouped by shard, deduplicated as ``dedup`` says
        (see the module doc); a recent route of equal keys is reused (found by a fingerprint,
        then checked equal)."""
        n = keys.numel()
        tag = (n, int(keys[0]), int(keys[n // 2]), int(keys[-1])) if n else (0,)
        with self._routes_lock:
            seen = self._routes.get(tag)
        if seen is not None and seen[0].shape == keys.shape and torch.equal(seen[0], keys):
            return seen[1]
        with self._routes_lock:  # routes made, not reused, count towards the next measure
            share, since = self._repeats.get(table, (1.0, 0))
            dedup = self.dedup == "always" or (
                self.dedup == "auto" and (share >= DEDUP_MIN_REPEATS or since + 1 >= DEDUP_RECHECK)
            )
            self._repeats[table] = (share, 0 if dedup else since + 1)
        inverse: torch.Tensor | None = None  # None: the keys as they are, repeats and all
        if dedup:
            unique, inverse = unique_keys(keys)
            with self._routes_lock:
                self._repeats[table] = (1.0 - unique.numel() / max(n, 1), 0)
        else:
            unique = keys
        order, bounds = self._split(unique)
        if order is None:
            if inverse is None:  # a copy: the route may be reused after the caller refills it
                unique, inverse = keys.clone(), torch.arange(n)
            route = _Route(unique, inverse, bounds, unique.numel() == n)
        else:
            rank = torch.empty_like(order)  # where each unique key sits among the grouped keys
            rank[order] = torch.arange(order.numel())
            route = _Route(
                unique.index_select(0, order),
                rank if inverse is None else rank.index_select(0, inverse),
                bounds,
                False,
            )
        if n <= ROUTE_CACHE_KEYS // 2:
            with self._routes_lock:  # a copy: the caller may refill its tensor
                old = self._routes.pop(tag, None)
                if old is not None:
                    self._routes_keys -= old[0].numel()
                self._routes[tag] = (keys.clone(), route)
                self._routes_keys += n
                while self._routes_keys > ROUTE_CACHE_KEYS or len(self._routes) > ROUTE_CACHE_SIZE:
                    oldest = next(iter(self._routes))
                    self._routes_keys -= self._routes.pop(oldest)[0].numel()
        return route

    def _assemble(
        self, table: str, r: _Route, parts: list[tuple[int, int, np.ndarray]]
    ) -> torch.Tensor:
        """The caller's rows (n, dim) float32 from the reply parts (shard, rows, values),
        which hold the routed rows in order."""
        dim = self._tables[table].dim
        rows = []
        for k, n, part in parts:
            arr = np.asarray(part)
            if arr.dtype != np.float32 or arr.size != n * dim:
                raise RemoteError(
                    "bad_reply",
                    f"shard {k} sent values of table {table!r} of shape {arr.shape} {arr.dtype}, "
                    f"expected ({n}, {dim}) float32",
                )
            rows.append(torch.from_numpy(arr).view(n, dim))
        if not rows:
            return torch.zeros((r.inverse.numel(), dim), dtype=torch.float32)
        if r.identity and len(rows) == 1 and np.asarray(parts[0][2]).flags.writeable:
            return rows[0]  # the reply's rows are the caller's, in order: no copy
        return _C.take_rows(rows, r.inverse)

    def _many_requests(
        self,
        op: str,
        meta: Meta,
        tables: list[str],
        routes: list[_Route],
        columns: list[dict[str, torch.Tensor]],
    ) -> list[tuple[int, str, Meta, Arrays]]:
        """One request per shard holding every table's part for that shard: ``counts`` (T,)
        and each column's parts concatenated, flattened (tables may differ in dim)."""
        requests = []
        for k in range(self.num_shards):
            counts = np.array([r.bounds[k + 1] - r.bounds[k] for r in routes], dtype=np.int64)
            if not counts.any():
                continue
            arrays: Arrays = {"counts": counts}
            for name in columns[0]:
                flat = [
                    cols[name][r.bounds[k] : r.bounds[k + 1]].reshape(-1)
                    for r, cols in zip(routes, columns, strict=True)
                ]
                arrays[name] = torch.cat(flat).numpy()
            requests.append((k, op, {**meta, "tables": list(tables)}, arrays))
        return requests

    # -- the store interface ----------------------------------------------------------

    @property
    def tables(self) -> dict[str, TableOptions]:
        """Table name -> options, as the shards serve them."""
        return dict(self._tables)

    def pull(self, table: str, keys: Any, create: bool = True) -> torch.Tensor:
        """Rows of ``keys``: (n,) int64 -> (n, dim) float32, in the order of ``keys``.

        ``create=False`` (prediction) creates nothing; missing keys read as the store reads
        them (zeros).
        """
        dim = self._table(table).dim
        keys_t = _as_keys(keys)
        if keys_t.numel() == 0:
            return torch.zeros((0, dim), dtype=torch.float32)
        r = self._route(table, keys_t)
        meta = {"table": table, "create": bool(create)}
        cuts = self._cuts(r.bounds, dim)
        replies = self._exchange(self._requests("pull", meta, {"keys": r.keys.numpy()}, cuts))
        parts = [
            (k, b - a, reply["values"]) for (k, a, b), (_, reply) in zip(cuts, replies, strict=True)
        ]
        return self._assemble(table, r, parts)

    def pull_many(
        self, tables: list[str], keys: list[Any], create: bool = True
    ) -> list[torch.Tensor]:
        """:meth:`pull` of several tables in one request per shard (``pull_many`` op).

        Args:
            tables: T table names.
            keys: T arrays, ``keys[t]`` (n_t,) int64.
            create: as in :meth:`pull`.

        Returns:
            T tensors, ``out[t]`` (n_t, dim_t) float32 in the order of ``keys[t]``.
        """
        check_aligned(tables, keys=keys)
        dims = [self._table(t).dim for t in tables]
        routes = [self._route(t, _as_keys(k)) for t, k in zip(tables, keys, strict=True)]
        requests = self._many_requests(
            "pull_many",
            {"create": bool(create)},
            tables,
            routes,
            [{"keys": r.keys} for r in routes],
        )
        parts: list[list[tuple[int, int, np.ndarray]]] = [[] for _ in tables]
        for (k, _, _, arrays), (_, reply) in zip(requests, self._exchange(requests), strict=True):
            values = np.asarray(reply["values"]).reshape(-1)
            cuts = np.cumsum(arrays["counts"] * np.asarray(dims, dtype=np.int64))
            if values.size != (cuts[-1] if cuts.size else 0):
                raise RemoteError(
                    "bad_reply",
                    f"shard {k} sent {values.size} values, expected {int(cuts[-1])}",
                )
            for t, v in enumerate(np.split(values, cuts[:-1])):
                parts[t].append((k, int(arrays["counts"][t]), v))
        return [self._assemble(t, r, p) for t, r, p in zip(tables, routes, parts, strict=True)]

    def push(
        self, table: str, keys: Any, grads: Any, shows: Any = None, clicks: Any = None
    ) -> None:
        """Applies gradients: keys (n,) int64, grads (n, dim) float32, shows/clicks (n,)
        float32 or None (as in the store: 1 show per key occurrence, 0 clicks). Duplicate keys
        are summed first; NaN/Inf is refused before anything is sent.
        """
        checked = self._push_columns(table, keys, grads, shows, clicks)
        if checked is None:
            return
        r, columns = checked
        grouped = {name: v.numpy() for name, v in columns.items()}
        cuts = self._cuts(r.bounds, self._tables[table].dim)
        self._exchange(self._requests("push", {"table": table}, grouped, cuts))

    def push_many(
        self,
        tables: list[str],
        keys: list[Any],
        grads: list[Any],
        shows: list[Any] | None = None,
        clicks: list[Any] | None = None,
    ) -> None:
        """:meth:`push` of several tables in one request per shard (``push_many`` op).

        Every table's part is checked (dtypes, shapes, NaN/Inf) before anything is sent, so a
        bad one pushes nothing to any table.

        Args:
            tables: T table names.
            keys: T arrays (n_t,) int64.
            grads: T arrays (n_t, dim_t) float32.
            shows: None, or T arrays (n_t,) float32 (or None: 1 per occurrence).
            clicks: None, or T arrays (n_t,) float32 (or None: 0).
        """
        count = check_aligned(tables, keys=keys, grads=grads, shows=shows, clicks=clicks)
        shows = [None] * count if shows is None else shows
        clicks = [None] * count if clicks is None else clicks
        checked = [
            self._push_columns(*part)
            for part in zip(tables, keys, grads, shows, clicks, strict=True)
        ]
        kept = [(t, c) for t, c in zip(tables, checked, strict=True) if c is not None]
        if not kept:
            return
        # one set of arrays for every table: a table without shows/clicks gets the defaults
        for name, fill in (("shows", torch.ones), ("clicks", torch.zeros)):
            if any(name in cols for _, (_, cols) in kept):
                for _, (r, cols) in kept:
                    cols.setdefault(name, fill(r.keys.numel(), dtype=torch.float32))
        self._exchange(
            self._many_requests(
                "push_many",
                {},
                [t for t, _ in kept],
                [r for _, (r, _) in kept],
                [c for _, (_, c) in kept],
            )
        )

    def _push_columns(
        self, table: str, keys: Any, grads: Any, shows: Any, clicks: Any
    ) -> tuple[_Route, dict[str, torch.Tensor]] | None:
        """One table's push checked, duplicates summed and rows grouped by shard: the route
        and the columns ``keys`` (u,), ``grads`` (u, dim), [``shows``, ``clicks``] (u,); None
        when there are no keys. Raises before anything is sent."""
        dim = self._table(table).dim
        keys_t = _as_keys(keys)
        n = keys_t.numel()
        g = _as_float(f"grads of table {table!r}", grads, (n, dim))
        extra = {
            name: _as_float(f"{name} of table {table!r}", v, (n,))
            for name, v in (("shows", shows), ("clicks", clicks))
            if v is not None
        }
        if n == 0:
            return None
        r = self._route(table, keys_t)
        u = r.keys.numel()
        columns = {"grads": g, **extra}
        finite = {}
        for name, v in columns.items():
            if r.identity:
                finite[name] = _C.all_finite(v)
            else:  # sum duplicates into, and order by, the routed rows (C++, every core)
                summed, finite[name] = _C.sum_rows(v.view(n, -1), r.inverse, u)
                columns[name] = summed.view((u, *v.shape[1:]))
        if u < n and "shows" not in columns:  # the store's 1 show per occurrence
            columns["shows"] = torch.bincount(r.inverse, minlength=u).to(torch.float32)
        for name, v in columns.items():
            if not finite.get(name, True):
                raise NonFiniteGradient(
                    f"{name}: holds NaN or Inf (after summing duplicate keys); "
                    f"nothing was pushed to table {table!r}"
                )
            if name != "grads" and bool((v < 0).any()):
                raise InvalidInput(f"{name}: must be >= 0; nothing was pushed to table {table!r}")
        return r, {"keys": r.keys, **columns}

    def size(self, table: str) -> int:
        """Rows of ``table`` over all shards."""
        self._table(table)
        return sum(int(m["size"]) for m in self._broadcast("size", {"table": table}))

    def sizes(self, table: str) -> list[int]:
        """Rows of ``table`` per shard."""
        self._table(table)
        return [int(m["size"]) for m in self._broadcast("size", {"table": table})]

    def shrink(self) -> dict[str, int]:
        """Shrinks every shard; returns rows deleted per table (summed over shards)."""
        total: dict[str, int] = {}
        for meta in self._broadcast("shrink"):
            for name, count in (meta.get("deleted") or {}).items():
                total[name] = total.get(name, 0) + int(count)
        return total

    def advance_day(self) -> None:
        """Advances the day on every shard (unseen-day counters, decay at the next shrink)."""
        self._broadcast("advance_day")

    def save(
        self, path: str, mode: str = "checkpoint", converter: str | None = None
    ) -> dict[str, Any]:
        """Every shard saves into ``path/shard-K-of-N/`` with its own manifest.

        Args:
            path: a directory the shards can write (a shared volume).
            mode: checkpoint | base | delta | batch.
            converter: where base/delta rows go: None or "files" (in the shard directories),
                "redis" (the shards' serving Redis, ``--redis-url``). A converter object
                cannot travel to the shards.

        Returns:
            {"path", "mode", "num_shards", "shards": [{"dir", "manifest"} per shard]}.
        """
        if mode not in SAVE_MODES:
            raise BadRequest(f"mode must be one of {list(SAVE_MODES)}, got {mode!r}")
        meta = {"path": str(path), "mode": mode, **self._converter_meta(converter)}
        metas = self._broadcast("save", meta)
        return {"path": str(path), "mode": mode, "num_shards": self.num_shards, "shards": metas}

    def load(self, path: str, converter: str | None = None) -> None:
        """Every shard loads ``path/shard-K-of-N/``; the shard count must match the save.

        Two phases: every shard first checks its directory (manifest, files, checksums, shard
        count) and only when all are good do they load, so a bad checkpoint changes no shard.
        """
        meta = {"path": str(path), **self._converter_meta(converter)}
        self._broadcast("load", {**meta, "verify_only": True})
        self._broadcast("load", meta)

    @staticmethod
    def _converter_meta(converter: Any) -> Meta:
        if converter is None:
            return {}
        if converter not in ("files", "redis"):
            raise BadRequest(
                f"converter must be None, 'files' or 'redis' for the remote store, got "
                f"{converter!r} (converter objects work with the in-process store)"
            )
        return {"converter": converter}

    def stats(self) -> dict[str, Any]:
        """{"num_shards", "shards": [stats of each shard], "total": numeric leaves summed}."""
        shards = [m["stats"] for m in self._broadcast("stats")]
        return {
            "num_shards": self.num_shards,
            "shards": shards,
            "total": _sum_numeric(shards) or {},
        }

    def shard_dirs(self, path: str) -> list[str]:
        """Where each shard saves under ``path``."""
        return [f"{path}/{shard_dir_name(k, self.num_shards)}" for k in range(self.num_shards)]

    def close(self) -> None:
        """Closes the sockets of every thread; the client is unusable afterwards."""
        self._closed = True
        with self._routes_lock:
            self._routes.clear()
            self._routes_keys = 0
        with self._clients_lock:
            for c in list(self._all_clients):
                c.close()
            self._all_clients.clear()

    def __enter__(self) -> EmbeddingStoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
