"""Prometheus metrics of the sampler server (all ``streamrec_sampler_...``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram
from streamrec.metrics import LATENCY_BUCKETS

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
    buckets=LATENCY_BUCKETS,
)


def observe_request(op: str, seconds: float, code: str | None) -> None:
    """Counts one request (``op`` must be a known op or ``"unknown"``: bounded labels)."""
    REQUESTS.labels(op).inc()
    REQUEST_SECONDS.labels(op).observe(seconds)
    if code is not None:
        ERRORS.labels(op, code).inc()
