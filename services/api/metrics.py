"""Prometheus metrics of the control plane, named ``streamrec_api_..._<unit>``.

Each app gets its own registry (several apps may live in one test process); ``/metrics``
serves it.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from streamrec.metrics import LATENCY_BUCKETS


class ApiMetrics:
    """The API's metrics in one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        reg = self.registry
        self.requests = Counter(
            "streamrec_api_requests_total",
            "HTTP requests by route template and status",
            ["method", "route", "status"],
            registry=reg,
        )
        self.request_seconds = Histogram(
            "streamrec_api_request_seconds",
            "HTTP request latency",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.redis_errors = Counter(
            "streamrec_api_redis_errors_total",
            "Redis calls that failed (connection, timeout)",
            registry=reg,
        )
        self.jobs = Gauge("streamrec_api_jobs", "Jobs per state", ["state"], registry=reg)
        self.passes_handed_out = Counter(
            "streamrec_api_passes_handed_out_total",
            "Passes put on a job's work stream",
            ["job"],
            registry=reg,
        )
        self.passes_done = Counter(
            "streamrec_api_passes_done_total", "Passes reported done", ["job"], registry=reg
        )
        self.passes_requeued = Counter(
            "streamrec_api_passes_requeued_total",
            "Passes handed out again after their trainer group died or failed",
            ["job"],
            registry=reg,
        )
        # A pass's AUC and logloss have one name each, these: the trainers measure them and
        # report them here (per job); the trainer exports no gauge of its own for them.
        self.pass_auc = Gauge(
            "streamrec_api_pass_auc",
            "AUC of the last finished pass (kind: predict, train, best)",
            ["job", "kind"],
            registry=reg,
        )
        self.pass_logloss = Gauge(
            "streamrec_api_pass_logloss",
            "Mean log loss (nats) of the last finished pass (kind: predict, train)",
            ["job", "kind"],
            registry=reg,
        )
        self.pass_seconds = Histogram(
            "streamrec_api_pass_seconds",
            "Duration of a pass as reported by the trainers",
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.pass_samples = Counter(
            "streamrec_api_pass_samples_total",
            "Samples trained, as reported by the trainers",
            ["job"],
            registry=reg,
        )
        self.triggers = Counter(
            "streamrec_api_triggers_total", "Trigger outcomes", ["kind", "state"], registry=reg
        )
        self.checkpoints = Counter(
            "streamrec_api_checkpoints_total",
            "Checkpoints reported by the trainers",
            ["job"],
            registry=reg,
        )
        self.scheduler_tick_seconds = Histogram(
            "streamrec_api_scheduler_tick_seconds",
            "Duration of one scheduler tick",
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.scheduler_leader = Gauge(
            "streamrec_api_scheduler_leader",
            "1 when this API holds the scheduler lease",
            registry=reg,
        )
        self.trainers_dead = Counter(
            "streamrec_api_trainer_groups_dead_total",
            "Trainer groups found dead (heartbeat expired with a pass in flight)",
            ["job"],
            registry=reg,
        )
