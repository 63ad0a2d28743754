"""StreamRec's alert rules: the one source of the Prometheus rules file and the PrometheusRule.

``python -m streamrec.observability generate`` writes both from :data:`ALERTS`:

- ``deploy/prometheus/alerts.rules.yml``: a plain rules file (``promtool check rules``, the
  local ``streamrec up --prometheus``, any Prometheus without the operator);
- ``deploy/k8s/base/monitoring/prometheusrule.yaml``: the same groups as a
  ``monitoring.coreos.com/v1`` PrometheusRule for the Prometheus operator.

``deploy/prometheus/alerts.test.yml`` holds hand-written ``promtool test rules`` cases: each
alert firing when it should and silent when it should not.

Label names: Prometheus's ``job`` label is the scrape job (``streamrec-api``, ...), so the
StreamRec job id that the API's metrics carry as ``job`` is stored as ``exported_job``
(``honor_labels: false``, the default, both locally and for ServiceMonitors).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from streamrec.observability.generated import GENERATED_HEADER, write_or_check

#: ``page``: someone acts now (training stopped or about to lose state);
#: ``ticket``: look at it during working hours (quality or speed degraded).
Severity = Literal["page", "ticket"]
SEVERITIES: tuple[Severity, ...] = ("page", "ticket")

#: Where each alert's runbook section lives: ``docs/runbook.md#<alert name, lower case>``.
RUNBOOK = "docs/runbook.md"

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
        severity: ``page`` or ``ticket`` (the ``severity`` label Alertmanager routes on).
        summary: one line, may use ``{{ $labels.x }}`` and ``{{ $value }}``.
        description: what is wrong and what it costs, same templating.
        signals: the PromQL series ``expr`` reads, each returning data in a healthy running
            stack (the end-to-end test evaluates them on a live Prometheus: an alert over a
            series that never exists would never fire).
    """

    name: str
    expr: str
    for_: str
    severity: Severity
    summary: str
    description: str
    signals: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"{self.name}: severity must be one of {SEVERITIES}")
        if not self.signals:
            raise ValueError(f"{self.name}: an alert names the series it reads (signals)")

    @property
    def runbook_url(self) -> str:
        return f"{RUNBOOK}#{self.name.lower()}"

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


ALERTS: list[Alert] = [
    Alert(
        name="StreamRecTargetDown",
        expr='up{job=~"streamrec-.*"} == 0',
        for_="5m",
        severity="page",
        summary="{{ $labels.job }} target {{ $labels.instance }} is down",
        description=(
            "Prometheus has not scraped {{ $labels.instance }} (job {{ $labels.job }}) for 5"
            " minutes: the process is gone or its /metrics port is unreachable."
        ),
        signals=('up{job=~"streamrec-.*"}',),
    ),
    Alert(
        # The ages and the queue depth exist for running jobs only. A group waiting for data
        # (empty queue) makes no progress either: only age with work waiting is a stall. The
        # API hands a stuck pass out again after trainer_stuck_s (120 s by default), so a
        # pass held by a stuck group is back in the queue by the time this fires.
        name="StreamRecTrainerStalled",
        expr=(
            "streamrec_api_trainer_progress_age_seconds > 600"
            " and on (instance, exported_job) streamrec_api_work_queue_depth > 0"
        ),
        for_="5m",
        severity="page",
        summary="Trainer group of job {{ $labels.exported_job }} makes no progress",
        description=(
            "The trainer group of running job {{ $labels.exported_job }} has made no progress"
            " for {{ $value | humanizeDuration }} while passes wait on its work stream: the"
            " job is not training."
        ),
        signals=(
            "streamrec_api_trainer_progress_age_seconds",
            "streamrec_api_work_queue_depth",
        ),
    ),
    Alert(
        name="StreamRecTrainerHeartbeatMissing",
        expr="streamrec_api_trainer_heartbeat_age_seconds > 60",
        for_="5m",
        severity="page",
        summary="No trainer group heartbeat for job {{ $labels.exported_job }}",
        description=(
            "Job {{ $labels.exported_job }} runs but no trainer group has sent a heartbeat for"
            " {{ $value | humanizeDuration }} (the API's heartbeat_ttl_s is 10 s): no group"
            " is alive to take its passes."
        ),
        signals=("streamrec_api_trainer_heartbeat_age_seconds",),
    ),
    Alert(
        name="StreamRecTrainerGroupDead",
        expr=("sum by (exported_job) (increase(streamrec_api_trainer_groups_dead_total[15m])) > 0"),
        for_="0m",
        severity="ticket",
        summary="A trainer group of job {{ $labels.exported_job }} died",
        description=(
            '{{ $value | printf "%.0f" }} trainer group(s) of job {{ $labels.exported_job }}'
            " were found dead in the last 15 minutes (heartbeat expired with a pass in"
            " flight); their passes were handed out again."
        ),
        signals=("streamrec_api_trainer_groups_dead_total",),
    ),
    Alert(
        name="StreamRecPassAucDropped",
        # max by: one value per StreamRec job whichever API replica (or pod, after a
        # restart a day ago) exports it.
        expr=(
            'max by (exported_job) (streamrec_api_pass_auc{kind="predict"})'
            ' < max by (exported_job) (streamrec_api_pass_auc{kind="predict"} offset 1d) - 0.01'
        ),
        for_="10m",
        severity="ticket",
        summary="Predict AUC of job {{ $labels.exported_job }} dropped against yesterday",
        description=(
            "The predict AUC of job {{ $labels.exported_job }}'s last pass is"
            ' {{ $value | printf "%.4f" }}, more than 0.01 below its value a day earlier:'
            " the data or the model changed."
        ),
        signals=('streamrec_api_pass_auc{kind="predict"}',),
    ),
    Alert(
        name="StreamRecCheckpointFailing",
        expr=("sum by (exported_job) (increase(streamrec_api_checkpoint_failures_total[30m])) > 0"),
        for_="0m",
        severity="ticket",
        summary="Checkpoints of job {{ $labels.exported_job }} fail",
        description=(
            '{{ $value | printf "%.0f" }} checkpoint(s) or saves of job'
            " {{ $labels.exported_job }} failed in the last 30 minutes: a restart would"
            " resume from an older checkpoint and train those passes again."
        ),
        signals=("streamrec_api_checkpoint_failures_total",),
    ),
    Alert(
        name="StreamRecStoreNearCapacity",
        expr=(
            "streamrec_embedding_store_resident_bytes"
            " / streamrec_embedding_store_memory_limit_bytes > 0.9"
        ),
        for_="10m",
        severity="page",
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
        name="StreamRecCacheHitRateLow",
        expr="streamrec_embedding_store_cache_hit_ratio < 0.5",
        for_="15m",
        severity="ticket",
        summary="Cache hit rate of table {{ $labels.table }} on shard {{ $labels.shard }} is low",
        description=(
            "Only {{ $value | humanizePercentage }} of the lookups of table {{ $labels.table }}"
            " on shard {{ $labels.shard }} are served from the RAM cache; the rest read the"
            " ssd tier's files. Give the cache more memory."
        ),
        signals=("streamrec_embedding_store_cache_hit_ratio",),
    ),
    Alert(
        name="StreamRecSamplerLatencyHigh",
        expr=(
            "histogram_quantile(0.99, sum by (instance, op, le)"
            " (rate(streamrec_sampler_request_seconds_bucket[5m]))) > 0.05"
        ),
        for_="10m",
        severity="ticket",
        summary="Sampler {{ $labels.instance }} p99 latency of {{ $labels.op }} is high",
        description=(
            "The 99th percentile of sampler {{ $labels.instance }}'s {{ $labels.op }}"
            " requests over 5 minutes is {{ $value | humanizeDuration }} (above 50 ms): the"
            " trainers on its node wait for negatives."
        ),
        signals=(
            "histogram_quantile(0.99, sum by (instance, op, le)"
            " (rate(streamrec_sampler_request_seconds_bucket[5m])))",
        ),
    ),
    Alert(
        name="StreamRecRedisUnreachable",
        expr="streamrec_api_redis_up == 0",
        for_="1m",
        severity="page",
        summary="API {{ $labels.instance }} cannot reach Redis",
        description=(
            "The last Redis call of API {{ $labels.instance }} failed for a minute: no job"
            " can be created, started or scheduled, and trainers get no passes."
        ),
        signals=("streamrec_api_redis_up",),
    ),
    Alert(
        name="StreamRecRedisErrors",
        expr="increase(streamrec_api_redis_errors_total[5m]) > 0",
        for_="10m",
        severity="ticket",
        summary="API {{ $labels.instance }} keeps getting Redis errors",
        description=(
            'API {{ $labels.instance }} had {{ $value | printf "%.0f" }} failed Redis calls'
            " (connections or timeouts) in the last 5 minutes, and failed calls every 5"
            " minutes for 10 minutes."
        ),
        signals=("streamrec_api_redis_errors_total",),
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
