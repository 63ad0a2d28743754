"""StreamRec's alert rules: the one source of the Prometheus rules file and the PrometheusRule.

``python -m streamrec.observability generate`` writes both from :data:`ALERTS`:

- ``deploy/prometheus/alerts.rules.yml``: a plain rules file (``promtool check rules``, the
  local ``streamrec up --prometheus``, any Prometheus without the operator);
- ``deploy/k8s/base/monitoring/prometheusrule.yaml``: the same groups as a
  ``monitoring.coreos.com/v1`` PrometheusRule for the Prometheus operator.

``deploy/prometheus/alerts.test.yml`` (and ``alerts.week.test.yml``, the cases that span a week,
evaluated every 4 minutes) hold hand-written ``promtool test rules`` cases: each alert firing
when it should and silent when it should not.

Label names: Prometheus's ``job`` label is the scrape job (``streamrec-api``, ...); the API's
per-job series carry the StreamRec job id as ``job_id``.

Every alert is silent in every normal state of ``streamrec up`` and of the manifests: an idle
trainer pool, a job between passes or waiting for its next split, before its first pass,
paused, stopped, and an API replica that does not hold the scheduler lease (its per-job
gauges are stale: the rules read them joined with :data:`LEADER`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from streamrec.observability.generated import GENERATED_HEADER, write_or_check

#: ``critical``: someone acts now (training stopped or about to lose state);
#: ``warning``: look at it during working hours (quality or speed degraded).
Severity = Literal["critical", "warning"]
SEVERITIES: tuple[Severity, ...] = ("critical", "warning")

#: The one setting every ``runbook_url`` derives from: ``<RUNBOOK_URL>#<alert, lower case>``.
#: Absolute, as Alertmanager and its receivers need; point it at your copy of
#: ``docs/runbook.md`` and run ``make dashboards``.
RUNBOOK_URL = "https://github.com/streamrec/streamrec/blob/main/docs/runbook.md"

#: Filter for the API's per-job gauges: only the replica holding the scheduler lease sets
#: them; another replica keeps the values it had when it lost the lease.
LEADER = "on (instance) streamrec_api_scheduler_leader == 1"

RULES_FILE = Path("deploy/prometheus/alerts.rules.yml")
PROMETHEUS_RULE_FILE = Path("deploy/k8s/base/monitoring/prometheusrule.yaml")
GROUP_NAME = "streamrec"


@dataclass(frozen=True)
class Alert:
    """One alerting rule.

    Args:
        name: the alert's name (``StreamRec...``, CamelCase as Prometheus's convention).
        expr: PromQL that returns a series per firing instance of the alert.
        for_: how long ``expr`` must hold before the alert fires (Prometheus duration).
        severity: ``critical`` or ``warning`` (the ``severity`` label Alertmanager routes on).
        summary: one line, may use ``{{ $labels.x }}`` and ``{{ $value }}``.
        description: what is wrong and what it costs, same templating.
        signals: the PromQL series ``expr`` reads, each returning data in a healthy running
            stack (the end-to-end test evaluates them on a live Prometheus: an alert over a
            series that never exists would never fire).
        only_with: when the signals exist only in some deployments or after some event,
            what that is (the live-stack test then skips their data check); "" for always.
    """

    name: str
    expr: str
    for_: str
    severity: Severity
    summary: str
    description: str
    signals: tuple[str, ...]
    only_with: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"{self.name}: severity must be one of {SEVERITIES}")
        if not self.signals:
            raise ValueError(f"{self.name}: an alert names the series it reads (signals)")

    @property
    def runbook_url(self) -> str:
        return f"{RUNBOOK_URL}#{self.name.lower()}"

    def rule(self) -> dict[str, Any]:
        """The rule as Prometheus's rules file (and the PrometheusRule spec) spells it."""
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                "runbook_url": self.runbook_url,
            },
        }


_BY_TABLE = "sum by (instance, shard, namespace, table)"
_HITS = f"{_BY_TABLE} (rate(streamrec_embedding_store_cache_hits_total[15m]))"
_MISSES = f"{_BY_TABLE} (rate(streamrec_embedding_store_cache_misses_total[15m]))"

ALERTS: list[Alert] = [
    Alert(
        # The trainers have an alert of their own: a rank's /metrics is down while its group
        # restarts or waits in rendezvous for a missing peer, which may last minutes.
        name="StreamRecTargetDown",
        expr='up{job=~"streamrec-(api|sampler|embedding-store)"} == 0',
        for_="5m",
        severity="critical",
        summary="{{ $labels.job }} target {{ $labels.instance }} is down",
        description=(
            "Prometheus has not scraped {{ $labels.instance }} (job {{ $labels.job }}) for 5"
            " minutes: the process is gone or its /metrics port is unreachable."
        ),
        signals=('up{job=~"streamrec-(api|sampler|embedding-store)"}',),
    ),
    Alert(
        # An idle rank of the pool serves /metrics too: only a rank that cannot start (its
        # group crash-loops or never completes its rendezvous) is down this long.
        name="StreamRecTrainerTargetDown",
        expr='up{job="streamrec-trainer"} == 0',
        for_="15m",
        severity="warning",
        summary="Trainer rank {{ $labels.instance }} is down",
        description=(
            "Trainer rank {{ $labels.instance }} has not served /metrics for 15 minutes: its"
            " group keeps restarting, or waits in rendezvous for a rank that cannot start"
            " (Pending pod, no GPU of the right kind)."
        ),
        signals=('up{job="streamrec-trainer"}',),
    ),
    Alert(
        # Ages exist for running jobs that a group serves; a group waiting for data (empty
        # queue) makes no progress either: only age with work waiting is a stall.
        name="StreamRecTrainerStalled",
        expr=(
            "streamrec_api_trainer_progress_age_seconds > 600"
            " and on (instance, job_id) streamrec_api_work_queue_depth > 0"
            f" and {LEADER}"
        ),
        for_="5m",
        severity="critical",
        summary="Trainer group of job {{ $labels.job_id }} makes no progress",
        description=(
            "The trainer group of running job {{ $labels.job_id }} has made no progress"
            " for {{ $value | humanizeDuration }} while passes wait on its work stream: the"
            " job is not training."
        ),
        signals=(
            "streamrec_api_trainer_progress_age_seconds",
            "streamrec_api_work_queue_depth",
            "streamrec_api_scheduler_leader",
        ),
    ),
    Alert(
        name="StreamRecTrainerHeartbeatMissing",
        expr=f"streamrec_api_trainer_heartbeat_age_seconds > 60 and {LEADER}",
        for_="5m",
        severity="critical",
        summary="No trainer group heartbeat for job {{ $labels.job_id }}",
        description=(
            "Job {{ $labels.job_id }} has a trainer group but none of its heartbeats for"
            " {{ $value | humanizeDuration }} (the API's heartbeat_ttl_s is 10 s): the group"
            " is gone and has not been replaced."
        ),
        signals=(
            "streamrec_api_trainer_heartbeat_age_seconds",
            "streamrec_api_scheduler_leader",
        ),
    ),
    Alert(
        name="StreamRecNoTrainersForJob",
        expr=f"streamrec_api_jobs_waiting_for_trainers > 0 and {LEADER}",
        for_="10m",
        severity="warning",
        summary="{{ $value }} running job(s) wait for a trainer group",
        description=(
            "{{ $value }} running job(s) have had no trainer group for 10 minutes: every"
            " group of the pool is busy, or none has the job's resources.trainer_ranks."
            " GET /v1/jobs?state=running shows which (trainers: waiting_for_trainers)."
        ),
        signals=(
            "streamrec_api_jobs_waiting_for_trainers",
            "streamrec_api_scheduler_leader",
        ),
    ),
    Alert(
        # A group clears its registration as its job ends (done, failed, stopped, could not
        # start) and the API counts one that still names an ended job free all the same. It
        # may finish the step in hand first: a save runs up to distributed.checkpoint_timeout_s
        # (30 minutes by default), so only longer than that is a group that did not come back.
        name="StreamRecPoolGroupHeldByEndedJob",
        expr=f"streamrec_api_pool_groups_held_by_ended_jobs > 0 and {LEADER}",
        for_="30m",
        severity="warning",
        summary="{{ $value }} trainer group(s) still work for a job that has ended",
        description=(
            "{{ $value }} trainer group(s) of the pool have said for 30 minutes that they work"
            " for a job that has ended (stopped, succeeded, failed or deleted): they did not"
            " come back to the pool. The API gives them new jobs all the same; a group that"
            " takes none is stuck in the ended job and needs a restart."
        ),
        signals=(
            "streamrec_api_pool_groups_held_by_ended_jobs",
            "streamrec_api_scheduler_leader",
        ),
    ),
    Alert(
        # A group that dies again and again on its passes: each death's heartbeat gap is too
        # short for the age alerts to hold, so the restarts are counted. (A group that dies
        # before it takes a pass leaves the pool: StreamRecNoTrainersForJob and
        # StreamRecTrainerTargetDown see it.)
        name="StreamRecTrainerGroupRestarting",
        expr="sum by (job_id) (increase(streamrec_api_group_restarts_total[30m])) >= 3",
        for_="0m",
        severity="warning",
        summary="Trainer group of job {{ $labels.job_id }} keeps restarting",
        description=(
            '{{ $value | printf "%.0f" }} infrastructure restarts of job'
            " {{ $labels.job_id }}'s trainer group in 30 minutes (a rank killed, OOM-killed,"
            " evicted or stuck): a crash loop. The job fails when its restart budget is spent."
        ),
        signals=("streamrec_api_group_restarts_total",),
    ),
    Alert(
        name="StreamRecTrainerGroupDead",
        expr="sum by (job_id) (increase(streamrec_api_trainer_groups_dead_total[15m])) > 0",
        for_="0m",
        severity="warning",
        summary="A trainer group of job {{ $labels.job_id }} died",
        description=(
            '{{ $value | printf "%.0f" }} trainer group(s) of job {{ $labels.job_id }}'
            " were found dead in the last 15 minutes (heartbeat expired with a pass in"
            " flight); their passes were handed out again."
        ),
        signals=("streamrec_api_trainer_groups_dead_total",),
    ),
    Alert(
        # The leader's value now against the leader's value a day ago: a replica that lost
        # the lease keeps a stale AUC, which `max by` over replicas would let mask a drop.
        name="StreamRecPassAucDropped",
        expr=(
            'max by (job_id) (streamrec_api_pass_auc{kind="predict"} and ' + LEADER + ")"
            ' < max by (job_id) (streamrec_api_pass_auc{kind="predict"} offset 1d'
            " and on (instance) streamrec_api_scheduler_leader offset 1d == 1) - 0.01"
        ),
        for_="10m",
        severity="warning",
        summary="Predict AUC of job {{ $labels.job_id }} dropped against yesterday",
        description=(
            "The predict AUC of job {{ $labels.job_id }}'s last pass is"
            ' {{ $value | printf "%.4f" }}, more than 0.01 below its value a day earlier:'
            " the data or the model changed."
        ),
        signals=('streamrec_api_pass_auc{kind="predict"}', "streamrec_api_scheduler_leader"),
    ),
    Alert(
        # The trainer's verdict on the last pass (streamrec.trainer.model.evaluation: >= 99% of the
        # rows within 1% of one odds, or AUC exactly 0.5); a fresh model's first predictions
        # do not count. A pass's fact, not a noisy sample: no `for`. The gauge lives until the
        # job is deleted, so a job that ended on a collapsed model keeps paging for it.
        name="StreamRecModelStalled",
        expr=f"streamrec_api_pass_predictions_collapsed == 1 and {LEADER}",
        for_="0m",
        severity="critical",
        summary="The model of job {{ $labels.job_id }} predicts one probability for every row",
        description=(
            "The last pass of job {{ $labels.job_id }} predicted nearly the same probability"
            " for every row (a saturated or dead model: its AUC is 0.5 whatever the data). The"
            " job goes on training and exporting a model that ranks nothing. Its"
            " predictions_collapsed event names the pass, the share of rows and the AUC."
        ),
        signals=(
            "streamrec_api_pass_predictions_collapsed",
            "streamrec_api_scheduler_leader",
        ),
    ),
    Alert(
        # Counts failed saves of a trained model (a pass's checkpoint, a checkpoint
        # trigger), not a trigger refused because there is no model yet.
        name="StreamRecCheckpointFailing",
        expr="sum by (job_id) (increase(streamrec_api_checkpoint_failures_total[30m])) > 0",
        for_="0m",
        severity="warning",
        summary="Checkpoints of job {{ $labels.job_id }} fail",
        description=(
            '{{ $value | printf "%.0f" }} checkpoint(s) or saves of job'
            " {{ $labels.job_id }} failed in the last 30 minutes: a restart would"
            " resume from an older checkpoint and train those passes again."
        ),
        signals=("streamrec_api_checkpoint_failures_total",),
    ),
    Alert(
        # Expected interval: a week over the checkpoints of the last week (hourly ones: 1 h;
        # daily ones: 1 d); too old is three of them while the job trains (passes done in
        # the last 6 h: paused, stopped or waiting for data, nothing is due).
        name="StreamRecCheckpointTooOld",
        expr=(
            "(time() - max by (job_id) (streamrec_api_last_checkpoint_timestamp_seconds))"
            " > 3 * 604800 / sum by (job_id) (increase(streamrec_api_checkpoints_total[7d]))"
            " and on (job_id)"
            " sum by (job_id) (increase(streamrec_api_passes_done_total[6h])) > 0"
        ),
        for_="15m",
        severity="warning",
        summary="The last checkpoint of job {{ $labels.job_id }} is old",
        description=(
            "Job {{ $labels.job_id }} trains but its last checkpoint is"
            " {{ $value | humanizeDuration }} old, three times its usual interval: a restart"
            " would train every pass since again."
        ),
        signals=(
            "streamrec_api_last_checkpoint_timestamp_seconds",
            "streamrec_api_checkpoints_total",
            "streamrec_api_passes_done_total",
        ),
        only_with="a job's first checkpoint",
    ),
    Alert(
        # One pass at a time is handed out and taken within seconds: a pass that stays on
        # the work stream of a job a group serves (it has a heartbeat age) means the group
        # does not take it. A job waiting for a group is StreamRecNoTrainersForJob's.
        name="StreamRecWorkQueueGrowing",
        expr=(
            "min_over_time(streamrec_api_work_queue_depth[15m]) > 0"
            " and on (instance, job_id) streamrec_api_trainer_heartbeat_age_seconds"
            f" and {LEADER}"
        ),
        for_="5m",
        severity="warning",
        summary="Passes of job {{ $labels.job_id }} wait untaken on the work stream",
        description=(
            "Job {{ $labels.job_id }} has had {{ $value }} pass(es) handed out but not taken"
            " by its trainer group for 20 minutes."
        ),
        signals=(
            "streamrec_api_work_queue_depth",
            "streamrec_api_trainer_heartbeat_age_seconds",
            "streamrec_api_scheduler_leader",
        ),
    ),
    Alert(
        name="StreamRecDataNotArriving",
        expr=f"streamrec_api_data_wait_seconds > 7200 and {LEADER}",
        for_="10m",
        severity="warning",
        summary="No new data for job {{ $labels.job_id }}",
        description=(
            "Job {{ $labels.job_id }}'s next pass has waited"
            " {{ $value | humanizeDuration }} for its data (no donefile since): the upstream"
            " pipeline stopped landing splits, or lands them elsewhere."
        ),
        signals=("streamrec_api_data_wait_seconds", "streamrec_api_scheduler_leader"),
    ),
    Alert(
        # Behind by more than 6 h of data and still losing ground: a backfill of data that
        # landed long ago shrinks the lag and stays silent.
        name="StreamRecTrainingBehindData",
        expr=(
            "streamrec_api_pass_lag_seconds > 21600"
            " and deriv(streamrec_api_pass_lag_seconds[1h]) > 0"
            f" and {LEADER}"
        ),
        for_="30m",
        severity="warning",
        summary="Training of job {{ $labels.job_id }} falls behind its data",
        description=(
            "Job {{ $labels.job_id }} trains {{ $value | humanizeDuration }} of data behind"
            " the newest split landed, and the gap grows: the trainers are slower than the"
            " data arrives."
        ),
        signals=("streamrec_api_pass_lag_seconds", "streamrec_api_scheduler_leader"),
    ),
    Alert(
        name="StreamRecStoreNearCapacity",
        expr=(
            "streamrec_embedding_store_resident_bytes"
            " / streamrec_embedding_store_memory_limit_bytes > 0.9"
        ),
        for_="10m",
        severity="critical",
        summary="Embedding-store shard {{ $labels.shard }} is near its memory limit",
        description=(
            "Shard {{ $labels.shard }} ({{ $labels.instance }}) uses"
            " {{ $value | humanizePercentage }} of its memory limit: the next rows may get it"
            " OOM-killed. Shrink the tables, move them to the ssd tier or add shards."
        ),
        signals=(
            "streamrec_embedding_store_resident_bytes",
            "streamrec_embedding_store_memory_limit_bytes",
        ),
    ),
    Alert(
        name="StreamRecStoreGpuNearCapacity",
        expr=(
            "streamrec_embedding_store_gpu_memory_used_bytes"
            " / streamrec_embedding_store_gpu_memory_total_bytes > 0.9"
        ),
        for_="10m",
        severity="critical",
        summary="GPU memory of embedding-store shard {{ $labels.shard }} is nearly full",
        description=(
            "Shard {{ $labels.shard }} ({{ $labels.instance }}) has"
            " {{ $value | humanizePercentage }} of its GPU's memory in use: new rows of the"
            " device tier will fail to allocate. Shrink the tables or add shards."
        ),
        signals=(
            "streamrec_embedding_store_gpu_memory_used_bytes",
            "streamrec_embedding_store_gpu_memory_total_bytes",
        ),
        only_with="a store shard on a GPU (tier device)",
    ),
    Alert(
        # The ssd tier only: its lookups go to files on a miss. Over the last 15 minutes,
        # not since the shard started, and only with lookups to judge.
        name="StreamRecCacheHitRateLow",
        expr=f"{_HITS} / ({_HITS} + {_MISSES}) < 0.5",
        for_="15m",
        severity="warning",
        summary="Cache hit rate of table {{ $labels.table }} on shard {{ $labels.shard }} is low",
        description=(
            "Only {{ $value | humanizePercentage }} of the lookups of table {{ $labels.table }}"
            " on shard {{ $labels.shard }} in the last 15 minutes were served from the RAM"
            " cache; the rest read the ssd tier's files. Give the cache more memory."
        ),
        signals=(
            "streamrec_embedding_store_cache_hits_total",
            "streamrec_embedding_store_cache_misses_total",
        ),
        only_with="a store shard on the ssd tier",
    ),
    Alert(
        name="StreamRecStoreErrors",
        expr=(
            "sum by (instance) (rate(streamrec_embedding_store_request_errors_total[5m]))"
            " / sum by (instance) (rate(streamrec_embedding_store_request_seconds_count[5m]))"
            " > 0.01"
        ),
        for_="10m",
        severity="warning",
        summary="Embedding-store shard {{ $labels.instance }} answers requests with errors",
        description=(
            "{{ $value | humanizePercentage }} of shard {{ $labels.instance }}'s requests in"
            " the last 5 minutes were answered with an error (see the code label of"
            " streamrec_embedding_store_request_errors_total)."
        ),
        signals=(
            "streamrec_embedding_store_request_errors_total",
            "streamrec_embedding_store_request_seconds_count",
        ),
        only_with="a store request answered with an error",
    ),
    Alert(
        # Served requests only: the seconds-long table reload is an operation of its own.
        name="StreamRecSamplerLatencyHigh",
        expr=(
            "histogram_quantile(0.99, sum by (instance, op, le)"
            ' (rate(streamrec_sampler_request_seconds_bucket{op!="reload"}[5m]))) > 0.05'
        ),
        for_="10m",
        severity="warning",
        summary="Sampler {{ $labels.instance }} p99 latency of {{ $labels.op }} is high",
        description=(
            "The 99th percentile of sampler {{ $labels.instance }}'s {{ $labels.op }}"
            " requests over 5 minutes is {{ $value | humanizeDuration }} (above 50 ms): the"
            " trainers on its node wait for negatives."
        ),
        signals=(
            "histogram_quantile(0.99, sum by (instance, op, le)"
            ' (rate(streamrec_sampler_request_seconds_bucket{op!="reload"}[5m])))',
        ),
    ),
    Alert(
        name="StreamRecSamplerErrors",
        expr=(
            "sum by (instance) (rate(streamrec_sampler_errors_total[5m]))"
            " / sum by (instance) (rate(streamrec_sampler_requests_total[5m])) > 0.01"
        ),
        for_="10m",
        severity="warning",
        summary="Sampler {{ $labels.instance }} answers requests with errors",
        description=(
            "{{ $value | humanizePercentage }} of sampler {{ $labels.instance }}'s requests"
            " in the last 5 minutes were answered with an error (see the code label of"
            " streamrec_sampler_errors_total)."
        ),
        signals=("streamrec_sampler_errors_total", "streamrec_sampler_requests_total"),
        only_with="a sampler request answered with an error",
    ),
    Alert(
        # Failed Redis calls of a replica are this too: it covers them (no alert of their own).
        name="StreamRecRedisUnreachable",
        expr="streamrec_api_redis_up == 0",
        for_="1m",
        severity="critical",
        summary="API {{ $labels.instance }} cannot reach Redis",
        description=(
            "The last Redis call of API {{ $labels.instance }} failed for a minute: no job"
            " can be created, started or scheduled, and trainers get no passes."
        ),
        signals=("streamrec_api_redis_up",),
    ),
]


def rule_groups() -> dict[str, Any]:
    """The plain Prometheus rules file: one group holding every alert."""
    return {"groups": [{"name": GROUP_NAME, "rules": [a.rule() for a in ALERTS]}]}


def prometheus_rule() -> dict[str, Any]:
    """The same groups as a Prometheus-operator PrometheusRule (namespace set by kustomize).

    ``release: prometheus`` is what kube-prometheus-stack's default ``ruleSelector`` matches
    (the Helm release name); change it with the release.
    """
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "streamrec",
            "labels": {
                "app.kubernetes.io/name": "streamrec",
                "app.kubernetes.io/part-of": "streamrec",
                "release": "prometheus",
            },
        },
        "spec": rule_groups(),
    }


def _dump(doc: dict[str, Any]) -> str:
    body = yaml.safe_dump(doc, sort_keys=False, width=1000, allow_unicode=True)
    return GENERATED_HEADER.format(source="alerts.py") + body


def rules_text() -> str:
    """The rules file's text (``streamrec up --prometheus`` writes it into its run dir)."""
    return _dump(rule_groups())


def write_generated(root: Path, check: bool) -> list[Path]:
    """Writes (or with ``check`` compares) both rule files under the repository ``root``.

    Raises:
        StaleGeneratedFile: ``check`` and a committed file differs from :data:`ALERTS`.
    """
    return [
        write_or_check(root / RULES_FILE, rules_text(), check),
        write_or_check(root / PROMETHEUS_RULE_FILE, _dump(prometheus_rule()), check),
    ]
