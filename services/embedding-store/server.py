"""One embedding-store shard served over ZeroMQ (:mod:`streamrec.wire`).

A shard owns the keys ``k`` with ``keyhash.shard_of(k, N) == K`` of every table and runs an
in-process :class:`~streamrec.embedding_store.EmbeddingStore` for them. Ops (request meta and
arrays -> reply meta and arrays)::

    ping         {}                                  -> {shard_id, num_shards, tables: [name]}
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

``pull_many``/``push_many`` carry several tables in one request (the trainer's one request
per shard and batch): table t owns ``counts[t]`` keys of the concatenated ``keys`` (and of
``shows``/``clicks``) and ``counts[t] * dim_t`` values of the flattened ``grads``/``values``::

    tables  ["user", "item"]      dims 9, 4
    counts  [2, 1]                keys [u0, u1, i0]
    grads   [9 of u0, 9 of u1, 4 of i0]          (22,) float32

A ``push_many`` is validated whole (every table's part, NaN/Inf included) before any table is
written.

``save``/``load`` use ``path/shard-K-of-N/`` (each shard its own manifest); ``load`` refuses a
checkpoint saved by another number of shards. ``converter: "redis"`` sends base/delta rows to
the serving Redis given by ``--redis-url`` (each shard its own partition, see
:mod:`~streamrec.embedding_store.redis_converter`) instead of files.

Every request is validated (table, dtypes, shapes, shard ownership) before it touches the
store, so a bad one gets an error naming the field and value, and nothing already stored
changes. NaN/Inf gradients are refused (by the store, before any row is written).

:class:`LocalShards` starts N shard processes on this machine (tests, benchmark, demo).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from streamrec.embedding_store.checkpoint import MANIFEST, read_manifest
from streamrec.embedding_store.config import ShardConfig, shard_dir_name
from streamrec.embedding_store.errors import (
    InvalidInput,
    NonFiniteGradient,
    ShardCountMismatch,
    UnknownTable,
    WrongShard,
)
from streamrec.embedding_store.metrics import StoreMetrics
from streamrec.errors import BadRequest, NotFound
from streamrec.keyhash import shard_of
from streamrec.wire import Arrays, Meta, RpcClient, RpcServer

# A push's arrays reach the store as zero-copy views of the received frames, which are
# read-only; the store never writes a push's inputs (see EmbeddingStore.push), so torch's
# warning about wrapping a read-only array is noise here (a copy of 25 MB per push is not).
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

if TYPE_CHECKING:
    from streamrec.embedding_store.store import TableHook

log = logging.getLogger(__name__)

OPS = (
    "ping",
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
SAVE_MODES = ("checkpoint", "base", "delta", "batch")
_SHARD_DIR = re.compile(r"^shard-(\d+)-of-(\d+)$")


def _jsonable(value: Any) -> Any:
    """Plain msgpack-able copy of a dict from the store (numpy scalars, paths -> str)."""
    return json.loads(
        json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o))
    )


def _split(arr: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """``arr`` cut into consecutive parts of ``sizes`` (T,) elements (views; [] when T = 0)."""
    return np.split(arr, np.cumsum(sizes)[:-1]) if sizes.size else []


class StoreService:
    """The request handlers of one shard, over an in-process store.

    Args:
        store: an ``EmbeddingStore`` (thread-safe; handlers run on several worker threads).
        shard_id: K, this shard's index.
        num_shards: N, the number of shards.
        metrics: where to count requests; None counts nothing.
        redis_url: the serving Redis for saves with ``converter: "redis"`` (None: refused).
        redis_prefix: prefix of this store's keys in that Redis.
    """

    def __init__(
        self,
        store: Any,
        shard_id: int,
        num_shards: int,
        metrics: StoreMetrics | None = None,
        redis_url: str | None = None,
        redis_prefix: str = "streamrec:emb",
    ) -> None:
        if not 0 <= shard_id < num_shards:
            raise ValueError(f"shard_id must be in [0, {num_shards}), got {shard_id}")
        self.store = store
        self.shard_id = shard_id
        self.num_shards = num_shards
        self.metrics = metrics
        self.dir_name = shard_dir_name(shard_id, num_shards)
        self.redis_url = redis_url
        self.redis_prefix = redis_prefix
        self._redis: Any = None
        self._redis_lock = threading.Lock()

    def handlers(self) -> dict[str, Any]:
        return {op: getattr(self, f"op_{op}") for op in OPS}

    def on_request(self, op: str, seconds: float, code: str | None) -> None:
        if self.metrics is not None:
            # the op label comes from the peer: only known names, so cardinality stays bounded
            self.metrics.on_request(op if op in OPS else "unknown", seconds, code)

    # -- validation -----------------------------------------------------------------

    def _table(self, meta: Meta) -> tuple[str, int]:
        name = meta.get("table")
        if not isinstance(name, str):
            raise BadRequest(f"field 'table' must be a table name (string), got {name!r}")
        tables = self.store.tables
        if name not in tables:
            raise UnknownTable(f"unknown table {name!r}; tables: {sorted(tables)}")
        return name, int(tables[name].dim)

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

    def _tables(self, meta: Meta) -> tuple[list[str], np.ndarray]:
        """The ``tables`` field of a multi-table op: names and dims (T,) int64."""
        names = meta.get("tables")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise BadRequest(f"field 'tables' must be a list of table names, got {names!r:.200}")
        tables = self.store.tables
        for i, name in enumerate(names):
            if name not in tables:
                raise UnknownTable(
                    f"field 'tables'[{i}]: unknown table {name!r}; tables: {sorted(tables)}"
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
            raise BadRequest(f"field 'create' must be a bool, got {create!r}")
        return create

    @staticmethod
    def _check_finite(**arrays: np.ndarray | None) -> None:
        for name, arr in arrays.items():
            if arr is not None and not np.isfinite(arr).all():
                raise NonFiniteGradient(f"array {name!r}: holds NaN or Inf; nothing was written")

    def _on_table(self, kind: str) -> TableHook | None:
        """Records a table's part of a pull or push (``kind``) in the per-table metrics:
        (table, keys, seconds); also the store's hook of pull_many/push_many."""
        m = self.metrics
        if m is None:
            return None

        def record(table: str, n: int, seconds: float) -> None:
            if n == 0:  # a table with no keys on this shard did nothing here
                return
            if kind == "pull":
                m.pull_seconds.labels(table).observe(seconds)
                m.pull_keys.labels(table).inc(n)
            else:
                m.push_seconds.labels(table).observe(seconds)
                m.push_keys.labels(table).inc(n)
                m.optimizer_steps.labels(table).inc()

        return record

    # -- ops ------------------------------------------------------------------------

    def op_ping(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        return {
            "shard_id": self.shard_id,
            "num_shards": self.num_shards,
            "tables": sorted(self.store.tables),
            "pid": os.getpid(),
        }, {}

    def op_tables(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        return {"tables": [t.model_dump(mode="json") for t in self.store.tables.values()]}, {}

    def op_pull(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        table, _dim = self._table(meta)
        create = self._create(meta)
        keys = self._keys(arrays)
        started = time.perf_counter()
        values = self.store.pull(table, keys, create=create)
        record = self._on_table("pull")
        if record is not None:
            record(table, keys.size, time.perf_counter() - started)
        return {}, {"values": values.numpy() if hasattr(values, "numpy") else values}

    def op_push(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        table, dim = self._table(meta)
        keys = self._keys(arrays)
        n = keys.size
        grads = self._array(arrays, "grads", np.float32, (n, dim))
        shows = self._array(arrays, "shows", np.float32, (n,), required=False)
        clicks = self._array(arrays, "clicks", np.float32, (n,), required=False)
        self._check_finite(shows=shows, clicks=clicks)
        started = time.perf_counter()
        self.store.push(table, keys, grads, shows=shows, clicks=clicks)
        record = self._on_table("push")
        if record is not None:
            record(table, n, time.perf_counter() - started)
        return {}, {}

    def op_pull_many(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        names, _dims = self._tables(meta)
        create = self._create(meta)
        keys = self._keys(arrays)
        counts = self._counts(arrays, names, keys.size)
        parts = _split(keys, counts)
        values = self.store.pull_many(names, parts, create=create, on_table=self._on_table("pull"))
        flat = [v.reshape(-1).numpy() for v in values]
        return {}, {"values": np.concatenate(flat) if flat else np.zeros(0, np.float32)}

    def op_push_many(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        names, dims = self._tables(meta)
        keys = self._keys(arrays)
        n = keys.size
        counts = self._counts(arrays, names, n)
        sizes = counts * dims
        grads = self._array(arrays, "grads", np.float32, (int(sizes.sum()),))
        shows = self._array(arrays, "shows", np.float32, (n,), required=False)
        clicks = self._array(arrays, "clicks", np.float32, (n,), required=False)
        self._check_finite(shows=shows, clicks=clicks)
        assert grads is not None
        grad_parts = [
            g.reshape(c, d) for g, c, d in zip(_split(grads, sizes), counts, dims, strict=True)
        ]
        self.store.push_many(
            names,
            _split(keys, counts),
            grad_parts,
            shows=None if shows is None else _split(shows, counts),
            clicks=None if clicks is None else _split(clicks, counts),
            on_table=self._on_table("push"),
        )
        return {}, {}

    def op_size(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        table, _dim = self._table(meta)
        return {"size": int(self.store.size(table))}, {}

    def op_shrink(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        return {"deleted": _jsonable(self.store.shrink() or {})}, {}

    def op_advance_day(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        self.store.advance_day()
        return {}, {}

    def _root(self, meta: Meta) -> Path:
        path = meta.get("path")
        if not isinstance(path, str) or not path:
            raise BadRequest(f"field 'path' must be a non-empty string, got {path!r}")
        return Path(path)

    def _converter(self, meta: Meta) -> Any:
        """None (the store's files) or this shard's RedisConverter (``converter: redis``)."""
        name = meta.get("converter")
        if name in (None, "files"):
            return None
        if name != "redis":
            raise BadRequest(f"field 'converter' must be 'files' or 'redis', got {name!r}")
        if self.redis_url is None:
            raise BadRequest("field 'converter': 'redis' needs the shard started with --redis-url")
        with self._redis_lock:
            if self._redis is None:
                from streamrec.embedding_store.redis_converter import RedisConverter

                self._redis = RedisConverter(
                    self.redis_url, self.redis_prefix, self.shard_id, self.num_shards
                )
            return self._redis

    def op_save(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        mode = meta.get("mode", "checkpoint")
        if mode not in SAVE_MODES:
            raise BadRequest(f"field 'mode' must be one of {list(SAVE_MODES)}, got {mode!r}")
        target = self._root(meta) / self.dir_name
        converter = self._converter(meta)
        started = time.perf_counter()
        manifest = self.store.save(
            str(target),
            mode,
            converter=converter,
            extra={"shard_id": self.shard_id, "num_shards": self.num_shards},
        )
        if self.metrics is not None:
            self.metrics.save_seconds.labels(mode).observe(time.perf_counter() - started)
        return {"dir": str(target), "manifest": _jsonable(manifest or {})}, {}

    def op_load(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        root = self._root(meta)
        target = root / self.dir_name
        if not target.is_dir():
            found = (
                sorted(p.name for p in root.iterdir() if _SHARD_DIR.match(p.name))
                if (root.is_dir())
                else []
            )
            counts = sorted({int(_SHARD_DIR.match(n).group(2)) for n in found})  # type: ignore[union-attr]
            if counts and self.num_shards not in counts:
                raise ShardCountMismatch(
                    f"checkpoint {str(root)!r} was saved by {counts[0]} shard(s) "
                    f"({', '.join(found)}); this store runs {self.num_shards} shards"
                )
            raise NotFound(
                f"checkpoint {str(root)!r} has no {self.dir_name}/ for this shard "
                f"(found: {found or 'nothing'})"
            )
        verify_only = meta.get("verify_only", False)
        if not isinstance(verify_only, bool):
            raise BadRequest(f"field 'verify_only' must be a bool, got {verify_only!r}")
        converter = self._converter(meta)
        if verify_only:
            manifest = read_manifest(target)  # every listed file and its sha256
        else:  # store.load verifies the files itself: read the manifest once, unverified
            try:
                manifest = json.loads((target / MANIFEST).read_text())
            except (OSError, ValueError):
                manifest = {}  # store.load names what is wrong with it
        saved_by = manifest.get("extra") if isinstance(manifest, dict) else None
        saved_by = saved_by if isinstance(saved_by, dict) else {}
        if (saved_by.get("shard_id"), saved_by.get("num_shards")) not in (
            (None, None),
            (self.shard_id, self.num_shards),
        ):
            raise ShardCountMismatch(
                f"{str(target)!r} was saved by shard {saved_by.get('shard_id')} of "
                f"{saved_by.get('num_shards')}; this is shard {self.shard_id} of {self.num_shards}"
            )
        if verify_only:
            return {"dir": str(target), "mode": manifest.get("mode")}, {}
        started = time.perf_counter()
        self.store.load(str(target), converter=converter)
        if self.metrics is not None:
            self.metrics.load_seconds.observe(time.perf_counter() - started)
        return {"dir": str(target)}, {}

    def op_stats(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        return {
            "shard_id": self.shard_id,
            "num_shards": self.num_shards,
            "stats": _jsonable(self.store.stats()),
        }, {}


def build_store(config: ShardConfig) -> Any:
    """The in-process store a shard serves, built from its config."""
    from streamrec.embedding_store.store import EmbeddingStore

    return EmbeddingStore(
        list(config.tables),
        tier=config.tier,
        persistent_path=config.shard_persistent_path(),
        cache_budget_mb=config.cache_budget_mb,
        capacity=config.capacity,
        seed=config.seed,
        num_threads=config.num_threads,
    )


class Shard:
    """A running shard: store, handlers, RPC server and (optionally) the metrics endpoint."""

    def __init__(self, config: ShardConfig, store: Any | None = None) -> None:
        self.config = config
        self.store = store if store is not None else build_store(config)
        label = f"{config.shard_id}-of-{config.num_shards}"
        self.metrics = StoreMetrics(self.store.stats, label)
        self.service = StoreService(
            self.store,
            config.shard_id,
            config.num_shards,
            self.metrics,
            redis_url=config.redis_url,
            redis_prefix=config.redis_prefix,
        )
        self.server = RpcServer(
            config.endpoint,
            self.service.handlers(),
            workers=config.workers,
            max_message_bytes=config.max_message_bytes,
            on_request=self.service.on_request,
        )
        self.metrics_port: int | None = None

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def start(self) -> Shard:
        if self.config.metrics_port is not None:
            self.metrics_port = self.metrics.serve(
                self.config.metrics_port, self.config.metrics_host
            )
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()
        close = getattr(self.store, "close", None)
        if close is not None:
            close()


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux), so a test or benchmark
    killed hard leaves no shard behind."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class LocalShards:
    """Starts ``num_shards`` shard processes on this machine and stops them after.

    Each shard binds ``endpoint`` (default ``tcp://127.0.0.1:*``, a free port chosen by the
    OS; ``{shard}`` in it is replaced by the shard id, e.g. ``ipc:///tmp/x/shard-{shard}``
    for node-local clients) and reports its endpoint on stdout (``READY <endpoint>
    metrics=<port>``). Used by the tests, the benchmark and the local stack. The shards get
    SIGTERM when the thread that started them ends (Linux PR_SET_PDEATHSIG), so a killed test
    run leaves none behind: start them from a thread that outlives them (the main thread).

    Args:
        tables: the tables file (YAML/JSON) every shard reads.
        num_shards: N.
        extra_args: more ``serve`` flags for every shard (``--tier ssd ...``).
        start_timeout_s: how long to wait for every shard to be ready.
        endpoint: the address template every shard binds.

    Example:
        >>> with LocalShards("tables.yaml", 2) as shards:
        ...     client = EmbeddingStoreClient(shards.endpoints)
    """

    def __init__(
        self,
        tables: str | Path,
        num_shards: int,
        extra_args: list[str] | None = None,
        start_timeout_s: float = 60.0,
        metrics: bool = False,
        endpoint: str = "tcp://127.0.0.1:*",
    ) -> None:
        self.tables = str(tables)
        self.endpoint = endpoint
        self.num_shards = num_shards
        self.extra_args = list(extra_args or [])
        self.start_timeout_s = start_timeout_s
        self.metrics = metrics
        self.procs: list[subprocess.Popen | None] = [None] * num_shards
        self.endpoints: list[str] = [""] * num_shards
        self.metrics_ports: list[int | None] = [None] * num_shards
        self._logs: list[Any] = [None] * num_shards

    def command(self, shard_id: int) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "streamrec.embedding_store",
            "serve",
            "--shard-id",
            str(shard_id),
            "--num-shards",
            str(self.num_shards),
            "--endpoint",
            self.endpoint.replace("{shard}", str(shard_id)),
            "--tables",
            self.tables,
            *self.extra_args,
        ]
        if self.metrics:
            cmd += ["--metrics-port", "0"]
        return cmd

    def start(self) -> LocalShards:
        try:
            for k in range(self.num_shards):
                self.start_shard(k, wait=False)
            for k in range(self.num_shards):
                self._wait_ready(k)
        except BaseException:
            self.stop()
            raise
        return self

    def start_shard(self, shard_id: int, wait: bool = True) -> None:
        """(Re)starts shard ``shard_id``; its endpoint may change (a new free port)."""
        log_file = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in __exit__)
        self._logs[shard_id] = log_file
        self.procs[shard_id] = subprocess.Popen(
            self.command(shard_id),
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=_die_with_parent,
        )
        if wait:
            self._wait_ready(shard_id)

    def _wait_ready(self, shard_id: int) -> None:
        proc = self.procs[shard_id]
        assert proc is not None and proc.stdout is not None
        result: dict[str, str] = {}

        def read() -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                if line.startswith("READY "):
                    result["line"] = line
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(self.start_timeout_s)
        if "line" not in result:
            self.stop()
            raise RuntimeError(
                f"shard {shard_id} did not start within "
                f"{self.start_timeout_s}s: {self.stderr(shard_id)[-2000:]}"
            )
        parts = result["line"].split()
        self.endpoints[shard_id] = parts[1]
        for p in parts[2:]:
            if p.startswith("metrics=") and p != "metrics=none":
                self.metrics_ports[shard_id] = int(p.split("=", 1)[1])

    def stderr(self, shard_id: int) -> str:
        f = self._logs[shard_id]
        if f is None:
            return ""
        f.seek(0)
        return f.read()

    def kill(self, shard_id: int) -> None:
        """Kills shard ``shard_id`` hard (SIGKILL), as a crash would."""
        proc = self.procs[shard_id]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def stop_shard(self, shard_id: int, timeout_s: float = 10.0) -> int | None:
        """Stops one shard with SIGTERM (SIGKILL after ``timeout_s``); returns its exit code."""
        proc = self.procs[shard_id]
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
        return proc.returncode

    def stop(self) -> None:
        for k in range(self.num_shards):
            self.stop_shard(k)

    def alive(self, shard_id: int) -> bool:
        proc = self.procs[shard_id]
        return proc is not None and proc.poll() is None

    def ping(self, shard_id: int, timeout_s: float = 5.0) -> Meta:
        with RpcClient(self.endpoints[shard_id], timeout_s=timeout_s) as c:
            return c.call("ping")[0]

    def __enter__(self) -> LocalShards:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        for f in self._logs:
            if f is not None:
                f.close()
