"""StreamRec's Grafana dashboards, built with Grafana's typed builders (grafana-foundation-sdk).

The JSON under ``deploy/k8s/base/dashboards/`` is generated from this module and committed
(kustomize turns it into ConfigMaps for the Grafana sidecar); a test regenerates it and
compares. Every query names only metrics that a ``services/*/metrics.py`` defines.

Each dashboard has a Prometheus ``datasource`` variable that every panel uses. The API labels
its per-job series with the StreamRec job id in a ``job`` label; Prometheus (local stack and
operator alike, ``honor_labels`` false) keeps its own ``job`` (the scrape job,
``streamrec-api``) and renames the exposed one to ``exported_job``: that is :data:`JOB_LABEL`,
and the dashboards' ``job`` variable lists its values.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as models
from streamrec.observability.generated import write_or_check

#: Where the generated JSON lives, relative to the repository root.
DASHBOARD_DIR = Path("deploy/k8s/base/dashboards")

#: The label carrying the StreamRec job id of the API's per-job series once scraped.
JOB_LABEL = "exported_job"

#: Rate window: Grafana picks it from the scrape interval and the panel's resolution.
RATE = "$__rate_interval"

_DATASOURCE = models.DataSourceRef(type_val="prometheus", uid="${datasource}")
_JOB = f'{JOB_LABEL}=~"$job"'
_REF_IDS = "ABCDEFGHIJ"

Target = tuple[str, str]  # (PromQL expression, legend format)
Panel = timeseries.Panel | stat.Panel


def _targets(panel: Panel, targets: list[Target]) -> None:
    if not 0 < len(targets) <= len(_REF_IDS):
        raise ValueError(f"a panel takes 1 to {len(_REF_IDS)} targets, got {len(targets)}")
    for ref_id, (expr, legend) in zip(_REF_IDS, targets, strict=False):
        panel.with_target(prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref_id))


def _series(
    title: str,
    unit: str,
    targets: list[Target],
    description: str,
    min_value: float | None = None,
) -> timeseries.Panel:
    """A half-row time-series panel over ``targets`` (legend: a table of last and max)."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(_DATASOURCE)
        .unit(unit)
        .span(12)
        .height(8)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
    )
    if min_value is not None:
        panel.min(min_value)
    _targets(panel, targets)
    return panel


def _stat(title: str, unit: str, targets: list[Target], description: str) -> stat.Panel:
    """A single-value panel (the last value of each series), a quarter of a row wide."""
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(_DATASOURCE)
        .unit(unit)
        .span(6)
        .height(4)
        .graph_mode(common.BigValueGraphMode.AREA)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
    )
    _targets(panel, targets)
    return panel


def _select(metric: str, selector: str) -> str:
    return f"{metric}{{{selector}}}" if selector else metric


def _sum(inner: str, by: str) -> str:
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def _rate(metric: str, by: str = "", selector: str = "") -> str:
    """``sum [by (...)] (rate(metric{selector}[$__rate_interval]))``."""
    return _sum(f"rate({_select(metric, selector)}[{RATE}])", by)


def _increase(metric: str, by: str = "", selector: str = "") -> str:
    """``sum [by (...)] (increase(metric{selector}[$__rate_interval]))``."""
    return _sum(f"increase({_select(metric, selector)}[{RATE}])", by)


def _or_zero(expr: str) -> str:
    """``expr``, or a single 0 when no series exists yet (an event that has not happened).

    ``on()`` keeps the 0 out as soon as ``expr`` has any series.
    """
    return f"({expr} or on() vector(0))"


def _quantile(q: float, histogram: str, by: str = "", selector: str = "") -> str:
    """The ``q`` quantile of a histogram over the rate window, per ``by`` labels."""
    labels = ", ".join(["le", *([by] if by else [])])
    rate = f"rate({_select(histogram + '_bucket', selector)}[{RATE}])"
    return f"histogram_quantile({q}, sum by ({labels}) ({rate}))"


def _latency(histogram: str, by: str = "", selector: str = "", what: str = "") -> list[Target]:
    """p50 and p99 targets of a histogram (legend: quantile, then the ``by`` label)."""
    suffix = f" {{{{{by}}}}}" if by else ""
    prefix = f"{what} " if what else ""
    return [
        (_quantile(q, histogram, by, selector), f"{prefix}p{round(q * 100)}{suffix}")
        for q in (0.5, 0.99)
    ]


def _base(uid: str, title: str, description: str, job_variable: bool) -> dashboard.Dashboard:
    """A dashboard with the datasource variable (and the StreamRec ``job`` variable)."""
    board = (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["streamrec"])
        .editable()
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .tooltip(models.DashboardCursorSync.CROSSHAIR)
        # Grafana's own annotations (deploy marks, manual notes); its model wants the list.
        .annotation(
            dashboard.AnnotationQuery()
            .name("Annotations & Alerts")
            .datasource(models.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .type("dashboard")
        )
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
        )
    )
    if job_variable:
        board.with_variable(
            dashboard.QueryVariable("job")
            .label("StreamRec job")
            .description("StreamRec job id (the API's job label, scraped as exported_job)")
            .datasource(_DATASOURCE)
            # created at 0 when a job starts: a job is listed before its first pass ends
            .query(f"label_values(streamrec_api_passes_done_total, {JOB_LABEL})")
            .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(models.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    return board


def job_overview() -> dashboard.Dashboard:
    """How a training job is going: passes, AUC against the best possible, loss, speed."""
    j = JOB_LABEL
    auc = "streamrec_api_pass_auc"
    gap = f'{auc}{{kind="best", {_JOB}}} - ignoring(kind) {auc}{{kind="%s", {_JOB}}}'
    panels: list[Panel] = [
        _stat(
            "Passes done",
            "none",
            [(f"sum(streamrec_api_passes_done_total{{{_JOB}}})", "passes")],
            "Passes reported done since the API started.",
        ),
        _stat(
            "Predict AUC (last pass)",
            "none",
            [(f'{auc}{{kind="predict", {_JOB}}}', f"{{{{{j}}}}}")],
            "AUC of the last pass, measured before training on it.",
        ),
        _stat(
            "AUC gap to best possible (last pass)",
            "none",
            [(gap % "predict", f"{{{{{j}}}}}")],
            "Best possible AUC (the data's own labels) minus predict AUC.",
        ),
        _stat(
            "Train samples/s",
            "ops",
            [(_rate("streamrec_trainer_samples_total", selector='phase="train"'), "samples/s")],
            "Samples trained per second, all ranks.",
        ),
        _series(
            "Passes",
            "none",
            [
                (_increase("streamrec_api_passes_done_total", j, _JOB), f"done {{{{{j}}}}}"),
                (
                    _increase("streamrec_api_passes_handed_out_total", j, _JOB),
                    f"handed out {{{{{j}}}}}",
                ),
                (
                    _increase("streamrec_api_passes_requeued_total", j, _JOB),
                    f"requeued {{{{{j}}}}}",
                ),
            ],
            "Passes per rate window: handed out to trainer groups, reported done, requeued.",
            min_value=0,
        ),
        _series(
            "AUC per pass",
            "none",
            [(f'{auc}{{kind=~"predict|train|best", {_JOB}}}', f"{{{{{j}}}}} {{{{kind}}}}")],
            "Predict AUC (before training on the pass), train AUC, and the best possible.",
        ),
        _series(
            "AUC gap to best possible",
            "none",
            [
                (gap % "predict", f"predict {{{{{j}}}}}"),
                (gap % "train", f"train {{{{{j}}}}}"),
            ],
            "Best possible AUC minus the model's AUC; shrinks as the model learns.",
        ),
        _series(
            "Logloss per pass",
            "none",
            [(f"streamrec_api_pass_logloss{{{_JOB}}}", f"{{{{{j}}}}} {{{{kind}}}}")],
            "Mean log loss (nats) of the last finished pass.",
        ),
        _series(
            "Samples/s",
            "ops",
            [
                (_rate("streamrec_trainer_samples_total", "phase"), "trainers {{phase}}"),
                (_rate("streamrec_api_pass_samples_total", j, _JOB), f"reported {{{{{j}}}}}"),
                (
                    "sum(streamrec_trainer_train_samples_per_second)",
                    "last pass (sum of ranks)",
                ),
            ],
            "Trainer sample counters, the samples reported to the API, and the last pass's speed.",
            min_value=0,
        ),
        _series(
            "Pass duration",
            "s",
            [
                *_latency("streamrec_api_pass_seconds", j, _JOB),
                (
                    _rate("streamrec_api_pass_seconds_sum", j, _JOB)
                    + " / "
                    + _rate("streamrec_api_pass_seconds_count", j, _JOB),
                    f"average {{{{{j}}}}}",
                ),
                (_quantile(0.5, "streamrec_trainer_pass_seconds", "rank"), "p50 rank {{rank}}"),
            ],
            "Wall time of a pass as reported to the API, and per trainer rank.",
        ),
        _series(
            "Checkpoints",
            "none",
            [
                (_increase("streamrec_api_checkpoints_total", j, _JOB), f"saved {{{{{j}}}}}"),
                (
                    _increase("streamrec_api_checkpoint_failures_total", j, _JOB),
                    f"failed {{{{{j}}}}}",
                ),
            ],
            "Checkpoints reported by the trainers, and failed saves or checkpoint triggers.",
            min_value=0,
        ),
        _series(
            "Trainer data wait and malformed lines",
            "percentunit",
            [
                (
                    _or_zero(_rate("streamrec_trainer_data_wait_seconds_total", "rank")),
                    "wait rank {{rank}}",
                ),
                (
                    _rate("streamrec_trainer_malformed_lines_total", "rank")
                    + " / "
                    + _rate("streamrec_trainer_samples_total", "rank", 'phase="train"'),
                    "malformed share rank {{rank}}",
                ),
            ],
            "Share of wall time waiting for donefiles (a trainer run on its own; the agent is"
            " handed ready passes), and malformed lines per trained sample.",
            min_value=0,
        ),
    ]
    board = _base(
        "streamrec-job",
        "StreamRec / Job overview",
        "Passes, AUC per pass against the best possible, logloss, throughput, pass duration.",
        job_variable=True,
    )
    for panel in panels:
        board.with_panel(panel)
    return board


def embedding_store() -> dashboard.Dashboard:
    """The parameter server: rows and memory, cache, pull/push latency and keys/s, shrink."""
    p = "streamrec_embedding_store"
    hits, misses = f"{p}_cache_hits_total", f"{p}_cache_misses_total"
    hit_rate = f"{_rate(hits, 'table')} / ({_rate(hits, 'table')} + {_rate(misses, 'table')})"
    panels: list[Panel] = [
        _stat("Rows", "short", [(f"sum({p}_rows)", "rows")], "Rows over every shard and table."),
        _stat(
            "Memory used (resident / limit)",
            "percentunit",
            [(f"max({p}_resident_bytes / {p}_memory_limit_bytes)", "fullest shard")],
            "Resident memory of the fullest shard against its memory limit.",
        ),
        _stat(
            "Cache hit rate",
            "percentunit",
            [(f"min({p}_cache_hit_ratio)", "lowest table")],
            "Lookups served from the RAM cache (ssd tier), lowest over tables and shards.",
        ),
        _stat(
            "Keys/s",
            "ops",
            [(f"{_rate(f'{p}_pull_keys_total')} + {_rate(f'{p}_push_keys_total')}", "keys/s")],
            "Keys pulled plus keys pushed per second, all shards.",
        ),
        _series(
            "Rows per table and tier",
            "short",
            [(f"sum by (table, tier) ({p}_rows)", "{{table}} {{tier}}")],
            "Rows held per table and tier, summed over shards.",
            min_value=0,
        ),
        _series(
            "Memory",
            "bytes",
            [
                (f"sum by (shard, tier) ({p}_tier_bytes)", "{{shard}} {{tier}} tier"),
                (f"sum by (shard) ({p}_resident_bytes)", "{{shard}} resident"),
                (f"sum by (shard) ({p}_memory_limit_bytes)", "{{shard}} limit"),
            ],
            "Bytes per tier, the process's resident memory, and the shard's memory limit.",
            min_value=0,
        ),
        _series(
            "Cache hit rate",
            "percentunit",
            [
                (f"{p}_cache_hit_ratio", "{{shard}} {{table}} (since start)"),
                (hit_rate, "{{table}} (rate window)"),
            ],
            "Share of ssd-tier lookups served from RAM: the store's ratio and the counters'.",
        ),
        _series(
            "Keys/s",
            "ops",
            [
                (_rate(f"{p}_pull_keys_total", "table"), "pull {{table}}"),
                (_rate(f"{p}_push_keys_total", "table"), "push {{table}}"),
                (_rate(f"{p}_optimizer_steps_total", "table"), "optimizer steps {{table}}"),
            ],
            "Keys pulled and pushed per second (and fused optimizer steps), per table.",
            min_value=0,
        ),
        _series(
            "Pull latency",
            "s",
            _latency(f"{p}_pull_seconds", "table"),
            "Time of a pull inside the store, per table.",
        ),
        _series(
            "Push latency",
            "s",
            _latency(f"{p}_push_seconds", "table"),
            "Time of a push (optimizer update) inside the store, per table.",
        ),
        _series(
            "Request latency p99 by op",
            "s",
            [(_quantile(0.99, f"{p}_request_seconds", "op"), "p99 {{op}}")],
            "Time to serve one request, by op.",
        ),
        _series(
            "Request errors",
            "ops",
            [(_or_zero(_rate(f"{p}_request_errors_total", "op, code")), "{{op}} {{code}}")],
            "Requests answered with an error, by op and code.",
            min_value=0,
        ),
        _series(
            "Shrink and admission",
            "ops",
            [
                (_rate(f"{p}_rows_deleted_total", "table"), "deleted {{table}}"),
                (_rate(f"{p}_rows_created_total", "table"), "created {{table}}"),
                (_rate(f"{p}_rows_refused_total", "table"), "refused {{table}}"),
            ],
            "Rows deleted by shrink, created by first use, refused by admission, per second.",
            min_value=0,
        ),
        _series(
            "Checkpoint events",
            "none",
            [
                (_or_zero(_increase(f"{p}_save_seconds_count", "mode")), "save {{mode}}"),
                (_increase(f"{p}_load_seconds_count"), "load"),
            ],
            "Saves by mode (checkpoint, base, delta, batch) and loads per rate window.",
            min_value=0,
        ),
        _series(
            "Save time p99",
            "s",
            [(_or_zero(_quantile(0.99, f"{p}_save_seconds", "mode")), "{{mode}}")],
            "Time to save, by mode (0 until the first save).",
        ),
    ]
    board = _base(
        "streamrec-embedding-store",
        "StreamRec / Embedding store",
        "Rows per table and tier, memory, cache hit rate, pull/push latency and keys/s, "
        "shrink and checkpoints.",
        job_variable=False,
    )
    for panel in panels:
        board.with_panel(panel)
    return board


def sampler() -> dashboard.Dashboard:
    """The node-local negative sampler: throughput, latency, table size, errors."""
    p = "streamrec_sampler"
    panels: list[Panel] = [
        _stat(
            "Negatives/s",
            "ops",
            [(_rate(f"{p}_negatives_sampled_total"), "negatives/s")],
            "Negative ids returned per second, all samplers.",
        ),
        _stat(
            "Request latency p99",
            "s",
            [(_quantile(0.99, f"{p}_request_seconds"), "p99")],
            "99th percentile of the time to serve a request, all ops.",
        ),
        _stat(
            "Table rows",
            "short",
            [(f"max({p}_table_rows)", "rows")],
            "Rows of the loaded negative table.",
        ),
        _stat(
            "Table categories",
            "short",
            [(f"max({p}_table_categories)", "categories")],
            "Categories with at least one item of positive weight.",
        ),
        _series(
            "Negatives/s",
            "ops",
            [
                (_rate(f"{p}_negatives_sampled_total"), "sampled"),
                (_rate(f"{p}_unfilled_negatives_total"), "unfilled (missing id)"),
            ],
            "Negative ids returned, and slots left to missing_id (category unknown or small).",
            min_value=0,
        ),
        _series(
            "Requests/s by op",
            "ops",
            [(_rate(f"{p}_requests_total", "op"), "{{op}}")],
            "Requests served per second, by op.",
            min_value=0,
        ),
        _series(
            "Request latency",
            "s",
            _latency(f"{p}_request_seconds", "op"),
            "Time to serve a request, p50 and p99 by op.",
        ),
        _series(
            "Errors/s",
            "ops",
            [(_or_zero(_rate(f"{p}_errors_total", "op, code")), "{{op}} {{code}}")],
            "Requests answered with an error, by op and code.",
            min_value=0,
        ),
        _series(
            "Table size",
            "short",
            [
                (f"max({p}_table_rows)", "rows"),
                (f"max({p}_table_categories)", "categories"),
            ],
            "Rows and categories of the loaded negative table.",
            min_value=0,
        ),
        _series(
            "Table reloads",
            "none",
            [(_increase(f"{p}_reloads_total"), "reloads")],
            "Tables loaded successfully per rate window.",
            min_value=0,
        ),
        _series(
            "Table reload time p99",
            "s",
            [(_quantile(0.99, f"{p}_reload_seconds"), "p99")],
            "Time to validate and build a negative table.",
        ),
    ]
    board = _base(
        "streamrec-sampler",
        "StreamRec / Sampler",
        "Negatives/s, request latency by op, negative table size, errors.",
        job_variable=False,
    )
    for panel in panels:
        board.with_panel(panel)
    return board


def control_plane() -> dashboard.Dashboard:
    """The REST API and its scheduler: requests, errors, Redis, queues, trainer heartbeats."""
    j = JOB_LABEL
    p = "streamrec_api"
    panels: list[Panel] = [
        _stat(
            "Redis up",
            "bool",
            [(f"min({p}_redis_up)", "redis")],
            "1 when the API's last Redis call (scheduler tick) succeeded.",
        ),
        _stat(
            "Scheduler leader",
            "short",
            [(f"sum({p}_scheduler_leader)", "leaders")],
            "APIs holding the scheduler lease (1 expected).",
        ),
        _stat(
            "5xx rate",
            "percentunit",
            [
                (
                    _or_zero(_rate(f"{p}_requests_total", selector='status=~"5.."'))
                    + f" / {_rate(f'{p}_requests_total')}",
                    "5xx share",
                )
            ],
            "Share of requests answered with a server error.",
        ),
        _stat(
            "Oldest trainer heartbeat",
            "s",
            [(_or_zero(f"max({p}_trainer_heartbeat_age_seconds{{{_JOB}}})"), "age")],
            "Seconds since the quietest running job's trainer group sent a heartbeat.",
        ),
        _series(
            "Requests/s by route and status",
            "reqps",
            [(_rate(f"{p}_requests_total", "route, status"), "{{route}} {{status}}")],
            "HTTP requests per second by route template and status.",
            min_value=0,
        ),
        _series(
            "Errors/s",
            "ops",
            [
                (_or_zero(_rate(f"{p}_requests_total", "route", 'status=~"5.."')), "5xx {{route}}"),
                (_or_zero(_rate(f"{p}_requests_total", "route", 'status=~"4.."')), "4xx {{route}}"),
                (_rate(f"{p}_redis_errors_total"), "redis errors"),
            ],
            "Server errors and client errors by route, and failed Redis calls.",
            min_value=0,
        ),
        _series(
            "Request latency",
            "s",
            _latency(f"{p}_request_seconds", "route"),
            "HTTP request latency, p50 and p99 by route.",
        ),
        _series(
            "Redis up and scheduler leader",
            "short",
            [
                (f"min({p}_redis_up)", "redis up"),
                (f"sum({p}_scheduler_leader)", "leaders"),
            ],
            "Whether Redis answers, and how many APIs hold the scheduler lease.",
            min_value=0,
        ),
        _series(
            "Work queue depth",
            "short",
            [(_or_zero(f"sum by ({j}) ({p}_work_queue_depth{{{_JOB}}})"), f"{{{{{j}}}}}")],
            "Passes scheduled but not yet taken by a trainer group.",
            min_value=0,
        ),
        _series(
            "Jobs by state",
            "short",
            [(f"sum by (state) ({p}_jobs)", "{{state}}")],
            "Jobs per state.",
            min_value=0,
        ),
        _series(
            "Passes handed out and requeued",
            "none",
            [
                (
                    _increase(f"{p}_passes_handed_out_total", j, _JOB),
                    f"handed out {{{{{j}}}}}",
                ),
                (
                    _increase(f"{p}_passes_requeued_total", j, _JOB),
                    f"requeued {{{{{j}}}}}",
                ),
            ],
            "Passes per rate window put on a job's work stream, and handed out again.",
            min_value=0,
        ),
        _series(
            "Trainer heartbeats",
            "s",
            [
                (
                    _or_zero(f"max by ({j}) ({p}_trainer_heartbeat_age_seconds{{{_JOB}}})"),
                    f"heartbeat age {{{{{j}}}}}",
                ),
                (
                    _or_zero(f"max by ({j}) ({p}_trainer_progress_age_seconds{{{_JOB}}})"),
                    f"progress age {{{{{j}}}}}",
                ),
            ],
            "Seconds since each running job's trainer group sent a heartbeat / made progress.",
            min_value=0,
        ),
        _series(
            "Trainer groups dead",
            "none",
            [(_increase(f"{p}_trainer_groups_dead_total", j, _JOB), f"{{{{{j}}}}}")],
            "Trainer groups found dead (heartbeat expired with a pass in flight).",
            min_value=0,
        ),
        _series(
            "Scheduler tick latency",
            "s",
            _latency(f"{p}_scheduler_tick_seconds"),
            "Duration of one scheduler tick, p50 and p99.",
        ),
        _series(
            "Triggers",
            "none",
            [(_increase(f"{p}_triggers_total", "kind, state"), "{{kind}} {{state}}")],
            "Trigger outcomes per rate window, by kind and state.",
            min_value=0,
        ),
        _series(
            "Targets up",
            "short",
            [('sum by (job) (up{job=~"streamrec-.*"})', "{{job}}")],
            "Scrape targets answering, per service.",
            min_value=0,
        ),
    ]
    board = _base(
        "streamrec-control-plane",
        "StreamRec / Control plane",
        "Requests, errors, Redis, work queues, requeues, trainer heartbeats, scheduler.",
        job_variable=True,
    )
    for panel in panels:
        board.with_panel(panel)
    return board


#: Every dashboard by name: ``<name>.json`` under :data:`DASHBOARD_DIR`; the name is its uid.
DASHBOARDS: dict[str, Callable[[], dashboard.Dashboard]] = {
    "streamrec-job": job_overview,
    "streamrec-embedding-store": embedding_store,
    "streamrec-sampler": sampler,
    "streamrec-control-plane": control_plane,
}


def to_json(board: dashboard.Dashboard) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model, panels numbered in order."""
    model = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    for number, panel in enumerate(model.get("panels", []), start=1):
        panel["id"] = number
    return model


def render(name: str) -> str:
    """The committed text of dashboard ``name``: sorted keys, two-space indent, final newline."""
    return json.dumps(to_json(DASHBOARDS[name]()), indent=2, sort_keys=True) + "\n"


def write_generated(root: Path, check: bool) -> list[Path]:
    """Writes every dashboard's JSON under ``root`` (or with ``check`` compares it).

    Raises:
        StaleGeneratedFile: ``check`` and a committed file is missing or differs.
    """
    return [
        write_or_check(root / DASHBOARD_DIR / f"{name}.json", render(name), check)
        for name in DASHBOARDS
    ]


def queries(dashboard_json: dict[str, Any]) -> list[str]:
    """Every PromQL expression of a dashboard's panels (rows' nested panels included)."""
    exprs: list[str] = []
    for panel in dashboard_json.get("panels") or []:
        nested = panel.get("panels") or []
        for p in [panel, *nested]:
            exprs.extend(t["expr"] for t in p.get("targets") or [] if t.get("expr"))
    return exprs
