"""StreamRec's Grafana dashboards, built with Grafana's typed builders (grafana-foundation-sdk).

The JSON under ``deploy/k8s/base/dashboards/`` is generated from this module and committed
(kustomize turns it into ConfigMaps for the Grafana sidecar); a test regenerates it and
compares, and each dashboard's description says so. Every query names only metrics that a
``services/*/metrics.py`` defines (and DCGM's, in panels that show a fallback without it).

Each dashboard has a Prometheus ``datasource`` variable that every panel uses; the job
dashboards a ``job`` variable listing the StreamRec job ids (the API's ``job_id`` label).
The building blocks are in :mod:`streamrec.observability.panels`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from streamrec.observability.generated import write_or_check
from streamrec.observability.panels import (
    HOUR,
    JOB,
    JOB_LABEL,
    NEUTRAL,
    Panel,
    board,
    increase,
    latency,
    leader,
    or_zero,
    quantile,
    rate,
    series,
    single,
)
from streamrec.observability.service_dashboards import control_plane, embedding_store, sampler

#: Where the generated JSON lives, relative to the repository root.
DASHBOARD_DIR = Path("deploy/k8s/base/dashboards")

#: Shown where the data holds no label-derived best AUC (real data, as opposed to generated).
NO_BEST = "no best AUC known (real data)"


def job_overview() -> dashboard.Dashboard:
    """How a training job is going: passes, AUC, CTR, loss, speed, lag behind its data."""
    j = JOB_LABEL
    auc = f"streamrec_api_pass_auc{{kind=%r, {JOB}}}".replace("'", '"')
    # only where the data holds a best (generated data): no series, "no value", elsewhere
    gap = f"{leader(auc % 'best')} - ignoring(kind) {leader(auc % '%s')}"
    lag = leader(f"streamrec_api_pass_lag_seconds{{{JOB}}}")
    wait = leader(f"streamrec_api_data_wait_seconds{{{JOB}}}")
    age = f"time() - max by ({j}) (streamrec_api_last_checkpoint_timestamp_seconds{{{JOB}}})"
    panels: list[Panel] = [
        single(
            "Passes done",
            "none",
            [(f"sum(streamrec_api_passes_done_total{{{JOB}}})", "passes")],
            "Passes reported done since the API started.",
            NEUTRAL,
        ),
        single(
            "Predict AUC (last pass)",
            "none",
            [(leader(auc % "predict"), f"{{{{{j}}}}}")],
            "AUC of the last pass, measured before training on it (0.5: no better than chance).",
            [(None, "red"), (0.6, "yellow"), (0.7, "green")],
        ),
        single(
            "AUC gap to best possible (last pass)",
            "none",
            [(gap % "predict", f"{{{{{j}}}}}")],
            "Best possible AUC (the generated data's own labels) minus predict AUC; real data"
            " has no best.",
            [(None, "green"), (0.02, "yellow"), (0.05, "red")],
            no_value=NO_BEST,
        ),
        single(
            "Pass lag behind the data",
            "s",
            [(f"max({lag})", "lag")],
            "Data time from the pass in training to the newest pass whose data has landed"
            " (one pass interval when training keeps up).",
            [(None, "green"), (3 * HOUR, "yellow"), (6 * HOUR, "red")],
        ),
        single(
            "Last checkpoint age",
            "s",
            [(f"max({age})", "age")],
            "Time since the job's last checkpoint: what a restart would train again.",
            [(None, "green"), (3 * HOUR, "yellow"), (6 * HOUR, "red")],
            no_value="no checkpoint yet",
        ),
        single(
            "Train samples/s",
            "ops",
            [(rate("streamrec_trainer_samples_total", selector='phase="train"'), "samples/s")],
            "Samples trained per second, all ranks (0 between passes).",
            NEUTRAL,
        ),
        series(
            "Passes",
            "none",
            [
                (increase("streamrec_api_passes_done_total", j, JOB), f"done {{{{{j}}}}}"),
                (
                    increase("streamrec_api_passes_handed_out_total", j, JOB),
                    f"handed out {{{{{j}}}}}",
                ),
                (
                    increase("streamrec_api_passes_requeued_total", j, JOB),
                    f"requeued {{{{{j}}}}}",
                ),
            ],
            "Passes per rate window: handed out to trainer groups, reported done, requeued.",
            min_value=0,
        ),
        series(
            "AUC per pass",
            "none",
            [
                (
                    leader(f'streamrec_api_pass_auc{{kind=~"predict|train|best", {JOB}}}'),
                    f"{{{{{j}}}}} {{{{kind}}}}",
                )
            ],
            "Predict AUC (before training on the pass), train AUC, and the best possible"
            " (generated data only).",
        ),
        series(
            "AUC gap to best possible",
            "none",
            [
                (gap % "predict", f"predict {{{{{j}}}}}"),
                (gap % "train", f"train {{{{{j}}}}}"),
            ],
            "Best possible AUC minus the model's AUC; shrinks as the model learns. Only where"
            " the data holds a best (generated data).",
            no_value=NO_BEST,
        ),
        series(
            "Predicted vs actual CTR per pass",
            "percentunit",
            [(leader(f"streamrec_api_pass_ctr{{{JOB}}}"), f"{{{{{j}}}}} {{{{kind}}}}")],
            "The model's mean prediction against the labels' click-through rate on each pass's"
            " training samples: apart, the model is miscalibrated or the feed changed.",
            min_value=0,
        ),
        series(
            "Logloss per pass",
            "none",
            [(leader(f"streamrec_api_pass_logloss{{{JOB}}}"), f"{{{{{j}}}}} {{{{kind}}}}")],
            "Mean log loss (nats) of the last finished pass.",
        ),
        series(
            "Training against its data",
            "s",
            [(lag, f"pass lag {{{{{j}}}}}"), (wait, f"waiting for data {{{{{j}}}}}")],
            "Pass lag: data time from the pass in training to the newest landed; waiting for"
            " data: time the next pass has waited for its donefile.",
            min_value=0,
        ),
        series(
            "Samples/s",
            "ops",
            [
                (rate("streamrec_trainer_samples_total", "phase"), "trainers {{phase}}"),
                (rate("streamrec_api_pass_samples_total", j, JOB), f"reported {{{{{j}}}}}"),
                (
                    "sum(streamrec_trainer_train_samples_per_second)",
                    "last pass (sum of ranks)",
                ),
            ],
            "Trainer sample counters, the samples reported to the API, and the last pass's speed.",
            min_value=0,
        ),
        series(
            "Pass duration",
            "s",
            [
                *latency("streamrec_api_pass_seconds", j, JOB),
                (
                    rate("streamrec_api_pass_seconds_sum", j, JOB)
                    + " / "
                    + rate("streamrec_api_pass_seconds_count", j, JOB),
                    f"average {{{{{j}}}}}",
                ),
                (quantile(0.5, "streamrec_trainer_pass_seconds", "rank"), "p50 rank {{rank}}"),
            ],
            "Wall time of a pass as reported to the API, and per trainer rank (buckets to 6 h).",
        ),
        series(
            "Checkpoints",
            "none",
            [
                (increase("streamrec_api_checkpoints_total", j, JOB), f"saved {{{{{j}}}}}"),
                (
                    increase("streamrec_api_checkpoint_failures_total", j, JOB),
                    f"failed {{{{{j}}}}}",
                ),
                (f"max by ({j}) ({age})", f"age {{{{{j}}}}} (s)"),
            ],
            "Checkpoints reported by the trainers, failed saves, and the last one's age.",
            min_value=0,
        ),
        series(
            "Trainer group restarts",
            "none",
            [
                (increase("streamrec_api_group_restarts_total", j, JOB), f"restarts {{{{{j}}}}}"),
                (
                    increase("streamrec_api_trainer_groups_dead_total", j, JOB),
                    f"found dead {{{{{j}}}}}",
                ),
            ],
            "Infrastructure restarts of the job's group (killed, evicted, stuck) per window.",
            min_value=0,
        ),
        series(
            "Trainer data wait and malformed lines",
            "percentunit",
            [
                (
                    or_zero(rate("streamrec_trainer_data_wait_seconds_total", "rank")),
                    "wait rank {{rank}}",
                ),
                (
                    rate("streamrec_trainer_malformed_lines_total", "rank")
                    + " / "
                    + rate("streamrec_trainer_samples_total", "rank", 'phase="train"'),
                    "malformed share rank {{rank}}",
                ),
            ],
            "Share of wall time waiting for donefiles (a trainer run on its own; the agent is"
            " handed ready passes), and malformed lines per trained sample.",
            min_value=0,
        ),
    ]
    return board(
        "streamrec-job",
        "StreamRec / Job overview",
        "Passes, AUC per pass, predicted against actual CTR, logloss, throughput, pass"
        " duration, lag behind the data, checkpoints.",
        True,
        panels,
    )


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
