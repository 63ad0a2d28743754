"""The FastAPI application factory.

``create_app(settings)`` builds an app whose Redis client, repository, metrics and scheduler
live on ``app.state``; nothing is read or connected at import time. Routes are under ``/v1``;
``/healthz``, ``/readyz``, ``/metrics`` and the OpenAPI UI (``/docs``) are at the root.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from streamrec import __version__
from streamrec.api.config import Settings
from streamrec.api.errors import (
    MAX_PROBLEMS,
    ApiError,
    InvalidTransition,
    SpecInvalid,
    bounded_detail,
)
from streamrec.api.metrics import ApiMetrics
from streamrec.api.public import ErrorPublic
from streamrec.api.repo import Repo, connect
from streamrec.api.routes import events, health, jobs, passes, triggers
from streamrec.api.scheduler import Scheduler
from streamrec.errors import quote

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorPublic, "description": what}
    for code, what in [
        (400, "malformed body"),
        (401, "no bearer token, or a wrong one"),
        (404, "unknown job"),
        (409, "not allowed in the job's current state, or its model path is another job's"),
        (413, "body too large"),
        (503, "Redis unavailable (Retry-After says when to ask again)"),
    ]
}

#: Seconds a client is told to wait (``Retry-After``) when Redis is down: a restart's order.
REDIS_RETRY_AFTER_S = "2"


#: What each insecure setting leaves open (the start-up warning says it).
INSECURE_WHY = {
    "auth_disabled": "--auth-disabled: anyone who reaches this port may create and run jobs",
    "redis_no_password": (
        "Redis without a password (no STREAMREC_REDIS_PASSWORD_FILE): anyone who reaches it "
        "may rewrite jobs and their trainer configs"
    ),
}


class BodyLimit:
    """ASGI middleware refusing bodies above ``max_bytes`` with 413 before the app reads them.

    A declared Content-Length is checked up front; a body without one is read up to the cap
    and replayed to the app.
    """

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await self._refuse(send, 400, f"bad Content-Length {length[:32]!r}")
                return
            if declared > self.max_bytes:
                await self._refuse(
                    send,
                    413,
                    f"body of {declared} bytes exceeds the limit of {self.max_bytes} bytes",
                )
                return
            await self.app(scope, receive, send)
            return
        if scope.get("method") in ("GET", "HEAD", "DELETE", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send, 413, f"body exceeds the limit of {self.max_bytes} bytes")
                return
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(send: Send, status: int, detail: str) -> None:
        resp = JSONResponse(
            status_code=status, content={"detail": detail, "code": "body_too_large"}
        )
        await resp({"type": "http"}, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


def route_template(request: Request) -> str:
    """The matched route's template with its router prefix (``/v1/jobs/{job_id}``).

    Depending on the FastAPI version the route's ``path`` may lack the include prefix; the
    prefix is then the leading segments of the real path (path parameters never hold '/').
    """
    route = request.scope.get("route")
    template = getattr(route, "path", None)
    if not template:
        return "<unmatched>"
    real = request.url.path.rstrip("/").split("/")
    tmpl = template.rstrip("/").split("/")
    extra = len(real) - len(tmpl)
    return "/".join(real[: extra + 1] + tmpl[1:]) if extra > 0 else template


def create_app(settings: Settings, start_scheduler: bool | None = None) -> FastAPI:
    """Builds the app. The scheduler thread runs when ``settings.scheduler_enabled``."""
    metrics = ApiMetrics()
    for setting in settings.insecure():
        metrics.insecure.labels(setting).set(1)
        log.warning("INSECURE: %s (%s)", setting, INSECURE_WHY[setting])
    run_scheduler = settings.scheduler_enabled if start_scheduler is None else start_scheduler

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        scheduler = None
        if run_scheduler:
            scheduler = Scheduler(app.state.repo, settings, metrics)
            scheduler.start()
        app.state.scheduler = scheduler
        try:
            yield
        finally:
            if scheduler is not None:
                scheduler.stop()
            app.state.repo.close()

    app = FastAPI(
        title="StreamRec control plane",
        version=__version__,
        lifespan=lifespan,
        description="Jobs, pass scheduling, checkpoint/export triggers and events of "
        "StreamRec streaming DLRM training. State lives in Redis.",
    )
    app.state.settings = settings
    app.state.repo = Repo(connect(settings), settings.policy())
    app.state.metrics = metrics

    for router in (jobs.router, passes.router, triggers.router, events.router):
        app.include_router(router, prefix="/v1", responses=ERROR_RESPONSES)
    app.include_router(health.router)

    @app.get(
        "/metrics",
        tags=["health"],
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
    )
    def prometheus_metrics() -> Response:
        """Prometheus text format (this API's registry)."""
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = exc.errors()  # the input echoed bounded: errors.bounded_detail
        shown = jsonable_encoder(problems[:MAX_PROBLEMS])
        return JSONResponse(
            status_code=422, content={"detail": bounded_detail(shown, len(problems))}
        )

    @app.exception_handler(SpecInvalid)
    async def _spec_invalid(request: Request, exc: SpecInvalid) -> JSONResponse:
        return JSONResponse(
            status_code=422,
            content={
                "detail": bounded_detail(
                    [
                        {
                            "loc": ["body", *field.split(".")],
                            "msg": f"{field}: {msg}",
                            "type": code,
                            "input": (
                                value
                                if isinstance(value, str | int | float | bool)
                                else quote(value)
                            ),
                        }
                        for (field, msg, value), code in zip(exc.errors, exc.codes, strict=True)
                    ]
                )
            },
        )

    @app.exception_handler(InvalidTransition)
    async def _conflict(request: Request, exc: InvalidTransition) -> JSONResponse:
        return JSONResponse(
            status_code=409, content={"detail": str(exc), "code": exc.code, "state": exc.current}
        )

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(status_code=exc.status, content={"detail": str(exc), "code": exc.code})

    @app.exception_handler(redis.RedisError)
    async def _redis_down(request: Request, exc: redis.RedisError) -> JSONResponse:
        metrics.redis_errors.inc()
        log.warning("redis error on %s %s: %s", request.method, request.url.path, exc)
        return JSONResponse(
            status_code=503,
            content={
                "detail": f"state store unavailable: {type(exc).__name__}: {exc}",
                "code": "unavailable",
            },
            headers={"Retry-After": REDIS_RETRY_AFTER_S},  # a Redis restart takes seconds
        )

    @app.middleware("http")
    async def _observe(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        t0 = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            name = route_template(request)
            metrics.requests.labels(request.method, name, str(status)).inc()
            metrics.request_seconds.labels(request.method, name).observe(time.perf_counter() - t0)

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    return app
