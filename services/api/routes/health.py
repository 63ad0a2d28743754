"""/healthz (the process answers) and /readyz (Redis answers)."""

from __future__ import annotations

import redis
from fastapi import APIRouter
from fastapi.responses import JSONResponse
from streamrec.api.deps import MetricsDep, RepoDep
from streamrec.api.public import HealthPublic

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> HealthPublic:
    return HealthPublic(status="ok")


@router.get("/readyz", responses={503: {"model": HealthPublic}})
def readyz(repo: RepoDep, metrics: MetricsDep) -> HealthPublic:
    """200 when Redis answers a PING within the Redis timeout, else 503 (never hangs)."""
    try:
        repo.ping()
    except (redis.ConnectionError, redis.TimeoutError):
        metrics.redis_errors.inc()
        return JSONResponse(
            status_code=503,  # type: ignore[return-value]
            content={"status": "unavailable", "redis": False},
        )
    return HealthPublic(status="ok", redis=True)
