"""Errors of the control plane; each maps to one HTTP status in app.py."""

from __future__ import annotations

from collections.abc import Sequence

from streamrec.errors import (
    QUOTE_LIMIT,
    BadRequest,
    NotFound,
    ServiceUnavailable,
    StreamRecError,
    quote,
)

#: One problem of a job spec: (dotted field, message, value, code).
Problem = tuple[str, str, object, str]


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


class ModelPathTaken(ApiError):
    """A job's ``checkpoint.model_save_path`` is, contains or lies inside another live job's
    (HTTP 409): two jobs writing one model directory would overwrite each other's model."""

    code = "model_path_taken"
    status = 409

    def __init__(self, path: str, relation: str, other_id: str, other_path: str) -> None:
        super().__init__(
            f"checkpoint.model_save_path {quote(path)} {relation} the model path "
            f"{quote(other_path)} of job {other_id!r}: one model path, one job (delete that "
            f"job or choose another path)"
        )
        self.path = path
        self.other_id = other_id
        self.other_path = other_path


class SpecInvalid(ApiError, BadRequest):
    """A job spec that parses but cannot run (HTTP 422, in FastAPI's validation shape).

    Args:
        errors: ``(field path, message, value)`` per problem, the path dotted from the body,
            or ``(field path, message, value, code)`` where a problem has a code of its own
            (``path_refused``, ``endpoint_refused``; the default is this class's ``code``).
    """

    code = "invalid_spec"
    status = 422

    def __init__(self, errors: Sequence[tuple[str, str, object] | Problem]) -> None:
        self.errors: list[tuple[str, str, object]] = [(e[0], e[1], e[2]) for e in errors]
        #: each problem's code, in the order of ``errors``
        self.codes: list[str] = [e[3] if len(e) > 3 else self.code for e in errors]  # type: ignore[misc]
        text = "; ".join(f"{f}: {m}" for f, m, _ in self.errors)
        super().__init__(text if len(text) <= 4 * QUOTE_LIMIT else quote(text, 4 * QUOTE_LIMIT))

    def problems(self) -> list[Problem]:
        """``(field, message, value, code)`` per problem (to merge into another SpecInvalid)."""
        return [(f, m, v, c) for (f, m, v), c in zip(self.errors, self.codes, strict=True)]


class StateUnavailable(ApiError, ServiceUnavailable):
    """Redis cannot be reached (HTTP 503)."""

    code = "unavailable"
    status = 503
