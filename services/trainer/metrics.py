"""Prometheus metrics of the trainer (``streamrec_trainer_*``), one registry per process.

Each rank serves its own /metrics (``runner.metrics_port``); the ``rank`` label tells the
series apart when several ranks share a Prometheus job.

What the process does is here; what a pass scored (AUC, best AUC, logloss) has one metric
name, the control plane's ``streamrec_api_pass_auc{job,kind}`` / ``streamrec_api_pass_logloss``
(the trainer reports it there), and is in ``passes.jsonl`` for a trainer run on its own.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from streamrec.metrics import DURATION_BUCKETS, serve_metrics

SAMPLES = Counter(
    "streamrec_trainer_samples_total",
    "Samples processed, by phase (predict, train).",
    ["rank", "phase"],
)
MALFORMED = Counter(
    "streamrec_trainer_malformed_lines_total", "Malformed data lines counted and skipped.", ["rank"]
)
PASSES = Counter("streamrec_trainer_passes_total", "Passes finished.", ["rank"])
THROUGHPUT = Gauge(
    "streamrec_trainer_train_samples_per_second", "Training throughput of the last pass.", ["rank"]
)
PASS_SECONDS = Histogram(
    "streamrec_trainer_pass_seconds",
    "Wall time of a whole pass.",
    ["rank"],
    buckets=DURATION_BUCKETS,
)
SAVE_SECONDS = Histogram(
    "streamrec_trainer_save_seconds",
    "Time to save a model, by mode (checkpoint, base, delta, batch).",
    ["rank", "mode"],
    buckets=DURATION_BUCKETS,
)
WAIT_SECONDS = Counter(
    "streamrec_trainer_data_wait_seconds_total", "Time spent waiting for donefiles.", ["rank"]
)
CURRENT_DAY = Gauge(
    "streamrec_trainer_pass_day", "Day (YYYYMMDD) of the last finished pass.", ["rank"]
)
CURRENT_PASS = Gauge("streamrec_trainer_pass_id", "Pass id of the last finished pass.", ["rank"])
SAMPLER_RECOVERIES = Counter(
    "streamrec_trainer_sampler_recoveries_total",
    "Negative-sampler servers found dead or replaced mid-pass and ridden out (table put back, "
    "the call sent again).",
    ["rank"],
)
SAMPLER_RECOVERY_SECONDS = Histogram(
    "streamrec_trainer_sampler_recovery_seconds",
    "From the sampler found gone to the call sent again to its successor.",
    ["rank"],
    buckets=DURATION_BUCKETS,
)


def observe_pass(rank: str, rec: dict[str, Any], malformed: int, predicted: bool) -> None:
    """Counts one finished pass (``rec``: OnlineTrainer.run_pass's record) for ``rank``.

    Args:
        malformed: this rank's malformed lines (the record sums every rank's).
        predicted: whether the pass was predicted before it was trained.
    """
    SAMPLES.labels(rank, "train").inc(rec["samples"])
    if predicted:
        SAMPLES.labels(rank, "predict").inc(rec["samples"])
    MALFORMED.labels(rank).inc(malformed)
    PASSES.labels(rank).inc()
    if rec["samples_per_second"] is not None:
        THROUGHPUT.labels(rank).set(rec["samples_per_second"])
    PASS_SECONDS.labels(rank).observe(rec["seconds"])
    CURRENT_DAY.labels(rank).set(int(rec["day"]))
    CURRENT_PASS.labels(rank).set(rec["pass_id"])


def serve_rank_metrics(port: int, host: str, rank: int) -> int:
    """Serves this process's /metrics on ``port`` + its local rank (one port per rank of a
    node; a rank per pod, as in Kubernetes, serves ``port``); ``port`` 0 takes a free one.
    Returns the port bound."""
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    return serve_metrics(port + local_rank if port else 0, host)
