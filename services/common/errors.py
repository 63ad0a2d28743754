"""The exception hierarchy shared by every service.

Each error has a ``code`` that travels in wire error replies, so a client re-raises the
same meaning it was sent. Services subclass :class:`StreamRecError` in their own
``errors.py``.
"""

from __future__ import annotations

import reprlib


class StreamRecError(Exception):
    """Base of every StreamRec error."""

    code = "error"


class BadRequest(StreamRecError, ValueError):
    """The caller sent something invalid; the message names the field and the value."""

    code = "bad_request"


class NotFound(StreamRecError, KeyError):
    """A named thing (table, column, job) does not exist."""

    code = "not_found"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class RpcTimeout(StreamRecError, TimeoutError):
    """No reply within the request's timeout."""

    code = "timeout"


class ServiceUnavailable(StreamRecError, ConnectionError):
    """The service is not running or cannot be reached."""

    code = "unavailable"


class RemoteError(StreamRecError):
    """An error reply from a server: ``code`` and message as the server sent them."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.remote_message = message


class PathRefused(BadRequest):
    """A path outside the roots a service is confined to (or one it cannot use at all)."""

    code = "path_refused"


class EndpointRefused(BadRequest):
    """An endpoint (a store shard, a sampler, a serving Redis) that a job names and the
    deployment did not allow: nothing is sent to it."""

    code = "endpoint_refused"


class CheckpointError(StreamRecError):
    """A checkpoint, a store save or an exported model is missing, incomplete or
    inconsistent (a missing file, a bad checksum, a manifest of another format)."""

    code = "bad_checkpoint"


class Unauthorized(StreamRecError):
    """A request without the peer token, or with a wrong one; the op did not run."""

    code = "unauthorized"


#: How much of a bad value an error message quotes (:func:`quote`).
QUOTE_LIMIT = 200


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` bounded: at most ``limit`` characters of it, then its full size.

    Error messages echo bad input to name it; a peer's 50 MB op name must not come back
    whole. Strings and bytes keep their first ``limit`` characters (``'abc...' (N chars)``);
    other values are cut by :mod:`reprlib`, which also bounds the work on huge containers.

    Example:
        >>> quote("x" * 1000, limit=5)
        "'xxxxx'... (1000 chars)"
    """
    if isinstance(value, str | bytes | bytearray):
        if len(value) <= limit:
            return repr(value)
        unit = "chars" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}... ({len(value)} {unit})"
    short = _REPR.repr(value)
    return short if len(short) <= limit else f"{short[:limit]}... (cut)"


def _bounded_repr() -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxstring = QUOTE_LIMIT
    r.maxother = QUOTE_LIMIT
    r.maxlevel = 3
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = 10
    return r


_REPR = _bounded_repr()
