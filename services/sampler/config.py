"""Sampler configuration: the server's settings and where the node-local socket lives.

Endpoint resolution (client and server alike): an explicit argument, else the
``STREAMREC_SAMPLER_ENDPOINT`` environment variable, else an ipc socket in a per-user
runtime directory (``$XDG_RUNTIME_DIR/streamrec`` or ``/tmp/streamrec-<uid>``).
``tcp://HOST:PORT`` works too (the Kubernetes DaemonSet uses it).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import Field, field_validator
from streamrec.auth import load_token, runtime_dir
from streamrec.config import StrictConfig
from streamrec.errors import BadRequest
from streamrec.wire import DEFAULT_MAX_MESSAGE_BYTES

ENDPOINT_ENV = "STREAMREC_SAMPLER_ENDPOINT"
#: Overrides the idle exit of a server a client auto-starts (seconds, 0: never).
IDLE_EXIT_ENV = "STREAMREC_SAMPLER_IDLE_EXIT_S"
#: A server a client auto-started exits after this long without a request: a node's
#: sampler must not outlive its clients for ever (a standalone one has no idle exit).
AUTO_START_IDLE_EXIT_S = 600.0
#: The item id given to a positive whose id is not in the negative table (the seed's
#: ``murmurhash(0)``, RecIS's ``default_value``): ``valid_sample_ids`` and ``pack_feature``.
MISSING_ITEM_ID = 5533571732986600803
_ENDPOINT_RE = re.compile(r"^(ipc://.+|tcp://[^:/]+:(\d+|\*))$")


def default_endpoint() -> str:
    env = os.environ.get(ENDPOINT_ENV)
    if env:
        return check_endpoint(env, source=ENDPOINT_ENV)
    return f"ipc://{runtime_dir() / 'sampler.sock'}"


def check_endpoint(endpoint: str, source: str = "endpoint") -> str:
    if not isinstance(endpoint, str) or not _ENDPOINT_RE.match(endpoint):
        raise BadRequest(f"{source}: expected ipc://PATH or tcp://HOST:PORT, got {endpoint!r}")
    return endpoint


def lock_base(endpoint: str) -> Path:
    """Prefix of the lock and log files that belong to ``endpoint``.

    ``<socket path>`` for ipc (next to the socket), ``<runtime dir>/sampler-<host>-<port>``
    for tcp.
    """
    if endpoint.startswith("ipc://"):
        return Path(endpoint[len("ipc://") :])
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", endpoint[len("tcp://") :])
    return runtime_dir() / f"sampler-{safe}"


class ServerConfig(StrictConfig):
    """Settings of ``streamrec-sampler serve``.

    Attributes:
        endpoint: where to bind (ipc://PATH or tcp://HOST:PORT).
        metrics_port: serve Prometheus /metrics on this port (0 picks one), ``None``: off.
        metrics_host: address of the metrics listener.
        workers: request threads. The default, 1, serves one request at a time with every
            core in its sampling kernel; on 2 cores with 2 clients that gave 106-121 M
            negatives/s against 60-107 M with 2 workers sharing the cores (bench/sampler.py).
            Raise it when requests are small and many.
        max_message_bytes: cap on one request (a 1M-row table is ~40 MB).
        max_rounds: rejection rounds for conflicting draws before the exact fallback.
        max_negatives: cap on ``sum(sample_cnts)`` of one request.
        seed: seed of the server's random streams (``None``: from the OS).
        auth_token_file: the peer token file requests must match (``None``:
            ``$STREAMREC_AUTH_TOKEN_FILE``, else the per-user file; see :mod:`streamrec.auth`).
        insecure_no_auth: serve requests without a token (local development only).
        idle_exit_s: exit after this long with no client connected and no request (0: never,
            the default; a client that auto-starts a server asks for
            ``AUTO_START_IDLE_EXIT_S``).
    """

    endpoint: str = Field(default_factory=default_endpoint)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    workers: int = Field(default=1, ge=1, le=64)
    max_message_bytes: int = Field(default=DEFAULT_MAX_MESSAGE_BYTES, ge=4096)
    max_rounds: int = Field(default=16, ge=1, le=1000)
    max_negatives: int = Field(default=50_000_000, ge=1)
    seed: int | None = Field(default=None, ge=0)
    auth_token_file: str | None = None
    insecure_no_auth: bool = False
    idle_exit_s: float = Field(default=0.0, ge=0.0)

    def auth_token(self) -> str | None:
        """The token requests must carry; None with ``insecure_no_auth`` (no check)."""
        return None if self.insecure_no_auth else load_token(self.auth_token_file)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if not _ENDPOINT_RE.match(value):
            raise ValueError("expected ipc://PATH or tcp://HOST:PORT")
        return value
