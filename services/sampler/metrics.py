"""Prometheus metrics of the sampler server (all ``streamrec_sampler_...``), in the process's
default registry (which carries the process collector's ``process_*`` series too)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram
from streamrec.metrics import DURATION_BUCKETS, LATENCY_BUCKETS

REQUESTS = Counter("streamrec_sampler_requests_total", "Requests served, by op.", ["op"])
ERRORS = Counter(
    "streamrec_sampler_errors_total",
    "Requests answered with an error, by op and error code.",
    ["op", "code"],
)
REQUEST_SECONDS = Histogram(
    "streamrec_sampler_request_seconds", "Time to serve a request.", ["op"], buckets=LATENCY_BUCKETS
)
NEGATIVES = Counter("streamrec_sampler_negatives_sampled_total", "Negative ids returned.")
UNFILLED = Counter(
    "streamrec_sampler_unfilled_negatives_total",
    "Negative slots given missing_id (category unknown or too small).",
)
TABLE_ROWS = Gauge("streamrec_sampler_table_rows", "Rows of the loaded negative table.")
TABLE_CATEGORIES = Gauge(
    "streamrec_sampler_table_categories", "Categories with at least one item of positive weight."
)
RELOADS = Counter("streamrec_sampler_reloads_total", "Tables loaded successfully.")
RELOAD_SECONDS = Histogram(
    "streamrec_sampler_reload_seconds",
    "Time to validate and build a table.",
    buckets=DURATION_BUCKETS,
)


def start(ops: Iterable[str]) -> None:
    """Creates every op's request series at 0 (``unknown`` too), so ``rate()`` and the latency
    alert have a series before the first request of an op."""
    for op in (*ops, "unknown"):
        REQUESTS.labels(op)
        REQUEST_SECONDS.labels(op)


def observe_request(op: str, seconds: float, code: str | None) -> None:
    """Counts one request (``op`` must be a known op or ``"unknown"``: bounded labels)."""
    REQUESTS.labels(op).inc()
    REQUEST_SECONDS.labels(op).observe(seconds)
    if code is not None:
        ERRORS.labels(op, code).inc()
