"""Prometheus metrics of the trainer (``streamrec_trainer_*``), one registry per process.

Each rank serves its own /metrics (``runner.metrics_port``); the ``rank`` label tells the
series apart when several ranks share a Prometheus job.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram
from streamrec.metrics import LATENCY_BUCKETS

SAMPLES = Counter(
    "streamrec_trainer_samples_total",
    "Samples processed, by phase (predict, train).",
    ["rank", "phase"],
)
MALFORMED = Counter(
    "streamrec_trainer_malformed_lines_total", "Malformed data lines counted and skipped.", ["rank"]
)
PASSES = Counter("streamrec_trainer_passes_total", "Passes finished.", ["rank"])
PASS_AUC = Gauge(
    "streamrec_trainer_pass_auc_ratio",
    "AUC of the last pass, by phase (predict = before training on it).",
    ["rank", "phase"],
)
PASS_BEST_AUC = Gauge(
    "streamrec_trainer_pass_best_auc_ratio",
    "Best possible AUC of the last pass (planted stream only).",
    ["rank"],
)
PASS_LOGLOSS = Gauge(
    "streamrec_trainer_pass_logloss_nats",
    "Mean log loss of the last pass, by phase.",
    ["rank", "phase"],
)
THROUGHPUT = Gauge(
    "streamrec_trainer_train_samples_per_second", "Training throughput of the last pass.", ["rank"]
)
PASS_SECONDS = Histogram(
    "streamrec_trainer_pass_seconds",
    "Wall time of a whole pass.",
    ["rank"],
    buckets=LATENCY_BUCKETS,
)
SAVE_SECONDS = Histogram(
    "streamrec_trainer_save_seconds",
    "Time to save a model, by mode (checkpoint, base, delta, batch).",
    ["rank", "mode"],
    buckets=LATENCY_BUCKETS,
)
WAIT_SECONDS = Counter(
    "streamrec_trainer_data_wait_seconds_total", "Time spent waiting for donefiles.", ["rank"]
)
CURRENT_DAY = Gauge(
    "streamrec_trainer_pass_day", "Day (YYYYMMDD) of the last finished pass.", ["rank"]
)
CURRENT_PASS = Gauge("streamrec_trainer_pass_id", "Pass id of the last finished pass.", ["rank"])
