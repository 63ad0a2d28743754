"""Errors of the control plane; each maps to one HTTP status in app.py."""

from __future__ import annotations

from streamrec.errors import BadRequest, NotFound, ServiceUnavailable, StreamRecError, quote


class ApiError(StreamRecError):
    """Base of the API's errors."""

    code = "api_error"
    status = 500


class ApiConfigError(ApiError, ValueError):
    """Settings are invalid; the API refuses to start."""

    code = "bad_config"


class JobNotFound(ApiError, NotFound):
    code = "not_found"
    status = 404


class PassNotFound(ApiError, NotFound):
    code = "not_found"
    status = 404


class TriggerNotFound(ApiError, NotFound):
    code = "not_found"
    status = 404


class InvalidTransition(ApiError):
    """A state change the job's state machine does not allow (HTTP 409)."""

    code = "conflict"
    status = 409

    def __init__(self, job_id: str, current: str, action: str) -> None:
        super().__init__(f"job {job_id!r} is {current!r}: cannot {action}")
        self.job_id = job_id
        self.current = current
        self.action = action


class SpecInvalid(ApiError, BadRequest):
    """A job spec that parses but cannot run (HTTP 422, in FastAPI's validation shape).

    Args:
        errors: ``(field path, message, value)`` per problem, the path dotted from the body.
    """

    code = "invalid_spec"
    status = 422

    def __init__(self, errors: list[tuple[str, str, object]]) -> None:
        super().__init__("; ".join(f"{f}: {m}" for f, m, _ in errors))
        self.errors = errors


class PathRefused(SpecInvalid):
    """A path in a job spec lies outside the configured data/model roots (HTTP 422)."""

    code = "path_refused"

    def __init__(self, field: str, value: str, roots: list[str]) -> None:
        super().__init__([(field, f"{value!r} is outside the allowed roots {roots}", value)])
        self.field = field
        self.value = value


class EndpointRefused(SpecInvalid):
    """A store endpoint in a job spec that the deployment did not configure (HTTP 422)."""

    code = "endpoint_refused"

    def __init__(self, field: str, value: str, allowed: list[str]) -> None:
        where = f"one of {allowed}" if allowed else "none (no --store-endpoint is configured)"
        super().__init__(
            [(field, f"{quote(value)} is not an allowed store endpoint: {where}", value)]
        )
        self.field = field
        self.value = value


class StateUnavailable(ApiError, ServiceUnavailable):
    """Redis cannot be reached (HTTP 503)."""

    code = "unavailable"
    status = 503
