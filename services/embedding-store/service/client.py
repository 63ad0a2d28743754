"""``EmbeddingStoreClient``: the remote embedding store, with the in-process store's methods.

A request is checked (:mod:`~streamrec.embedding_store.validation`, the in-process store's
rules), routed (:mod:`~streamrec.embedding_store.service.routing`: deduplicated, split by shard,
cut into requests of bounded size), sent to every shard at once and put back in the
caller's order.

``push`` sums the gradients, shows and clicks of duplicate keys before sending, and checks
them for NaN/Inf first, so a bad push writes nothing on any shard. The push of a training
step reuses the route of the pull that sent the same keys. The reply rows are spread back
and the push's repeats summed by C++ ops over every core (``take_rows``, ``sum_rows``:
repeats in float64, in key order, as the store's update).

``pull_many``/``push_many`` (and ``pull_rows``/``push_rows``) send ONE request per shard
holding every table's part (``counts`` per table): one round trip per shard per batch.

Transport (:mod:`~streamrec.embedding_store.service.shard_link`): one ZeroMQ socket per shard and
thread, every request in flight at once, failures raised after every shard has answered, and
the incarnation of each shard: a shard restarted empty at the same address answers its next
data op with :class:`~streamrec.embedding_store.errors.ShardRestarted`; a full
:meth:`EmbeddingStoreClient.load` (a checkpoint) takes the new incarnation, as
:meth:`EmbeddingStoreClient.accept_restarts` does.

Namespaces (:mod:`~streamrec.embedding_store.service.namespaces`): a client made with ``namespace``
creates its tables there on every shard and sends the name with every op; a shard without it
answers ``UnknownNamespace`` (a ``ShardRestarted``); ``load`` and ``accept_restarts`` make
the tables again first.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import streamrec.embedding_store._C as _C
import torch
from streamrec.auth import load_token
from streamrec.embedding_store.dedup import DedupPolicy
from streamrec.embedding_store.errors import UnknownTable
from streamrec.embedding_store.service.client_admin import ShardsAdmin
from streamrec.embedding_store.service.namespaces import check_namespace
from streamrec.embedding_store.service.routing import (
    MAX_REQUEST_KEYS,
    Route,
    Router,
    ShardPart,
    assemble,
    assemble_block,
    cut_arrays,
    many_parts,
    request_cuts,
    route_block,
    split_many_replies,
)
from streamrec.embedding_store.service.shard_link import Request, ShardLink
from streamrec.embedding_store.service.stats import sum_stats
from streamrec.embedding_store.sparse_store import check_rows_layout
from streamrec.embedding_store.validation import (
    FloatsLike,
    KeysLike,
    as_floats,
    as_keys,
    check_aligned,
    first_bad_value,
    refuse_push,
)
from streamrec.errors import BadRequest
from streamrec.malloc import keep_freed_memory
from streamrec.store_schema import TableOptions
from streamrec.wire import DEFAULT_MAX_MESSAGE_BYTES, Arrays, Meta


class EmbeddingStoreClient(ShardsAdmin):
    """The embedding store served by N shard processes, behind the in-process interface.

    Args:
        endpoints: one ZeroMQ endpoint per shard, shard K at index K.
        tables: the tables (a list or name -> TableOptions); None asks shard 0. When given,
            their names and dims must match the shards'.
        timeout_s: per request and shard; :class:`~streamrec.errors.RpcTimeout` after it.
        max_message_bytes: cap on one message each way.
        check: ping every shard at start-up and check its index and shard count.
        max_request_keys: keys per request of ``pull``/``push``; a shard's larger part goes
            as several requests in flight at once (see ``routing.MAX_REQUEST_KEYS``).
        dedup: ``"auto"`` (deduplicate a table's keys unless its batches repeat few of them,
            ``dedup.DEDUP_MIN_REPEATS``), ``"always"`` or ``"never"``; the rows are the same
            either way, only the bytes sent and the client's work differ.
        auth_token_file: the file holding the shards' peer token; None:
            ``$STREAMREC_AUTH_TOKEN_FILE``, else the per-user file (:mod:`streamrec.auth`).
        namespace: the shards' namespace of this client's tables (a job's own, e.g. its
            id); with ``tables`` they are created there on every shard (idempotent; other
            options for a name held: ``TableConflict``); without, the namespace must exist.
            None: the default namespace (the shards' ``--tables``).
        generation: the trainer group's assignment (a pool member's; only grows), sent with
            the namespace: once a shard has seen a newer one there, this client's requests
            are refused (``StaleGeneration``). None: not fenced.

    Example:
        >>> store = EmbeddingStoreClient(["tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556"])
        >>> rows = store.pull("user", torch.tensor([3, 7, 3]))      # (3, dim) float32
        >>> store.push("user", torch.tensor([3, 7, 3]), grads)      # grads (3, dim) float32
        >>> job = EmbeddingStoreClient(endpoints, tables, namespace="job-17")  # its own rows
        >>> job.drop_namespace()                                    # frees them on every shard
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
        auth_token_file: str | os.PathLike[str] | None = None,
        namespace: str | None = None,
        generation: int | None = None,
    ) -> None:
        self.namespace = check_namespace(namespace, "namespace")
        if generation is not None and (
            isinstance(generation, bool) or not isinstance(generation, int) or generation < 0
        ):
            raise BadRequest(f"generation must be an integer >= 0 or None, got {generation!r}")
        self._created: list[TableOptions] = []  # what create_tables made, made again on load
        if not endpoints:
            raise BadRequest("endpoints: at least one shard endpoint is needed, got []")
        keep_freed_memory()  # 25 MB replies and sums reuse the heap's pages (streamrec.malloc)
        if not isinstance(max_request_keys, int) or max_request_keys < 1:
            raise BadRequest(f"max_request_keys must be an integer >= 1, got {max_request_keys!r}")
        self.max_request_keys = max_request_keys
        policy = DedupPolicy(dedup)
        self.dedup = dedup
        self.endpoints = list(endpoints)
        self.num_shards = len(self.endpoints)
        self.timeout_s = timeout_s
        self.max_message_bytes = max_message_bytes
        self._router = Router(self.num_shards, policy)
        self._link = ShardLink(
            self.endpoints,
            timeout_s,
            max_message_bytes,
            load_token(auth_token_file),
            self.namespace,
            generation,
        )
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
            for k, meta in enumerate(self._link.broadcast("ping")):
                if meta.get("shard_id") != k or meta.get("num_shards") != self.num_shards:
                    raise BadRequest(
                        f"endpoints[{k}] ({self.endpoints[k]}) serves shard "
                        f"{meta.get('shard_id')} of {meta.get('num_shards')}, expected shard "
                        f"{k} of {self.num_shards}: list endpoints in shard order"
                    )
        given = None
        if tables is not None:
            given = dict(tables) if isinstance(tables, Mapping) else {t.name: t for t in tables}
            if self.namespace:
                self._created = list(given.values())
                self._create_tables()
        served = self._fetch_tables()
        if given is None:
            return served
        theirs = {n: t.dim for n, t in served.items()}
        ours = {n: t.dim for n, t in given.items()}
        if ours != theirs:
            raise BadRequest(f"tables {ours} (name: dim) differ from the shards' {theirs}")
        return given

    # -- plumbing ---------------------------------------------------------------------

    def _fetch_tables(self) -> dict[str, TableOptions]:
        meta, _ = self._link.exchange([(0, "tables", {}, {})])[0]
        return {
            t["name"]: TableOptions.parse(t, source="tables from shard 0") for t in meta["tables"]
        }

    def _table(self, table: str) -> TableOptions:
        if not isinstance(table, str) or table not in self._tables:
            raise UnknownTable(f"unknown table {table!r}; tables: {sorted(self._tables)}")
        return self._tables[table]

    def _assemble(
        self, table: str, r: Route, parts: list[tuple[int, int, np.ndarray]]
    ) -> torch.Tensor:
        """The caller's rows (n, dim) float32 from the reply parts (shard, rows, values)."""
        return assemble(table, self._tables[table].checked_dim(), r, parts)

    def _many_requests(
        self,
        op: str,
        meta: Meta,
        tables: list[str],
        routes: list[Route],
        columns: list[dict[str, torch.Tensor]],
    ) -> list[Request]:
        """One request per shard holding every table's part (``routing.many_parts``)."""
        meta = {**meta, "tables": list(tables)}
        return [(k, op, meta, arrays) for k, arrays in many_parts(routes, columns)]

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
        dim = self._table(table).checked_dim()
        keys_t = as_keys(keys)
        if keys_t.numel() == 0:
            return torch.zeros((0, dim), dtype=torch.float32)
        r = self._router.route(table, keys_t)
        meta = {"table": table, "create": bool(create)}
        cuts = request_cuts(r.bounds, dim, self.max_request_keys)
        replies = self._link.exchange(
            [(k, "pull", meta, part) for k, part in cut_arrays({"keys": r.keys.numpy()}, cuts)]
        )
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
        dims = [self._table(t).checked_dim() for t in tables]
        routes = [
            self._router.route(t, as_keys(k, f"table {t!r}: keys"))
            for t, k in zip(tables, keys, strict=True)
        ]
        requests = self._many_requests(
            "pull_many",
            {"create": bool(create)},
            tables,
            routes,
            [{"keys": r.keys} for r in routes],
        )
        replies = self._link.exchange(requests)
        parts = split_many_replies(
            [
                (k, arrays["counts"], reply["values"])
                for (k, _, _, arrays), (_, reply) in zip(requests, replies, strict=True)
            ],
            dims,
        )
        return [self._assemble(t, r, p) for t, r, p in zip(tables, routes, parts, strict=True)]

    # -- every table of a batch as one block of rows (the trainer's fused path) ---------
    def pull_rows(
        self, tables: list[str], keys: KeysLike, counts: list[int], create: bool = True
    ) -> torch.Tensor:
        """The rows of several tables' keys as ONE tensor, one ``pull_many`` request per shard.

        The trainer's path (:class:`streamrec.trainer.sparse.SparseTables`): the keys of every
        table come concatenated, table-major, and the rows go back the same way, so routing
        is one vectorised pass over all of them (no per-table work on the caller's thread)
        and each shard's reply is written straight into the result. Keys may repeat.

        Args:
            tables: T table names, all of one dim.
            keys: (n,) int64, ``counts[t]`` keys of ``tables[t]`` after those of tables < t.
            counts: T ints summing to n.
            create: as in :meth:`pull`.

        Returns:
            (n, dim) float32, row i the row of ``keys[i]`` in its table.
        """
        dim, keys_t, plan = self._rows_plan(tables, keys, counts)
        meta = {"create": bool(create), "tables": list(tables)}
        requests = [(k, "pull_many", meta, {"counts": c, "keys": kk}) for k, c, kk, _ in plan]
        replies = self._link.exchange(requests)
        return assemble_block(
            plan, [reply.get("values") for _, reply in replies], keys_t.numel(), dim
        )

    def push_rows(
        self,
        tables: list[str],
        keys: KeysLike,
        counts: list[int],
        grads: FloatsLike,
        shows: FloatsLike | None = None,
        clicks: FloatsLike | None = None,
    ) -> None:
        """:meth:`push_many` of keys, gradients, shows and clicks laid out as
        :meth:`pull_rows` takes them: one request per shard, nothing done per table.

        Every value is checked (NaN/Inf, shows and clicks >= 0) before anything is sent, so a
        bad push writes nothing; the error names the first bad table. Repeated keys are summed
        by the shards (as the store's push does).

        Args:
            tables: T table names, all of one dim.
            keys: (n,) int64, table-major (see :meth:`pull_rows`); counts: T ints.
            grads: (n, dim) float32.
            shows: (n,) float32 or None (1 per key occurrence); clicks: (n,) or None (0).
        """
        dim, keys_t, plan = self._rows_plan(tables, keys, counts)
        n = keys_t.numel()
        columns = {"grads": as_floats(grads, "grads", (n, dim))}
        for name, value, fill in (("shows", shows, 1.0), ("clicks", clicks, 0.0)):
            columns[name] = (
                torch.full((n,), fill) if value is None else as_floats(value, name, (n,))
            )
        bad = first_bad_value(columns)
        if bad is not None:
            table = tables[int(np.searchsorted(np.cumsum(counts), bad[1], side="right"))]
            refuse_push(bad, table, f"key {bad[1]} of {n}")
        requests = []
        for k, c, kk, where in plan:
            arrays: Arrays = {"counts": c, "keys": kk}
            for name, v in columns.items():
                part = v if where is None else v.index_select(0, where)
                arrays[name] = part.reshape(-1).numpy()
            requests.append((k, "push_many", {"tables": list(tables)}, arrays))
        self._link.exchange(requests)

    def _rows_plan(
        self, tables: list[str], keys: Any, counts: list[int]
    ) -> tuple[int, torch.Tensor, list[ShardPart]]:
        """Checks a :meth:`pull_rows`/:meth:`push_rows` call and routes its keys: (dim, keys,
        each shard's part, ``routing.route_block``)."""
        check_aligned(tables, counts=counts)
        keys_t = as_keys(keys)
        dims = {self._table(t).checked_dim() for t in tables}
        dim = check_rows_layout(tables, keys_t, counts, dims)
        return dim, keys_t, route_block(keys_t, counts, self.num_shards)

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
        cuts = request_cuts(r.bounds, self._tables[table].checked_dim(), self.max_request_keys)
        meta = {"table": table}
        self._link.exchange([(k, "push", meta, part) for k, part in cut_arrays(grouped, cuts)])

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
        bad one pushes nothing to any table. Arguments as the in-process store's
        (:meth:`EmbeddingStore.push_many`): T table names, then T arrays of each.
        """
        count = check_aligned(tables, keys=keys, grads=grads, shows=shows, clicks=clicks)
        shows = [None] * count if shows is None else shows
        clicks = [None] * count if clicks is None else clicks
        # the tables' values are checked below, once over every table's concatenation
        checked = [
            self._push_columns(*part, check=False)
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
        requests = self._many_requests(
            "push_many",
            {},
            [t for t, _ in kept],
            [r for _, (r, _) in kept],
            [c for _, (_, c) in kept],
        )
        if any(first_bad_value(arrays) for _, _, _, arrays in requests):
            for t, (_, cols) in kept:  # the first bad table, named in the error
                bad = first_bad_value(cols)
                if bad is not None:
                    refuse_push(bad, t, "after summing duplicate keys")
        self._link.exchange(requests)

    def _push_columns(
        self, table: str, keys: Any, grads: Any, shows: Any, clicks: Any, check: bool = True
    ) -> tuple[Route, dict[str, torch.Tensor]] | None:
        """One table's push checked, duplicates summed and rows grouped by shard: the route
        and the columns ``keys`` (u,), ``grads`` (u, dim), [``shows``, ``clicks``] (u,); None
        when there are no keys. Raises before anything is sent; ``check`` False leaves the
        values (NaN/Inf, negative counts) to the caller."""
        dim = self._table(table).checked_dim()
        keys_t = as_keys(keys, f"table {table!r}: keys")
        n = keys_t.numel()
        g = as_floats(grads, f"table {table!r}: grads", (n, dim))
        extra = {
            name: as_floats(v, f"table {table!r}: {name}", (n,))
            for name, v in (("shows", shows), ("clicks", clicks))
            if v is not None
        }
        if n == 0:
            return None
        r = self._router.route(table, keys_t)
        u = r.keys.numel()
        columns = {"grads": g, **extra}
        if not r.identity:
            for name, v in columns.items():
                # sum duplicates into, and order by, the routed rows (C++, every core)
                summed, _finite = _C.sum_rows(v.view(n, -1), r.inverse, u)
                columns[name] = summed.view((u, *v.shape[1:]))
        if u < n and "shows" not in columns:  # the store's 1 show per occurrence
            columns["shows"] = torch.bincount(r.inverse, minlength=u).to(torch.float32)
        bad = first_bad_value(columns) if check else None
        if bad is not None:
            refuse_push(bad, table, "after summing duplicate keys")
        return r, {"keys": r.keys, **columns}

    def resident_device(self) -> None:
        """The rows live in the shards' processes: pulled into host memory (``SparseStore``)."""
        return None

    def size(self, table: str) -> int:
        """Rows of ``table`` over all shards."""
        self._table(table)
        return sum(int(m["size"]) for m in self._link.broadcast("size", {"table": table}))

    def sizes(self, table: str) -> list[int]:
        """Rows of ``table`` per shard."""
        self._table(table)
        return [int(m["size"]) for m in self._link.broadcast("size", {"table": table})]

    def shrink(self) -> dict[str, int]:
        """Shrinks every shard; returns rows deleted per table (summed over shards)."""
        total: dict[str, int] = {}
        for meta in self._link.broadcast("shrink"):
            for name, count in (meta.get("deleted") or {}).items():
                total[name] = total.get(name, 0) + int(count)
        return total

    def advance_day(self) -> None:
        """Advances the day on every shard (unseen-day counters, decay at the next shrink)."""
        self._link.broadcast("advance_day")

    def stats(self) -> dict[str, Any]:
        """{"num_shards", "shards": [stats of each shard], "total": numeric leaves summed}."""
        shards = [m["stats"] for m in self._link.broadcast("stats")]
        return {
            "num_shards": self.num_shards,
            "shards": shards,
            "total": sum_stats(shards) or {},
        }

    def close(self) -> None:
        """Closes the sockets of every thread; the client is unusable afterwards."""
        self._router.clear()
        self._link.close()

    def __enter__(self) -> EmbeddingStoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
