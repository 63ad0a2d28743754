"""The exception hierarchy shared by every service.

Each error has a ``code`` that travels in wire error replies, so a client re-raises the
same meaning it was sent. Services subclass :class:`StreamRecError` in their own
``errors.py``.
"""

from __future__ import annotations


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
