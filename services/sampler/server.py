"""The sampler server: one per node, shared by every trainer process on it.

Ops (ZeroMQ, :mod:`streamrec.wire`; arrays are raw buffers, meta plain values):

=================  =========================================  ==============================
op                 request                                     reply
=================  =========================================  ==============================
ping               -                                           pid, hostname, generation, rows
reload             meta tags, columns; column arrays           rows, categories, generation
sample_ids         meta tags, flags; dedup (b,) int,           ids (sum(cnts),) int64
                   cnts (b,) int, [categories (b,) int]
valid_sample_ids   ids (k,) int                                found (k,) bool
pack_feature       meta default_value; ids (k,) int            meta columns; column arrays
stats              -                                           table and server figures
=================  =========================================  ==============================

The table is replaced by building the new one completely, then swapping one reference under
a lock: a request holds the reference it started with, so it sees the old table or the new
one, never a mix. Bad requests get an error naming the field and the value; the table and
the other clients are unaffected.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from streamrec.errors import BadRequest, quote
from streamrec.metrics import serve_metrics
from streamrec.sampler import metrics
from streamrec.sampler.columns import decode_columns, encode_columns
from streamrec.sampler.config import ServerConfig, lock_base
from streamrec.sampler.errors import NoTable, SamplerError, TagMismatch
from streamrec.sampler.presence import ClientPresence
from streamrec.sampler.table import NegativeTable, Tags
from streamrec.wire import Arrays, Handler, Meta, RpcServer

log = logging.getLogger(__name__)

TAG_FIELDS = ("sample_tag", "dedup_tag", "weight_tag", "skey_name")


class SamplerServer:
    """Holds the negative table and serves the ops above.

    Args:
        config: the validated :class:`ServerConfig`.
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.server_id = uuid.uuid4().hex
        self._table: NegativeTable | None = None
        self._generation = 0
        self._swap_lock = threading.Lock()
        self._reload_lock = threading.Lock()
        self._seeds = np.random.SeedSequence(config.seed)
        self._seed_lock = threading.Lock()
        self._local = threading.local()
        self._lock_file: Any = None
        # requests in flight and when the last one ended (the idle exit counts from there)
        self._busy = 0
        self._last_request = time.monotonic()
        self._activity = threading.Lock()
        # Requests run side by side on `workers` threads; each request's kernel takes its
        # share of the cores, so concurrent requests do not oversubscribe them.
        self._kernel_threads = max(1, (os.cpu_count() or 1) // config.workers)
        self.handlers = {
            op: self._tracked(handler)
            for op, handler in {
                "ping": self.ping,
                "reload": self.reload,
                "sample_ids": self.sample_ids,
                "valid_sample_ids": self.valid_sample_ids,
                "pack_feature": self.pack_feature,
                "stats": self.stats,
            }.items()
        }
        metrics.start(self.handlers)
        self.rpc: RpcServer | None = None
        self._presence: ClientPresence | None = None

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> SamplerServer:
        """Takes the endpoint's lifetime lock, binds, and starts the worker threads."""
        base = lock_base(self.config.endpoint)
        base.parent.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(f"{base}.lock", "a+")  # noqa: SIM115 (held for the lifetime)
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.seek(0)
            owner = self._lock_file.read().strip() or "?"
            self._lock_file.close()
            raise SamplerError(
                f"another sampler server (pid {owner}) already serves {self.config.endpoint}"
            ) from None
        self._lock_file.seek(0)
        self._lock_file.truncate()
        self._lock_file.write(str(os.getpid()))
        self._lock_file.flush()
        if self.config.endpoint.startswith("ipc://"):
            Path(self.config.endpoint[len("ipc://") :]).unlink(missing_ok=True)  # stale socket
        self.rpc = RpcServer(
            self.config.endpoint,
            self.handlers,
            workers=self.config.workers,
            max_message_bytes=self.config.max_message_bytes,
            on_request=self._observe,
            token=self.config.auth_token(),
        )
        # watched before the proxy thread owns the socket (ZeroMQ sockets are not thread-safe)
        self._presence = ClientPresence(self.rpc.frontend).start()
        self.rpc.start()
        return self

    def stop(self) -> None:
        if self.rpc is not None:
            self.rpc.stop()
            if self._presence is not None:
                self._presence.stop()
            if self.config.endpoint.startswith("ipc://"):
                Path(self.config.endpoint[len("ipc://") :]).unlink(missing_ok=True)
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def _tracked(self, handler: Handler) -> Handler:
        """``handler``, counted as activity: a request in flight is never idle time."""

        def run(meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
            with self._activity:
                self._busy += 1
            try:
                return handler(meta, arrays)
            finally:
                with self._activity:
                    self._busy -= 1
                    self._last_request = time.monotonic()

        return run

    def idle_seconds(self) -> float:
        """Seconds since the last request ended and the last client left, the smaller; 0
        while a request is in flight or a client is connected (``presence.py``)."""
        with self._activity:
            quiet = 0.0 if self._busy else time.monotonic() - self._last_request
        absent = self._presence.absent_seconds() if self._presence is not None else quiet
        return min(quiet, absent)

    @property
    def endpoint(self) -> str:
        return self.rpc.endpoint if self.rpc is not None else self.config.endpoint

    def _observe(self, op: str, seconds: float, code: str | None) -> None:
        metrics.observe_request(op if op in self.handlers else "unknown", seconds, code)

    def _rng(self) -> np.random.Generator:
        rng = getattr(self._local, "rng", None)
        if rng is None:  # one independent stream per worker thread (Generators are not shared)
            with self._seed_lock:
                (child,) = self._seeds.spawn(1)
            rng = self._local.rng = np.random.default_rng(child)
        return rng

    def _current(self) -> NegativeTable:
        table = self._table
        if table is None:
            raise NoTable("no negative table loaded; call reload(table) first")
        return table

    # ---- ops ------------------------------------------------------------------------------

    def ping(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        table = self._table
        return {
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "server_id": self.server_id,
            "generation": self._generation,
            "rows": table.num_rows if table is not None else None,
        }, {}

    def stats(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        table = self._table
        out: dict[str, Any] = {
            "pid": os.getpid(),
            "generation": self._generation,
            "workers": self.config.workers,
        }
        if table is not None:
            out.update(table.stats(), tags=table.tags.as_dict())
        return out, {}

    def reload(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        tags = _tags(meta)
        started = time.perf_counter()
        with self._reload_lock:  # one build at a time; samplers keep using the old table
            table = NegativeTable(decode_columns(meta.get("columns"), arrays), tags)
            with self._swap_lock:
                self._table = table
                self._generation += 1
                generation = self._generation
        seconds = time.perf_counter() - started
        metrics.RELOADS.inc()
        metrics.RELOAD_SECONDS.observe(seconds)
        metrics.TABLE_ROWS.set(table.num_rows)
        metrics.TABLE_CATEGORIES.set(table.by_category.num_groups)
        log.info("loaded table generation %d: %s in %.2fs", generation, table.stats(), seconds)
        return {**table.stats(), "generation": generation, "seconds": seconds}, {}

    def sample_ids(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        table = self._current()
        _check_tags(meta, table)
        dedup = _int_array(arrays, "dedup")
        b = len(dedup)
        cnts = _int_array(arrays, "cnts", convert=False)  # checked in its own dtype first
        if len(cnts) != b:
            raise BadRequest(
                f"sample_cnts has {len(cnts)} entries but there are {b} positives "
                f"(one count per dedup id)"
            )
        total = _checked_total(cnts, self.config.max_negatives)
        cnts = cnts.astype(np.int64, copy=False)  # each in [0, cap] now: no wrap
        categories = None
        if "categories" in arrays:
            categories = _int_array(arrays, "categories")
            if len(categories) != b:
                raise BadRequest(f"sample_tag has {len(categories)} values but dedup_tag has {b}")
        missing_id = _id64(meta, "missing_id", -1)
        avoid_conflict = _flag(meta, "avoid_conflict", True)
        avoid_all = _flag(meta, "avoid_conflict_with_all_dedup_tags", False)
        put_back = _flag(meta, "put_back", True)
        result = table.sample(
            dedup,
            categories,
            cnts,
            avoid_conflict=avoid_conflict,
            avoid_all=avoid_all,
            put_back=put_back,
            max_rounds=self.config.max_rounds,
            missing_id=missing_id,
            rng=self._rng(),
            threads=self._kernel_threads,
        )
        metrics.NEGATIVES.inc(total - result.unfilled)
        metrics.UNFILLED.inc(result.unfilled)
        return {
            "unfilled": result.unfilled,
            "rounds": result.rounds,
            "generation": self._generation,
        }, {"ids": result.ids}

    def _ids(self, arrays: Arrays) -> np.ndarray:
        ids = _int_array(arrays, "ids")
        if len(ids) > self.config.max_negatives:
            raise BadRequest(
                f"array 'ids' has {len(ids)} entries, above the server's cap of "
                f"{self.config.max_negatives} per request"
            )
        return ids

    def valid_sample_ids(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        table = self._current()
        ids = self._ids(arrays)
        return {}, {"found": table.rows_of(ids) >= 0}

    def pack_feature(self, meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        table = self._current()
        ids = self._ids(arrays)
        default = _id64(meta, "default_value", 0)
        spec, out = encode_columns(table.pack(ids, default))
        return {"columns": spec}, out


def _tags(meta: Meta) -> Tags:
    tags = meta.get("tags")
    if not isinstance(tags, dict):
        raise BadRequest(f"meta field 'tags' must be a map of {TAG_FIELDS}, got {tags!r:.80}")
    for name in TAG_FIELDS:
        if not isinstance(tags.get(name), str) or not tags[name]:
            raise BadRequest(
                f"meta field 'tags.{name}' must be a non-empty string, got {tags.get(name)!r:.80}"
            )
    return Tags(**{name: tags[name] for name in TAG_FIELDS})


def _check_tags(meta: Meta, table: NegativeTable) -> None:
    if "tags" not in meta:
        return
    asked = _tags(meta).as_dict()
    loaded = table.tags.as_dict()
    if asked != loaded:
        diff = {k: (asked[k], loaded[k]) for k in TAG_FIELDS if asked[k] != loaded[k]}
        raise TagMismatch(f"client tags differ from the loaded table's (client, table): {diff}")


def _checked_total(cnts: np.ndarray, cap: int) -> int:
    """``sum(cnts)`` of a request's counts ((b,) int64), refused unless every count is >= 0
    and the sum is at most ``cap``.

    Each count is checked against ``cap`` before anything is summed, and the sum is taken
    in Python integers: an int64 sum of peer counts wraps (four counts of 2**62 sum to 0),
    and a wrapped total would pass the cap and size the output arrays.
    """
    if not len(cnts):
        return 0
    low, high = int(cnts.min()), int(cnts.max())
    if low < 0:
        i = int(np.argmin(cnts))
        raise BadRequest(f"sample_cnts[{i}] = {low}: counts must be >= 0")
    if high > cap:
        i = int(np.argmax(cnts))
        raise BadRequest(
            f"sample_cnts[{i}] = {high}: above the server's cap of {cap} negatives per request"
        )
    # every count is in [0, cap]: a sum in uint64 wraps only past 2**64 / cap counts, so the
    # chunks below stay exact and their Python sum cannot wrap
    chunk = max(1, ((1 << 64) - 1) // max(cap, 1))
    parts = range(0, len(cnts), chunk)
    total = sum(int(cnts[i : i + chunk].sum(dtype=np.uint64)) for i in parts)
    if total > cap:
        raise BadRequest(
            f"sample_cnts sum to {total}, above the server's cap of {cap} negatives per request"
        )
    return total


def _id64(meta: Meta, field: str, default: int) -> int:
    """An id from ``meta[field]`` as int64: a signed or unsigned 64-bit value (uint64
    feasigns keep their bit pattern); anything else is a BadRequest naming the field."""
    value = meta.get(field, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"meta field {field!r} must be an int, got {quote(value)}")
    if not -(1 << 63) <= value < (1 << 64):
        raise BadRequest(f"meta field {field!r}: {value} does not fit 64 bits")
    return value - (1 << 64) if value >= 1 << 63 else value


def _int_array(arrays: Arrays, name: str, convert: bool = True) -> np.ndarray:
    """The integer array ``name``, 1-D, as int64 (uint64 keeps its bit pattern), or as sent
    when ``convert`` is False."""
    arr = arrays.get(name)
    if arr is None:
        raise BadRequest(f"array {name!r} is missing (got {sorted(arrays)})")
    if arr.ndim != 1:
        raise BadRequest(f"array {name!r} must be 1-D, got shape {list(arr.shape)}")
    if arr.dtype.kind not in "iu":
        raise BadRequest(f"array {name!r} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False) if convert else arr


def _flag(meta: Meta, name: str, default: bool) -> bool:
    value = meta.get(name, default)
    if not isinstance(value, bool):
        raise BadRequest(f"meta field {name!r} must be true or false, got {value!r:.80}")
    return value


def serve(config: ServerConfig) -> None:
    """Runs the server until SIGTERM or SIGINT."""
    server = SamplerServer(config).start()
    if config.metrics_port is not None:
        port = serve_metrics(config.metrics_port, config.metrics_host)
        log.info("metrics on http://%s:%d/metrics", config.metrics_host, port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("sampler serving on %s (pid %d)", server.endpoint, os.getpid())
    idle_exit = config.idle_exit_s
    try:
        while not stop.wait(0.5):
            if idle_exit and server.idle_seconds() > idle_exit:
                log.info("no client for %.0f s (idle_exit_s): exiting", idle_exit)
                break
    finally:
        server.stop()
        log.info("sampler stopped")
