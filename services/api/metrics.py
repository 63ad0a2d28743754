"""Prometheus metrics of the control plane, named ``streamrec_api_..._<unit>``.

Each app gets its own registry (several apps may live in one test process); ``/metrics``
serves it, with the process collector's ``process_*`` series beside the API's own.

Per-job series carry the StreamRec job id as ``job_id`` (not ``job``, which Prometheus keeps
for the scrape job). The gauges the scheduler sets each tick (jobs per state, the pool, the
running jobs' ages, queue depth, lag) are served only while this API holds the scheduler
lease: a replica that lost it would serve stale values. The last pass's AUC, logloss, CTR
and collapse flag stay on the replica that applied the report; alerts and panels read them
joined with ``streamrec_api_scheduler_leader == 1`` on ``instance``. The collapse flag, which
an alert pages on, is dropped when its job is deleted (:meth:`ApiMetrics.forget_job`).

Counters the alerts read start at 0: the trigger outcomes here, a job's counters when the
scheduler first sees it active (:meth:`ApiMetrics.start_job`), so ``rate()`` and
``increase()`` have a series before the first event.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from streamrec.api.state import TriggerState
from streamrec.control.channel import CommandType
from streamrec.metrics import DURATION_BUCKETS, LATENCY_BUCKETS


class _WhileLeader(Collector):
    """Serves ``inner``'s metrics while ``metrics.scheduler_leader`` is 1."""

    def __init__(self, metrics: ApiMetrics, inner: CollectorRegistry) -> None:
        self._metrics = metrics
        self._inner = inner

    def collect(self) -> Iterator[Metric]:
        (family,) = self._metrics.scheduler_leader.collect()
        if family.samples and family.samples[0].value == 1:
            yield from self._inner.collect()


class ApiMetrics:
    """The API's metrics in one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        reg = self.registry
        ProcessCollector(registry=reg)
        # The gauges the scheduler sets each tick: served only while this API holds the
        # lease (a replica that lost it would serve the values it had then, stale).
        tick = CollectorRegistry()
        reg.register(_WhileLeader(self, tick))
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
        self.jobs = Gauge("streamrec_api_jobs", "Jobs per state", ["state"], registry=tick)
        self.passes_handed_out = Counter(
            "streamrec_api_passes_handed_out_total",
            "Passes put on a job's work stream",
            ["job_id"],
            registry=reg,
        )
        self.passes_done = Counter(
            "streamrec_api_passes_done_total", "Passes reported done", ["job_id"], registry=reg
        )
        self.passes_requeued = Counter(
            "streamrec_api_passes_requeued_total",
            "Passes handed out again after their trainer group died or failed",
            ["job_id"],
            registry=reg,
        )
        # A pass's AUC and logloss have one name each, these: the trainers measure them and
        # report them here (per job); the trainer exports no gauge of its own for them.
        self.pass_auc = Gauge(
            "streamrec_api_pass_auc",
            "AUC of the last finished pass (kind: predict, train, best)",
            ["job_id", "kind"],
            registry=reg,
        )
        self.pass_logloss = Gauge(
            "streamrec_api_pass_logloss",
            "Mean log loss (nats) of the last finished pass (kind: predict, train)",
            ["job_id", "kind"],
            registry=reg,
        )
        self.pass_seconds = Histogram(
            "streamrec_api_pass_seconds",
            "Duration of a pass as reported by the trainers",
            ["job_id"],
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self.pass_samples = Counter(
            "streamrec_api_pass_samples_total",
            "Samples trained, as reported by the trainers",
            ["job_id"],
            registry=reg,
        )
        self.triggers = Counter(
            "streamrec_api_triggers_total", "Trigger outcomes", ["kind", "state"], registry=reg
        )
        self.checkpoints = Counter(
            "streamrec_api_checkpoints_total",
            "Checkpoints reported by the trainers",
            ["job_id"],
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
            ["job_id"],
            registry=reg,
        )
        self.redis_up = Gauge(
            "streamrec_api_redis_up",
            "1 when the last scheduler tick reached Redis, else 0",
            registry=reg,
        )
        self.heartbeat_age = Gauge(
            "streamrec_api_trainer_heartbeat_age_seconds",
            "Seconds since the running job's trainer group last sent a heartbeat (since the "
            "job became running when none has been seen)",
            ["job_id"],
            registry=tick,
        )
        self.progress_age = Gauge(
            "streamrec_api_trainer_progress_age_seconds",
            "Seconds since the running job's trainer group last made progress (the progress "
            "time of its heartbeat)",
            ["job_id"],
            registry=tick,
        )
        self.work_queue_depth = Gauge(
            "streamrec_api_work_queue_depth",
            "Passes on the job's work stream not yet taken by a trainer group",
            ["job_id"],
            registry=tick,
        )
        self.pass_ctr = Gauge(
            "streamrec_api_pass_ctr",
            "Click-through rate of the last finished pass's training samples (kind: predicted, "
            "the model's mean prediction; actual, the labels' mean)",
            ["job_id", "kind"],
            registry=reg,
        )
        self.last_checkpoint = Gauge(
            "streamrec_api_last_checkpoint_timestamp_seconds",
            "Unix time the job's last checkpoint was reported (by this API's scheduler)",
            ["job_id"],
            registry=reg,
        )
        self.data_wait = Gauge(
            "streamrec_api_data_wait_seconds",
            "Seconds the running job's next pass has waited for its data: since the newest "
            "donefile of the job's data landed (0 when the next pass is ready or in flight)",
            ["job_id"],
            registry=tick,
        )
        self.pass_lag = Gauge(
            "streamrec_api_pass_lag_seconds",
            "Data time between the newest pass whose data has landed and the next pass to "
            "train: how far training is behind the data (one pass interval when keeping up)",
            ["job_id"],
            registry=tick,
        )
        self.checkpoint_failures = Counter(
            "streamrec_api_checkpoint_failures_total",
            "Passes whose checkpoint or save failed, and checkpoint triggers that failed",
            ["job_id"],
            registry=reg,
        )
        self.jobs_waiting_for_trainers = Gauge(
            "streamrec_api_jobs_waiting_for_trainers",
            "Running jobs that no trainer group serves (none in the pool fits or is free)",
            registry=tick,
        )
        self.pool_groups = Gauge(
            "streamrec_api_pool_groups",
            "Trainer groups registered in the pool, idle or busy with a job",
            ["state"],
            registry=tick,
        )
        self.pool_groups_held_by_ended_jobs = Gauge(
            "streamrec_api_pool_groups_held_by_ended_jobs",
            "Trainer groups whose registration still names a job that has ended (stopped, "
            "succeeded, failed, deleted): counted free, but the group did not come back",
            registry=tick,
        )
        self.group_restarts = Counter(
            "streamrec_api_group_restarts_total",
            "Infrastructure restarts of a job's trainer group (a process killed, evicted, "
            "OOM-killed or stuck; not the pass's fault)",
            ["job_id"],
            registry=reg,
        )
        self.empty_passes = Counter(
            "streamrec_api_empty_passes_total",
            "Passes done with 0 samples (their splits held no usable line: no AUC, no update)",
            ["job_id"],
            registry=reg,
        )
        # Like the AUCs, the last pass's (on the replica that applied its report), but dropped
        # when the job is deleted (forget_job): a 1 left behind would page for ever.
        self.pass_predictions_collapsed = Gauge(
            "streamrec_api_pass_predictions_collapsed",
            "1 when the last finished pass's predictions collapsed (nearly every row at one "
            "probability, or AUC exactly 0.5: a saturated or dead model), else 0",
            ["job_id"],
            registry=reg,
        )
        self.insecure = Gauge(
            "streamrec_api_insecure",
            "1 for each setting of this API that leaves a door open (auth_disabled, "
            "redis_no_password); absent when none",
            ["setting"],
            registry=reg,
        )
        for state in ("idle", "busy"):
            self.pool_groups.labels(state).set(0)
        for kind in (CommandType.CHECKPOINT, CommandType.EXPORT, CommandType.SHRINK):
            for state in (TriggerState.DONE, TriggerState.FAILED):
                self.triggers.labels(kind.value, state.value)

    def start_job(self, job: str) -> None:
        """Creates ``job``'s counters at 0 (idempotent)."""
        for counter in (
            self.passes_handed_out,
            self.passes_done,
            self.passes_requeued,
            self.pass_samples,
            self.checkpoints,
            self.trainers_dead,
            self.checkpoint_failures,
            self.group_restarts,
            self.empty_passes,
        ):
            counter.labels(job)

    def forget_running(self, job: str) -> None:
        """Drops the gauges that exist for running jobs only."""
        for gauge in (
            self.heartbeat_age,
            self.progress_age,
            self.work_queue_depth,
            self.data_wait,
            self.pass_lag,
        ):
            with contextlib.suppress(KeyError):  # never set
                gauge.remove(job)

    def collapse_gauged_jobs(self) -> set[str]:
        """The jobs that have a ``pass_predictions_collapsed`` value."""
        return {
            sample.labels["job_id"]
            for family in self.pass_predictions_collapsed.collect()
            for sample in family.samples
        }

    def forget_job(self, job: str) -> None:
        """Drops the last-pass gauges that must not outlive a deleted job."""
        with contextlib.suppress(KeyError):  # never set
            self.pass_predictions_collapsed.remove(job)
