"""Prometheus helpers shared by the services.

Each service declares its metrics in its own ``metrics.py`` (names
``streamrec_<service>_..._<unit>``) and calls :func:`serve_metrics` to expose them.
"""

from __future__ import annotations

import prometheus_client

#: Request latency, 100 us to 60 s: RPCs, HTTP requests, one scheduler tick.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

#: Durations of whole units of work, 100 ms to 6 h: a pass (hourly data: minutes to hours),
#: a checkpoint save or load (many GiB over NFS), a sampler table reload. LATENCY_BUCKETS
#: would put them all in +Inf past 60 s. Up to 60 s its steps, then minutes to hours.
DURATION_BUCKETS = LATENCY_BUCKETS[LATENCY_BUCKETS.index(0.1) :] + (
    120.0,
    300.0,
    600.0,
    1200.0,
    1800.0,
    3600.0,
    7200.0,
    14400.0,
    21600.0,
)


def serve_metrics(
    port: int, host: str = "127.0.0.1", registry: prometheus_client.CollectorRegistry | None = None
) -> int:
    """Serves /metrics on ``host:port`` in a daemon thread; port 0 picks a free port.

    Args:
        registry: what to serve; the process-wide default registry when None.

    Returns:
        The bound port.
    """
    server, _thread = prometheus_client.start_http_server(
        port, addr=host, registry=registry or prometheus_client.REGISTRY
    )
    return int(server.server_port)
