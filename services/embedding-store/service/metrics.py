"""Prometheus metrics of one embedding-store shard (names ``streamrec_embedding_store_*``).

Request-side figures (keys, latency, save/load durations, errors) are counted by the server
as requests go by. Store-side figures (rows per table and tier, bytes per tier, cache hits and
hit rate, rows created/expanded/deleted/refused) are read from ``store.stats()`` at scrape
time by :class:`StoreCollector`, so they are never stale and cost nothing between scrapes.

Deleted rows (``rows_deleted_total``) carry a ``reason`` (:class:`~streamrec.embedding_store.
deletes.DeleteReason`): ``shrink``, ``erase`` and ``delta_load`` per namespace and table (0
until one happens), and ``namespace_drop`` under ``namespace="*"``: the rows of every
dropped namespace, per table (a dropped namespace's own series go with it). ``table_rows``
is the rows each table holds, every tier together; ``model_version`` the last base or delta
each namespace saved or loaded.
Every per-table series carries the ``namespace`` holding the table (``""``: the default one,
:mod:`~streamrec.embedding_store.service.namespaces`); a dropped namespace's series go with it.

The shard's memory (``resident_bytes``, the process's RSS, against ``memory_limit_bytes``,
its cgroup's ``memory.max`` else the machine's ``MemTotal``) is read at scrape time by
:class:`MemoryCollector`: ``resident / limit`` says how near capacity the shard is.

Each :class:`StoreMetrics` owns its registry (with the process collector's ``process_*``
series), so several shards (or tests) in one process do not collide.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from streamrec.embedding_store.deletes import DeleteReason
from streamrec.metrics import DURATION_BUCKETS, LATENCY_BUCKETS, serve_metrics

log = logging.getLogger(__name__)

PREFIX = "streamrec_embedding_store"

#: Per-table counters read from store stats: stats key -> (metric suffix, help).
_TABLE_COUNTERS = {
    "rows_created": ("rows_created_total", "Rows created (first pull or push of a key)"),
    "rows_expanded": ("rows_expanded_total", "Rows whose embedx part was expanded"),
    "rows_refused": ("rows_refused_total", "New keys refused by probabilistic admission"),
    "cache_hits": ("cache_hits_total", "Lookups served from the RAM cache (ssd tier)"),
    "cache_misses": ("cache_misses_total", "Lookups that went to the files (ssd tier)"),
    "cache_evictions": ("cache_evictions_total", "Rows evicted from the RAM cache (ssd tier)"),
    "cache_disk_read_bytes": ("cache_disk_read_bytes_total", "Row bytes read from the file (ssd)"),
    "cache_disk_written_bytes": (
        "cache_disk_written_bytes_total",
        "Row bytes written to the file (ssd tier: write-back, flushes, loads)",
    ),
}


#: The ``namespace`` label of the rows deleted by namespace drops (no namespace's name).
DROPPED_NAMESPACES = "*"
#: The reasons counted per namespace and table (a drop is counted apart).
_TABLE_REASONS = tuple(r for r in DeleteReason if r != DeleteReason.NAMESPACE_DROP)


class StoreCollector(Collector):
    """Turns ``stats()`` of each namespace's store into gauges and counters at scrape time.

    Args:
        stats: returns namespace -> its store's stats dict (see ``EmbeddingStore.stats``).
        shard: label value naming this shard (``K-of-N``).
        dropped: returns table -> rows freed by namespace drops (``Namespaces.dropped_rows``);
            None: no drops counted.
    """

    def __init__(
        self,
        stats: Callable[[], dict[str, dict[str, Any]]],
        shard: str,
        dropped: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self._stats = stats
        self._shard = shard
        self._dropped = dropped

    def collect(self) -> Iterator[Any]:
        try:
            stats = self._stats()
            dropped = self._dropped() if self._dropped is not None else {}
        except Exception:  # a scrape must never take the shard down
            log.exception("store stats failed during a metrics scrape")
            return
        yield from _families(stats, self._shard)
        yield _deleted_family(stats, dropped, self._shard)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _deleted_family(
    by_namespace: dict[str, dict[str, Any]], dropped: dict[str, int], shard: str
) -> CounterMetricFamily:
    """``rows_deleted_total`` by namespace, table and reason (see the module doc)."""
    family = CounterMetricFamily(
        f"{PREFIX}_rows_deleted_total",  # the family drops "_total", the sample has it
        "Rows deleted, by reason: shrink, erase, delta_load (a loaded delta's deletes), "
        "namespace_drop (namespace '*': every dropped namespace's rows)",
        labels=["shard", "namespace", "table", "reason"],
    )
    for namespace, stats in by_namespace.items():
        for name, table in (stats.get("tables") or {}).items():
            if not isinstance(table, dict):
                continue
            by_reason = table.get("rows_deleted_by_reason")
            by_reason = by_reason if isinstance(by_reason, dict) else {}
            for reason in _TABLE_REASONS:
                n = _num(by_reason.get(reason.value, 0))
                family.add_metric([shard, str(namespace), str(name), reason.value], n or 0.0)
    for name, n in dropped.items():
        family.add_metric(
            [shard, DROPPED_NAMESPACES, str(name), DeleteReason.NAMESPACE_DROP.value], float(n)
        )
    return family


def _families(by_namespace: dict[str, dict[str, Any]], shard: str) -> Iterator[Any]:
    rows = GaugeMetricFamily(
        f"{PREFIX}_rows",
        "Rows per namespace, table and tier",
        labels=["shard", "namespace", "table", "tier"],
    )
    table_rows = GaugeMetricFamily(
        f"{PREFIX}_table_rows",
        "Rows each table holds (its live keys), every tier together",
        labels=["shard", "namespace", "table"],
    )
    model_version = GaugeMetricFamily(
        f"{PREFIX}_model_version",
        "The last base or delta each namespace's store saved or loaded (0: none)",
        labels=["shard", "namespace"],
    )
    tier_bytes = GaugeMetricFamily(
        f"{PREFIX}_tier_bytes", "Bytes held per tier", labels=["shard", "tier"]
    )
    hit_rate = GaugeMetricFamily(
        f"{PREFIX}_cache_hit_ratio",
        "Share of lookups served from the cache (ssd tier)",
        labels=["shard", "namespace", "table"],
    )
    counters = {
        key: CounterMetricFamily(
            f"{PREFIX}_{suffix.removesuffix('_total')}",
            text,
            labels=["shard", "namespace", "table"],
        )
        for key, (suffix, text) in _TABLE_COUNTERS.items()
    }
    total_bytes: dict[str, float] = {}
    for namespace, stats in by_namespace.items():
        tier = str(stats.get("tier", "host"))
        version = _num(stats.get("model_version"))
        if version is not None:
            model_version.add_metric([shard, str(namespace)], version)
        for name, table in (stats.get("tables") or {}).items():
            if not isinstance(table, dict):
                continue
            labels = [shard, str(namespace), str(name)]
            live = _num(table.get("rows"))
            if live is not None:
                table_rows.add_metric(labels, live)
            by_tier = table.get("rows_by_tier")
            if not isinstance(by_tier, dict):
                by_tier = {tier: table.get("rows")}
            for t, v in by_tier.items():
                n = _num(v)
                if n is not None:
                    rows.add_metric([*labels, str(t)], n)
            for key, family in counters.items():
                v = _num(table.get(key))
                if v is not None:
                    family.add_metric(labels, v)
            hits, misses = _num(table.get("cache_hits")), _num(table.get("cache_misses"))
            ratio = _num(table.get("cache_hit_rate"))
            if ratio is None and hits is not None and misses is not None and hits + misses > 0:
                ratio = hits / (hits + misses)
            if ratio is not None:
                hit_rate.add_metric(labels, ratio)
        held = stats.get("bytes") or {}
        if isinstance(held, dict):
            for t, v in held.items():
                b = _num(v)
                if b is not None:
                    total_bytes[str(t)] = total_bytes.get(str(t), 0.0) + b
    for t, b in total_bytes.items():
        tier_bytes.add_metric([shard, t], b)
    yield rows
    yield table_rows
    yield model_version
    yield tier_bytes
    yield hit_rate
    yield from counters.values()


#: Where a process's memory limit is written: cgroup v2, then cgroup v1.
CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)


def resident_bytes(statm: Path = Path("/proc/self/statm")) -> int:
    """This process's resident set size (RSS) in bytes."""
    pages = int(statm.read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def memory_limit_bytes(
    cgroup_files: tuple[Path, ...] = CGROUP_LIMITS, meminfo: Path = Path("/proc/meminfo")
) -> int:
    """The memory this process may use: its cgroup's limit, else the machine's MemTotal (a
    cgroup without a limit says ``max``, or a huge number in cgroup v1)."""
    total = 0
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) * 1024  # kB
            break
    for path in cgroup_files:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and (total == 0 or int(text) < total):
            return int(text)
        break  # the first file found is this process's cgroup version
    return total


class MemoryCollector(Collector):
    """``resident_bytes`` and ``memory_limit_bytes`` of this shard, read at scrape time.

    Args:
        shard: label value naming this shard (``K-of-N``).
    """

    def __init__(self, shard: str) -> None:
        self._shard = shard
        self._limit: int | None = None

    def collect(self) -> Iterator[Any]:
        try:
            if self._limit is None:  # fixed for the process's life
                self._limit = memory_limit_bytes()
            rss = resident_bytes()
        except (OSError, ValueError, IndexError):  # no /proc: no memory series
            log.exception("cannot read the shard's memory for a metrics scrape")
            return
        limit = GaugeMetricFamily(
            f"{PREFIX}_memory_limit_bytes",
            "Memory the shard may use (cgroup memory.max, else MemTotal)",
            labels=["shard"],
        )
        limit.add_metric([self._shard], float(self._limit))
        resident = GaugeMetricFamily(
            f"{PREFIX}_resident_bytes", "Resident memory (RSS) of the shard", labels=["shard"]
        )
        resident.add_metric([self._shard], float(rss))
        yield limit
        yield resident


class GpuMemoryCollector(Collector):
    """GPU memory and utilisation of a shard whose store uses CUDA (the device tier and its
    cache), from torch.cuda at scrape time; no exporter needed (DCGM's, where installed,
    shows the same beside the node's other GPUs).

    Reads only when this process has already initialised CUDA: a host- or ssd-tier shard
    never does, and a scrape must not create a CUDA context.

    Args:
        shard: label value naming this shard (``K-of-N``).
    """

    def __init__(self, shard: str) -> None:
        self._shard = shard

    def collect(self) -> Iterator[Any]:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return
        try:
            device = torch.cuda.current_device()
            free, total = torch.cuda.mem_get_info(device)
            allocated = torch.cuda.memory_allocated(device)
        except RuntimeError:  # the device went away: no GPU series this scrape
            log.exception("cannot read GPU memory for a metrics scrape")
            return
        labels = ["shard", "device"]
        values = [self._shard, str(device)]
        for name, text, value in (
            (f"{PREFIX}_gpu_memory_used_bytes", "GPU memory in use (all processes)", total - free),
            (f"{PREFIX}_gpu_memory_total_bytes", "GPU memory of the shard's GPU", total),
            (
                f"{PREFIX}_gpu_memory_allocated_bytes",
                "GPU memory the shard's tensors hold",
                allocated,
            ),
        ):
            family = GaugeMetricFamily(name, text, labels=labels)
            family.add_metric(values, float(value))
            yield family
        try:
            busy = torch.cuda.utilization(device) / 100.0
        except Exception:  # utilization() needs NVML (pynvml): no series without it
            return
        family = GaugeMetricFamily(
            f"{PREFIX}_gpu_utilization_ratio",
            "Share of the last sample period the shard's GPU was busy (NVML)",
            labels=labels,
        )
        family.add_metric(values, busy)
        yield family


class StoreMetrics:
    """The metrics of one shard, in their own registry.

    Args:
        stats: namespace -> its store's stats (read at scrape time,
            ``Namespaces.stats``); None reads none.
        shard: label value naming this shard (``K-of-N``).
        dropped: table -> rows freed by namespace drops (``Namespaces.dropped_rows``).
    """

    def __init__(
        self,
        stats: Callable[[], dict[str, dict[str, Any]]] | None,
        shard: str,
        dropped: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.shard = shard
        r = self.registry
        ProcessCollector(registry=r)
        r.register(MemoryCollector(shard))
        r.register(GpuMemoryCollector(shard))
        self.request_seconds = Histogram(
            f"{PREFIX}_request_seconds",
            "Time to serve one request, by op",
            ["op"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.request_errors = Counter(
            f"{PREFIX}_request_errors_total",
            "Requests answered with an error, by op and code",
            ["op", "code"],
            registry=r,
        )
        by_table = ["namespace", "table"]
        self.pull_keys = Counter(f"{PREFIX}_pull_keys_total", "Keys pulled", by_table, registry=r)
        self.push_keys = Counter(f"{PREFIX}_push_keys_total", "Keys pushed", by_table, registry=r)
        self.pull_seconds = Histogram(
            f"{PREFIX}_pull_seconds",
            "Time of a pull in the store",
            by_table,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.optimizer_steps = Counter(
            f"{PREFIX}_optimizer_steps_total",
            "Fused optimizer steps (push batches applied), by table",
            by_table,
            registry=r,
        )
        self.push_seconds = Histogram(
            f"{PREFIX}_push_seconds",
            "Time of a push (optimizer update) in the store",
            by_table,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.save_seconds = Histogram(
            f"{PREFIX}_save_seconds",
            "Time to save, by mode",
            ["mode"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.load_seconds = Histogram(
            f"{PREFIX}_load_seconds",
            "Time to load a checkpoint",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        if stats is not None:
            r.register(StoreCollector(stats, shard, dropped))
        # (kind, namespace, table) -> that table's series: ``labels()`` is a locked lookup,
        # too slow for every table of every request; tables are the namespaces' own and a
        # dropped namespace's go (forget_namespace), so this stays bounded
        self._table_series: dict[tuple[str, str, str], tuple[Any, Any, Any]] = {}

    def table_series(self, kind: str, namespace: str, table: str) -> tuple[Any, Any, Any]:
        """(seconds histogram, keys counter, optimizer steps counter or None) of the pulls
        (``kind`` 'pull') or pushes ('push') of ``table`` in ``namespace``."""
        series = self._table_series.get((kind, namespace, table))
        if series is None:
            if kind == "pull":
                series = (
                    self.pull_seconds.labels(namespace, table),
                    self.pull_keys.labels(namespace, table),
                    None,
                )
            else:
                series = (
                    self.push_seconds.labels(namespace, table),
                    self.push_keys.labels(namespace, table),
                    self.optimizer_steps.labels(namespace, table),
                )
            self._table_series[(kind, namespace, table)] = series
        return series

    def forget_namespace(self, namespace: str) -> None:
        """Removes the series of a dropped namespace's tables (job ids come and go: kept,
        they would grow without bound)."""
        for kind, ns, table in list(self._table_series):
            if ns != namespace:
                continue
            del self._table_series[(kind, ns, table)]
            metrics = (
                (self.pull_seconds, self.pull_keys)
                if kind == "pull"
                else (self.push_seconds, self.push_keys, self.optimizer_steps)
            )
            for metric in metrics:
                with contextlib.suppress(KeyError):  # never observed: nothing to remove
                    metric.remove(ns, table)

    def on_request(self, op: str, seconds: float, code: str | None) -> None:
        """The RpcServer callback: one observation per request, one error count if any."""
        self.request_seconds.labels(op).observe(seconds)
        if code is not None:
            self.request_errors.labels(op, code).inc()

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serves /metrics on ``host:port`` (0 picks a free port); returns the bound port."""
        return serve_metrics(port, host, registry=self.registry)
