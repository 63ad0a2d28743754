"""Errors of the sampler service; each code travels in wire error replies."""

from __future__ import annotations

from streamrec.errors import BadRequest, ServiceUnavailable, StreamRecError


class SamplerError(StreamRecError):
    """Base of the sampler's own errors."""

    code = "sampler_error"


class BadTable(BadRequest):
    """A table given to ``reload`` is invalid; the message names the column and the value."""

    code = "bad_table"


class NoTable(SamplerError):
    """Sampling or lookup before any table was loaded."""

    code = "no_table"


class TagMismatch(SamplerError, ValueError):
    """The client's tag names differ from those of the table loaded in the server."""

    code = "tag_mismatch"


class SamplerUnavailable(ServiceUnavailable):
    """The sampler server is not running, died, or does not answer."""

    code = "unavailable"


class SamplerRefused(SamplerUnavailable):
    """The sampler at the endpoint refused this client's peer token (it was started with
    another one); the message names the process that holds the endpoint and how to stop it."""

    code = "unauthorized"
