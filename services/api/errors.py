"""Errors of the control plane; each maps to one HTTP status in app.py. A 422 echoes what
the client sent, bounded (:func:`bounded_detail`): whatever the body, its answer stays small.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from streamrec.errors import (
    QUOTE_LIMIT,
    BadRequest,
    NotFound,
    StreamRecError,
    quote,
)

#: One problem of a job spec: (dotted field, message, value, code).
Problem = tuple[str, str, object, str]

#: A 422 lists at most this many problems; one more entry counts the rest.
MAX_PROBLEMS = 50
#: An echoed value (a problem's ``input``, each ``ctx`` value) whose JSON is longer than this
#: many characters comes back as a string of its first ones, then its full length.
ECHO_LIMIT = QUOTE_LIMIT


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


def json_safe(value: Any) -> Any:
    """``value`` made fit to answer with: what a client sent comes back in a 422 (``input``),
    and JSON text may carry what a response cannot (NaN, infinities, lone surrogates).

    Non-finite floats become their name (``"nan"``); a string that is not UTF-8 or is longer
    than :data:`~streamrec.errors.QUOTE_LIMIT` becomes its bounded ``repr`` (ASCII-escaped).
    """
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return quote(value)
        return value if len(value) <= QUOTE_LIMIT else quote(value)
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def echo(value: Any, limit: int = ECHO_LIMIT) -> Any:
    """What a 422 shows of a value the client sent: the value itself (:func:`json_safe`)
    when its JSON takes at most ``limit`` characters, else a string of those first
    characters, ``...`` and the JSON's full length.

    Example:
        >>> echo([{"name": f"f{i}"} for i in range(1000)], limit=30)
        '[{"name":"f0"},{"name":"f1"},{... (15891 chars of JSON)'
    """
    safe = json_safe(value)
    if isinstance(safe, str):  # json_safe bounds a string already
        return safe
    text = json.dumps(safe, ensure_ascii=False, separators=(",", ":"))
    return safe if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars of JSON)"


def bounded_detail(
    problems: list[dict[str, Any]], total: int | None = None
) -> list[dict[str, Any]]:
    """A 422's ``detail`` (FastAPI's shape: ``loc``, ``msg``, ``type``, ``input``, ``ctx``
    per problem) bounded whatever the body held: every ``input`` and ``ctx`` value
    :func:`echo`-ed, every other string (a message, a key of ``loc``) :func:`json_safe`'s,
    the ``loc`` (the field's path) kept, at most :data:`MAX_PROBLEMS` problems and then one
    entry counting the rest: no string longer than about ``QUOTE_LIMIT``.

    Args:
        problems: the problems, JSON-encodable (``jsonable_encoder``'s); may be only the
            first ones of ``total``.
        total: how many problems there were (None: ``len(problems)``).
    """
    total = len(problems) if total is None else total
    out = []
    for p in problems[:MAX_PROBLEMS]:
        entry = {k: json_safe(v) for k, v in p.items() if k not in ("input", "ctx")}
        if "input" in p:
            entry["input"] = echo(p["input"])
        ctx = p.get("ctx")
        if isinstance(ctx, dict):
            entry["ctx"] = {str(json_safe(k)): echo(v) for k, v in ctx.items()}
        elif "ctx" in p:
            entry["ctx"] = echo(ctx)
        out.append(entry)
    if total > MAX_PROBLEMS:
        out.append(
            {
                "loc": ["body"],
                "msg": f"{total - MAX_PROBLEMS} more problem(s) not shown (the first "
                f"{MAX_PROBLEMS} are)",
                "type": "too_many_problems",
                "input": None,
            }
        )
    return out
