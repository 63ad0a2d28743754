"""The request handlers of one embedding-store shard: the ops of the wire protocol.

A shard owns the keys ``k`` with ``keyhash.shard_of(k, N) == K`` of every table and runs an
in-process :class:`~streamrec.embedding_store.EmbeddingStore` for them. Ops (request meta and
arrays -> reply meta and arrays)::

    ping         {}                                  -> {shard_id, num_shards, tables: [name]}
    create_tables {namespace, tables: [TableOptions as dicts]}      -> {created: [name]}
    drop_tables  {namespace}                         -> {dropped: {table: rows} | None}
    tables       {}                                  -> {tables: [TableOptions as dicts]}
    pull         {table, create} keys (n,) int64     -> values (n, dim) float32
    push         {table} keys (n,) int64, grads (n, dim) float32,
                 [shows (n,) float32, clicks (n,) float32]          -> {}
    pull_many    {tables: [T names], create} keys (n,) int64, counts (T,) int64
                                                     -> values (sum n_t * dim_t,) float32
    push_many    {tables: [T names]} keys (n,) int64, counts (T,) int64,
                 grads (sum n_t * dim_t,) float32, [shows (n,) float32, clicks (n,) float32]
                                                     -> {}
    size         {table}                             -> {size}
    shrink       {}                                  -> {deleted: {table: rows}}
    advance_day  {}                                  -> {}
    save         {path, mode, [converter]}           -> {dir, manifest}
    load         {path, [converter, verify_only]}    -> {dir}
    stats        {}                                  -> {shard_id, num_shards, stats}

Namespaces (:mod:`~streamrec.embedding_store.service.namespaces`): every op but ``ping``,
``create_tables`` and ``drop_tables`` takes an optional ``namespace`` in its meta (absent or
``""``: the default one, the ``--tables``) and acts on that namespace's tables only (``shrink``,
``advance_day``, ``save`` and ``load`` included; a save writes only its tables, still under
``path/shard-K-of-N/``). A namespace the shard does not hold is refused at once
(``unknown_namespace``), before the incarnation check. ``create_tables`` is idempotent, a
table held with other options is refused (``table_conflict``); ``drop_tables`` frees the
namespace's rows (``dropped`` None: it held none). ``stats`` adds ``namespaces``: namespace
-> {tables: {table: rows}, rows}.

Every successful reply's meta also carries ``incarnation``, the id this shard process drew
at start; a data op (pull, push, their ``_many`` forms, shrink, advance_day, save) sent
with ``expect_incarnation`` set to another id is refused (``shard_restarted``) before it
touches the store: the shard restarted empty
(:mod:`~streamrec.embedding_store.service.incarnation`).

A namespaced request may carry ``generation``, its trainer group's assignment (only grows):
one older than the newest its namespace has seen on this shard is refused
(``stale_generation``) before it touches the store, a group that lost its job to another
(:mod:`~streamrec.embedding_store.service.generations`).

``pull_many``/``push_many`` carry several tables in one request (the trainer's one request
per shard and batch): table t owns ``counts[t]`` keys of the concatenated ``keys`` (and of
``shows``/``clicks``) and ``counts[t] * dim_t`` values of the flattened ``grads``/``values``::

    tables  ["user", "item"]      dims 9, 4
    counts  [2, 1]                keys [u0, u1, i0]
    grads   [9 of u0, 9 of u1, 4 of i0]          (22,) float32

A ``push_many`` is validated whole (every table's part, NaN/Inf included) before any table is
written.

``save``/``load`` (:mod:`~streamrec.embedding_store.service.saves`) use
``path/shard-K-of-N/`` (each shard its own manifest); a save of M other shards (or one store's
``path/MANIFEST.json``: M = 1) is resharded: each takes the keys that route to it from every
part (:mod:`~streamrec.embedding_store.persistence.reshard`, reply ``resharded`` "M -> N").
``path`` must be absolute and lie under one of the shard's ``--model-root`` directories (``..``
and symlinks resolved first, see :mod:`streamrec.roots`); a shard without one saves and loads
nothing. ``converter: "redis"`` sends base/delta rows to the serving Redis given by
``--redis-url`` (each shard its own partition, see
:mod:`~streamrec.embedding_store.persistence.redis_converter`) instead of files.

Every request is validated (table, dtypes, shapes, shard ownership) before it touches the
store, so a bad one gets an error naming the field and value, and nothing already stored
changes. NaN/Inf gradients are refused (by the store, before any row is written).

The handlers run on the worker threads of :class:`~streamrec.wire.RpcServer` (wired in
:mod:`~streamrec.embedding_store.service.server`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from streamrec.embedding_store.disk import NoSpaceBackoff, with_disk_errors
from streamrec.embedding_store.errors import (
    InvalidInput,
    NonFiniteGradient,
    UnknownTable,
    WrongShard,
)
from streamrec.embedding_store.service.generations import GenerationFence
from streamrec.embedding_store.service.incarnation import (
    REPLY_FIELD,
    check_request,
    new_incarnation,
)
from streamrec.embedding_store.service.metrics import StoreMetrics, memory_limit_bytes
from streamrec.embedding_store.service.namespaces import (
    Namespaces,
    check_namespace,
    parse_tables,
)
from streamrec.embedding_store.service.saves import ShardSaves
from streamrec.errors import BadRequest, quote
from streamrec.keyhash import shard_of
from streamrec.store_schema import TableOptions
from streamrec.wire import Arrays, Handler, Meta

if TYPE_CHECKING:
    from streamrec.embedding_store.store import EmbeddingStore, TableHook

OPS = (
    "ping",
    "create_tables",
    "drop_tables",
    "tables",
    "pull",
    "push",
    "pull_many",
    "push_many",
    "size",
    "shrink",
    "advance_day",
    "save",
    "load",
    "stats",
)
#: Ops that act on one namespace's store (named by the request's ``namespace`` field).
NAMESPACED_OPS = frozenset(OPS) - {"ping", "create_tables", "drop_tables"}
#: A namespaced op's handler: (namespace, its store, meta, arrays) -> reply.
NamespacedHandler = Callable[[str, "EmbeddingStore", Meta, Arrays], tuple[Meta, Arrays]]


def _jsonable(value: Any) -> Any:
    """Plain msgpack-able copy of a dict from the store (numpy scalars, paths -> str)."""
    return json.loads(
        json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o))
    )


def _split(arr: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """``arr`` cut into consecutive parts of ``sizes`` (T,) elements (views; [] when T = 0)."""
    ends = np.cumsum(sizes).tolist()
    return [arr[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)] if ends else []


class StoreService:
    """The request handlers of one shard, over an in-process store.

    Args:
        store: an ``EmbeddingStore`` (thread-safe; handlers run on several worker threads).
        shard_id: K, this shard's index.
        num_shards: N, the number of shards.
        metrics: where to count requests; None counts nothing.
        saves: the save and load ops; None: this shard's with no Redis and no model roots
            (saves to Redis and every ``save``/``load`` path refused).
        incarnation: this shard process's id, sent in every reply; None draws a new one.
        namespaces: the shard's namespaces, ``store`` their default one; None: only the
            default one (``create_tables`` then adds tables to it only).
    """

    def __init__(
        self,
        store: EmbeddingStore,
        shard_id: int,
        num_shards: int,
        metrics: StoreMetrics | None = None,
        saves: ShardSaves | None = None,
        incarnation: int | None = None,
        namespaces: Namespaces | None = None,
    ) -> None:
        if not 0 <= shard_id < num_shards:
            raise ValueError(f"shard_id must be in [0, {num_shards}), got {shard_id}")
        self.store = store
        self.namespaces = (
            namespaces if namespaces is not None else Namespaces(store, _no_namespaces)
        )
        self._memory_limit: int | None = None
        self.shard_id = shard_id
        self.num_shards = num_shards
        self.metrics = metrics
        #: the save and load ops (saves.py)
        self.saves = saves if saves is not None else ShardSaves(shard_id, num_shards, metrics)
        self.incarnation = new_incarnation() if incarnation is None else incarnation
        #: the newest trainer-group generation per namespace (generations.py)
        self.fence = GenerationFence()

    def handlers(self) -> dict[str, Handler]:
        """Op name -> handler: the op checked against this incarnation, its reply stamped."""
        backoff = NoSpaceBackoff()  # saves after a full disk wait (disk.py)
        return {op: with_disk_errors(op, self._stamped(op), backoff) for op in OPS}

    def _stamped(self, op: str) -> Handler:
        if op not in NAMESPACED_OPS:
            plain: Handler = getattr(self, f"op_{op}")

            def handle(meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
                check_request(op, meta, self.incarnation)
                out, out_arrays = plain(meta, arrays)
                return {**out, REPLY_FIELD: self.incarnation}, out_arrays

            return handle
        handler: NamespacedHandler = getattr(self, f"op_{op}")
        of = self.namespaces.of

        def handle_in(meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
            # the namespace first: a shard restarted empty holds none of the job's
            namespace, store = of(meta)
            check_request(op, meta, self.incarnation)
            with self.fence.admit(op, namespace, meta):
                out, out_arrays = handler(namespace, store, meta, arrays)
            return {**out, REPLY_FIELD: self.incarnation}, out_arrays

        return handle_in

    def on_request(self, op: str, seconds: float, code: str | None) -> None:
        if self.metrics is not None:
            # the op label comes from the peer: only known names, so cardinality stays bounded
            self.metrics.on_request(op if op in OPS else "unknown", seconds, code)

    # -- validation -----------------------------------------------------------------

    @staticmethod
    def _table(store: EmbeddingStore, meta: Meta) -> tuple[str, int]:
        name = meta.get("table")
        if not isinstance(name, str):
            raise BadRequest(f"field 'table' must be a table name (string), got {quote(name)}")
        tables = store.tables
        if name not in tables:
            raise UnknownTable(f"unknown table {quote(name)}; tables: {sorted(tables)}")
        return name, tables[name].checked_dim()

    @staticmethod
    def _array(
        arrays: Arrays, name: str, dtype: type, shape: tuple[int | None, ...], required: bool = True
    ) -> np.ndarray | None:
        arr = arrays.get(name)
        if arr is None:
            if required:
                raise InvalidInput(f"array {name!r} is missing; arrays sent: {sorted(arrays)}")
            return None
        if arr.dtype != np.dtype(dtype):
            raise InvalidInput(f"array {name!r}: dtype must be {np.dtype(dtype)}, got {arr.dtype}")
        if arr.ndim != len(shape) or any(
            s is not None and s != a for s, a in zip(shape, arr.shape, strict=True)
        ):
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            raise InvalidInput(f"array {name!r}: shape must be {want}, got {tuple(arr.shape)}")
        return arr

    def _keys(self, arrays: Arrays) -> np.ndarray:
        keys = self._array(arrays, "keys", np.int64, (None,))
        assert keys is not None
        if self.num_shards > 1 and keys.size:
            owner = shard_of(keys, self.num_shards)
            wrong = np.flatnonzero(owner != self.shard_id)
            if wrong.size:
                i = int(wrong[0])
                raise WrongShard(
                    f"{wrong.size} of {keys.size} keys belong to other shards (e.g. key "
                    f"{int(keys[i])} -> shard {int(owner[i])}); this is shard "
                    f"{self.shard_id} of {self.num_shards}: route keys with "
                    f"streamrec.keyhash.shard_of"
                )
        # frames are read-only buffers; the store gets its own copy of the (small) keys
        return np.array(keys)

    @staticmethod
    def _tables(store: EmbeddingStore, meta: Meta) -> tuple[list[str], np.ndarray]:
        """The ``tables`` field of a multi-table op: names and dims (T,) int64."""
        names = meta.get("tables")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise BadRequest(f"field 'tables' must be a list of table names, got {names!r:.200}")
        tables = store.tables
        for i, name in enumerate(names):
            if name not in tables:
                raise UnknownTable(
                    f"field 'tables'[{i}]: unknown table {quote(name)}; tables: {sorted(tables)}"
                )
        return names, np.array([tables[n].dim for n in names], dtype=np.int64)

    def _counts(self, arrays: Arrays, names: list[str], n: int) -> np.ndarray:
        """The ``counts`` array: (T,) int64, >= 0, summing to the n keys sent."""
        counts = self._array(arrays, "counts", np.int64, (len(names),))
        assert counts is not None
        negative = np.flatnonzero(counts < 0)
        if negative.size:
            i = int(negative[0])
            raise InvalidInput(
                f"array 'counts': must be >= 0, got {int(counts[i])} for table {names[i]!r} "
                f"(index {i})"
            )
        big = np.flatnonzero(counts > n)
        if big.size:
            i = int(big[0])
            raise InvalidInput(
                f"array 'counts': {int(counts[i])} for table {names[i]!r} (index {i}) exceeds "
                f"the {n} keys sent"
            )
        total = int(counts.sum())  # each count <= n here: the sum cannot overflow
        if total != n:
            raise InvalidInput(f"array 'counts': sums to {total}, but array 'keys' holds {n} keys")
        return counts

    @staticmethod
    def _create(meta: Meta) -> bool:
        create = meta.get("create", True)
        if not isinstance(create, bool):
            raise BadRequest(f"field 'create' must be a bool, got {quote(create)}")
        return create

    @staticmethod
    def _check_finite(**arrays: np.ndarray | None) -> None:
        for name, arr in arrays.items():
            if arr is not None and not np.isfinite(arr).all():
                raise NonFiniteGradient(f"array {name!r}: holds NaN or Inf; nothing was written")

    def _shows_clicks(self, arrays: Arrays, n: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        """A push's optional ``shows`` and ``clicks``, (n,) float32 each, checked finite."""
        shows = self._array(arrays, "shows", np.float32, (n,), required=False)
        clicks = self._array(arrays, "clicks", np.float32, (n,), required=False)
        self._check_finite(shows=shows, clicks=clicks)
        return shows, clicks

    @contextlib.contextmanager
    def _timed(self, kind: str, namespace: str, table: str, n: int) -> Iterator[None]:
        """Records the block, when it returns, as ``table``'s part of ``n`` keys of a pull or
        push (:meth:`_on_table`)."""
        started = time.perf_counter()
        yield
        record = self._on_table(kind, namespace)
        if record is not None:
            record(table, n, time.perf_counter() - started)

    def _on_table(self, kind: str, namespace: str) -> TableHook | None:
        """Records a table's part of a pull or push (``kind``) in the per-table metrics of
        ``namespace``: (table, keys, seconds); also the store's hook of pull_many/push_many."""
        m = self.metrics
        if m is None:
            return None

        def record(table: str, n: int, seconds: float) -> None:
            if n == 0:  # a table with no keys on this shard did nothing here
                return
            seconds_of, keys_of, steps_of = m.table_series(kind, namespace, table)
            seconds_of.observe(seconds)
            keys_of.inc(n)
            if steps_of is not None:
                steps_of.inc()

        return record

    # -- ops ------------------------------------------------------------------------

    def op_ping(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        return {
            "shard_id": self.shard_id,
            "num_shards": self.num_shards,
            "tables": sorted(self.store.tables),
            "pid": os.getpid(),
        }, {}

    def op_create_tables(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        namespace = check_namespace(meta.get("namespace"))
        tables = parse_tables(meta.get("tables"))
        self._check_memory(tables)
        return {"created": self.namespaces.create(namespace, tables)}, {}

    def _check_memory(self, tables: list[TableOptions]) -> None:
        """Refuses tables whose ``init_capacity`` rows alone would not fit this shard's
        memory (a peer's huge count must not take the shard down)."""
        if self._memory_limit is None:
            self._memory_limit = memory_limit_bytes()
        need = 0
        for i, t in enumerate(tables):
            need += t.init_capacity * (4 + 2 * t.checked_dim() + 4) * 4  # stats, w, state
            if need > self._memory_limit:
                raise BadRequest(
                    f"field 'tables'[{i}].init_capacity: {t.init_capacity} rows (of dim "
                    f"{t.dim}) would not fit this shard's {self._memory_limit} bytes of memory"
                )

    def op_drop_tables(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        namespace = check_namespace(meta.get("namespace"))
        dropped = self.namespaces.drop(namespace)
        self.fence.forget(namespace)
        if self.metrics is not None:
            self.metrics.forget_namespace(namespace)
        return {"dropped": dropped}, {}

    def op_tables(
        self, ns: str, store: EmbeddingStore, meta: Meta, arrays: Arrays
    ) -> tuple[Meta, Arrays]:
        return {"tables": [t.model_dump(mode="json") for t in store.tables.values()]}, {}

    def op_pull(
        self, ns: str, store: EmbeddingStore, meta: Meta, arrays: Arrays
    ) -> tuple[Meta, Arrays]:
        table, _dim = self._table(store, meta)
        create = self._create(meta)
        keys = self._keys(arrays)
        with self._timed("pull", ns, table, keys.size):
            values = store.pull(table, keys, create=create)
        return {}, {"values": values.numpy()}

    def op_push(
        self, ns: str, store: EmbeddingStore, meta: Meta, arrays: Arrays
    ) -> tuple[Meta, Arrays]:
        table, dim = self._table(store, meta)
        keys = self._keys(arrays)
        n = keys.size
        grads = self._array(arrays, "grads", np.float32, (n, dim))
        shows, clicks = self._shows_clicks(arrays, n)
        with self._timed("push", ns, table, n):
            store.push(table, keys, grads, shows=shows, clicks=clicks)
        return {}, {}

    def op_pull_many(
        self, ns: str, store: EmbeddingStore, meta: Meta, arrays: Arrays
    ) -> tuple[Meta, Arrays]:
        names, _dims = self._tables(store, meta)
        create = self._create(meta)
        keys = self._keys(arrays)
        counts = self._counts(arrays, names, keys.size)
        parts = _split(keys, counts)
        values = store.pull_many(names, parts, create=create, on_table=self._on_table("pull", ns))
        flat = [v.reshape(-1).numpy() for v in values]
        return {}, {"values": np.concatenate(flat) if flat else np.zeros(0, np.float32)}

    def op_push_many(
        self, ns: str, store: EmbeddingStore, meta: Meta, arrays: Arrays
    ) -> tuple[Meta, Arrays]:
        names, dims = self._tables(store, meta)
        keys = self._keys(arrays)
        n = keys.size
        counts = self._counts(arrays, names, n)
        sizes = counts * dims
        grads = self._array(arrays, "grads", np.float32, (int(sizes.sum()),))
        shows, clicks = self._shows_clicks(arrays, n)
        assert grads is not None
        grad_parts = [
            g.reshape(c, d) for g, c, d in zip(_split(grads, sizes), counts, dims, strict=True)
        ]
        store.push_many(
            names,
            _split(keys, counts),
            grad_parts,
            shows=None if shows is None else _split(shows, counts),
            clicks=None if clicks is None else _split(clicks, counts),
            on_table=self._on_table("push", ns),
        )
        return {}, {}

    def op_size(
        self, ns: str, store: EmbeddingStore, meta: Meta, arrays: Arrays
    ) -> tuple[Meta, Arrays]:
        table, _dim = self._table(store, meta)
        return {"size": int(store.size(table))}, {}

    def op_shrink(
        self, ns: str, store: EmbeddingStore, meta: Meta, arrays: Arrays
    ) -> tuple[Meta, Arrays]:
        return {"deleted": _jsonable(store.shrink() or {})}, {}

    def op_advance_day(
        self, ns: str, store: EmbeddingStore, meta: Meta, arrays: Arrays
    ) -> tuple[Meta, Arrays]:
        store.advance_day()
        return {}, {}

    def op_save(
        self, ns: str, store: EmbeddingStore, meta: Meta, arrays: Arrays
    ) -> tuple[Meta, Arrays]:
        target, manifest = self.saves.save(ns, store, meta)
        return {"dir": str(target), "manifest": _jsonable(manifest or {})}, {}

    def op_load(
        self, ns: str, store: EmbeddingStore, meta: Meta, arrays: Arrays
    ) -> tuple[Meta, Arrays]:
        return self.saves.load(store, meta)

    def op_stats(
        self, ns: str, store: EmbeddingStore, meta: Meta, arrays: Arrays
    ) -> tuple[Meta, Arrays]:
        stats = {**store.stats(), "namespaces": self.namespaces.summary()}
        return {
            "shard_id": self.shard_id,
            "num_shards": self.num_shards,
            "stats": _jsonable(stats),
        }, {}


def _no_namespaces(namespace: str, tables: list[TableOptions]) -> Any:
    """The store factory of a service given no namespaces: it makes none."""
    raise BadRequest(
        f"field 'namespace': this shard serves only its default namespace, got {namespace!r}"
    )
