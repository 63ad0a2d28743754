"""Which shard gets which keys, and the caller's rows put back together (pure: no sockets).

A request for ``n`` keys of a table is deduplicated (when :class:`~.dedup.DedupPolicy` says
so), split by shard (``streamrec.keyhash.shard_of``) and, after the shards answer, put back
in the caller's order::

    keys     [7, 3, 7, 9]            (n,) int64, any order, duplicates allowed
    unique   [7, 3, 9]               first occurrence (C++ hash), inverse = [0, 1, 0, 2]
    by shard shard 0: [3, 9]   shard 1: [7]       (stable sort of unique keys by shard)
    replies  shard 0: rows of 3, 9   shard 1: row of 7
    out      rows of [7, 3, 7, 9]    one gather: grouped_rows[rank[inverse]]

Without dedup the keys go as they are (repeats included), and with one shard the reply is
the caller's rows. A shard's part larger than ``max_request_keys`` keys or
:data:`MAX_REQUEST_ROW_BYTES` of rows goes as several requests (:func:`request_cuts`).

:class:`Router` keeps its recent routes (up to :data:`ROUTE_CACHE_KEYS` keys, checked equal
before reuse), so the push of a training step, which sends the keys its pull sent, is not
routed again.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import streamrec.embedding_store._C as _C
import torch
from streamrec.embedding_store.dedup import DedupPolicy, unique_keys
from streamrec.errors import RemoteError
from streamrec.keyhash import shard_of

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


@dataclass
class Route:
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


def split_by_shard(keys: torch.Tensor, num_shards: int) -> tuple[torch.Tensor | None, list[int]]:
    """Stable order of ``keys`` (u,) int64 by shard and the shard boundaries in it.

    Returns:
        order: (u,) int64 with ``keys[order]`` grouped by shard 0, 1, ...; None when
            there is one shard (no reordering needed).
        bounds: N + 1 offsets into the grouped keys.
    """
    u = keys.numel()
    if num_shards == 1:
        return None, [0, u]
    shard = shard_of(keys.numpy(), num_shards)
    # small integers: numpy's stable sort is a radix sort here, O(u)
    small = shard.astype(np.int16 if num_shards < 2**15 else np.int64)
    order = np.argsort(small, kind="stable")
    bounds = np.zeros(num_shards + 1, dtype=np.int64)
    np.cumsum(np.bincount(shard, minlength=num_shards), out=bounds[1:])
    return torch.from_numpy(order), bounds.tolist()


#: One shard's part of a block of rows (``SparseStore.pull_rows``): (shard, counts (T,) int64,
#: its keys, their positions among the caller's keys, or None when they are all of them in
#: order).
ShardPart = tuple[int, np.ndarray, np.ndarray, torch.Tensor | None]


def route_block(keys: torch.Tensor, counts: Sequence[int], num_shards: int) -> list[ShardPart]:
    """A checked block of T tables' keys (n,) int64, table-major, split by shard with no
    per-table work: each shard's keys stay table-major (a stable sort by shard), its
    ``counts`` say how many of each table it got; shards without keys are left out::

        counts [2, 1]  keys [7, 3, 9]  shard of 7, 3, 9: 1, 0, 1
        shard 0: counts [1, 0] keys [3]      positions [1]
        shard 1: counts [1, 1] keys [7, 9]   positions [0, 2]
    """
    counts_arr = np.asarray(counts, dtype=np.int64)
    if keys.numel() == 0:
        return []
    if num_shards == 1:
        return [(0, counts_arr, keys.numpy(), None)]
    tables = len(counts_arr)
    arr = keys.numpy()
    owner = shard_of(arr, num_shards)
    table_of = np.repeat(np.arange(tables), counts_arr)
    per = np.bincount(owner * tables + table_of, minlength=num_shards * tables)
    per = per.reshape(num_shards, tables)
    order = np.argsort(owner, kind="stable")  # table-major within each shard
    bounds = np.concatenate([[0], np.cumsum(per.sum(axis=1))])
    parts: list[ShardPart] = []
    for k in range(num_shards):
        where = order[bounds[k] : bounds[k + 1]]
        if where.size:
            parts.append((k, per[k], arr[where], torch.from_numpy(where)))
    return parts


def _check_block_reply(shard: int, values: np.ndarray, n: int, dim: int) -> None:
    """Raises ``bad_reply`` unless a shard's reply to its part of a block holds (n, dim)
    float32 values."""
    if values.dtype != np.float32 or values.size != n * dim:
        raise RemoteError(
            "bad_reply",
            f"shard {shard} sent {values.size} {values.dtype} values, expected {n} x {dim} float32",
        )


def assemble_block(parts: list[ShardPart], replies: list[Any], n: int, dim: int) -> torch.Tensor:
    """The caller's block of rows (n, dim) float32 from each part's reply values (one per
    part of :func:`route_block`, in order).

    Raises:
        RemoteError: ``bad_reply``, a reply that is not (keys of its part, dim) float32.
    """
    if len(parts) == 1 and parts[0][3] is None:  # one shard, the caller's order
        values = np.asarray(replies[0])
        _check_block_reply(parts[0][0], values, n, dim)
        rows = torch.from_numpy(values if values.flags.writeable else values.copy())
        return rows.view(n, dim)
    out = torch.empty(n, dim)
    for (k, _, keys, where), reply in zip(parts, replies, strict=True):
        assert where is not None  # several shards: each part has its positions
        values = np.asarray(reply)
        _check_block_reply(k, values, keys.size, dim)
        out.index_copy_(0, where, torch.from_numpy(values).view(keys.size, dim))
    return out


def split_many_replies(
    replies: list[tuple[int, np.ndarray, Any]], dims: list[int]
) -> list[list[tuple[int, int, np.ndarray]]]:
    """Each table's reply parts (shard, rows, values), for :func:`assemble`, from the
    ``pull_many`` replies (shard, counts (T,), values: the tables' rows flattened, in order).

    Raises:
        RemoteError: ``bad_reply``, a reply of the wrong number of values.
    """
    parts: list[list[tuple[int, int, np.ndarray]]] = [[] for _ in dims]
    for k, counts, reply in replies:
        values = np.asarray(reply).reshape(-1)
        cuts = np.cumsum(counts * np.asarray(dims, dtype=np.int64))
        if values.size != (cuts[-1] if cuts.size else 0):
            raise RemoteError(
                "bad_reply", f"shard {k} sent {values.size} values, expected {int(cuts[-1])}"
            )
        for t, v in enumerate(np.split(values, cuts[:-1])):
            parts[t].append((k, int(counts[t]), v))
    return parts


def many_parts(
    routes: list[Route], columns: list[dict[str, torch.Tensor]]
) -> list[tuple[int, dict[str, np.ndarray]]]:
    """Every table's part for each shard as one set of arrays (``pull_many``/``push_many``
    ops): ``counts`` (T,) and each column's parts concatenated, flattened (the tables may
    differ in dim); shards without keys are left out."""
    out = []
    for k in range(len(routes[0].bounds) - 1 if routes else 0):
        counts = np.array([r.bounds[k + 1] - r.bounds[k] for r in routes], dtype=np.int64)
        if not counts.any():
            continue
        arrays = {"counts": counts}
        for name in columns[0]:
            flat = [
                cols[name][r.bounds[k] : r.bounds[k + 1]].reshape(-1)
                for r, cols in zip(routes, columns, strict=True)
            ]
            arrays[name] = torch.cat(flat).numpy()
        out.append((k, arrays))
    return out


def request_cuts(bounds: list[int], dim: int, max_keys: int) -> list[tuple[int, int, int]]:
    """(shard, start, end) of each request: every shard's rows (``bounds``: N + 1 offsets)
    in parts of at most ``max_keys`` keys and :data:`MAX_REQUEST_ROW_BYTES` of ``dim``
    floats, in order."""
    step = min(max_keys, max(1, MAX_REQUEST_ROW_BYTES // (4 * dim)))
    return [
        (k, a, min(a + step, bounds[k + 1]))
        for k in range(len(bounds) - 1)
        for a in range(bounds[k], bounds[k + 1], step)
    ]


def cut_arrays(
    grouped: dict[str, np.ndarray], cuts: list[tuple[int, int, int]]
) -> list[tuple[int, dict[str, np.ndarray]]]:
    """(shard, arrays) of each request of :func:`request_cuts`: every array's rows
    [start, end)."""
    return [(k, {name: arr[a:b] for name, arr in grouped.items()}) for k, a, b in cuts]


class Router:
    """Routes tables' keys to ``num_shards`` shards, reusing recent routes (thread-safe).

    Args:
        num_shards: N.
        dedup: when a table's keys are deduplicated first.
    """

    def __init__(self, num_shards: int, dedup: DedupPolicy) -> None:
        self.num_shards = num_shards
        self.dedup = dedup
        # fingerprint -> (caller's keys copied, route) of recent routes, oldest first
        self._routes: dict[tuple[int, ...], tuple[torch.Tensor, Route]] = {}
        self._routes_keys = 0
        self._lock = threading.Lock()

    def route(self, table: str, keys: torch.Tensor) -> Route:
        """``keys`` (n,) int64 of ``table`` grouped by shard, deduplicated as the policy
        says; a recent route of equal keys is reused (found by a fingerprint, then checked
        equal)."""
        n = keys.numel()
        tag = (n, int(keys[0]), int(keys[n // 2]), int(keys[-1])) if n else (0,)
        with self._lock:
            seen = self._routes.get(tag)
        if seen is not None and seen[0].shape == keys.shape and torch.equal(seen[0], keys):
            return seen[1]
        # routes made, not reused, count towards the policy's next measure
        inverse: torch.Tensor | None = None  # None: the keys as they are, repeats and all
        if self.dedup.decide(table):
            unique, inverse = unique_keys(keys)
            self.dedup.measured(table, n, unique.numel())
        else:
            unique = keys
        order, bounds = split_by_shard(unique, self.num_shards)
        if order is None:
            if inverse is None:  # a copy: the route may be reused after the caller refills it
                unique, inverse = keys.clone(), torch.arange(n)
            route = Route(unique, inverse, bounds, unique.numel() == n)
        else:
            rank = torch.empty_like(order)  # where each unique key sits among the grouped keys
            rank[order] = torch.arange(order.numel())
            route = Route(
                unique.index_select(0, order),
                rank if inverse is None else rank.index_select(0, inverse),
                bounds,
                False,
            )
        if n <= ROUTE_CACHE_KEYS // 2:
            self._remember(tag, keys, route)
        return route

    def _remember(self, tag: tuple[int, ...], keys: torch.Tensor, route: Route) -> None:
        with self._lock:  # a copy: the caller may refill its tensor
            old = self._routes.pop(tag, None)
            if old is not None:
                self._routes_keys -= old[0].numel()
            self._routes[tag] = (keys.clone(), route)
            self._routes_keys += keys.numel()
            while self._routes_keys > ROUTE_CACHE_KEYS or len(self._routes) > ROUTE_CACHE_SIZE:
                oldest = next(iter(self._routes))
                self._routes_keys -= self._routes.pop(oldest)[0].numel()

    def clear(self) -> None:
        """Forgets every recent route."""
        with self._lock:
            self._routes.clear()
            self._routes_keys = 0


def assemble(
    table: str, dim: int, route: Route, parts: list[tuple[int, int, np.ndarray]]
) -> torch.Tensor:
    """The caller's rows (n, dim) float32 from the reply parts (shard, rows, values), which
    hold the routed rows in order.

    Raises:
        RemoteError: ``bad_reply``, a part that is not (rows, dim) float32.
    """
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
        return torch.zeros((route.inverse.numel(), dim), dtype=torch.float32)
    if route.identity and len(rows) == 1 and np.asarray(parts[0][2]).flags.writeable:
        return rows[0]  # the reply's rows are the caller's, in order: no copy
    return _C.take_rows(rows, route.inverse)
