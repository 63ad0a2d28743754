"""The peer token of the ZeroMQ data plane: where it comes from and how it is checked.

Every request a store shard or the sampler serves carries a shared token in its header
(``"auth"``, see :mod:`streamrec.wire`); the server compares it in constant time before the
op runs and answers ``unauthorized`` otherwise. The token is read from a file, so a
Kubernetes Secret can be mounted as it. Which file, in order:

1. the explicit argument (``--auth-token-file``, ``auth_token_file=``);
2. ``$STREAMREC_AUTH_TOKEN_FILE``;
3. a per-user file ``<runtime dir>/auth-token`` (mode 0600 in a 0700 directory), created with
   a random token by the first process that needs it. Processes of one user on one machine
   (tests, benchmarks, the sampler auto-started by its first client) so agree on a token
   without any setting; a peer on another machine or of another user does not have it.

A server runs without auth only when started with ``--insecure-no-auth`` (local
development); there is no implicit way to turn it off.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import tempfile
from pathlib import Path

from streamrec.errors import BadRequest, ServiceUnavailable

TOKEN_FILE_ENV = "STREAMREC_AUTH_TOKEN_FILE"
#: A token shorter than this (after stripping whitespace) is refused.
MIN_TOKEN_CHARS = 16
#: A token file larger than this is refused (it is a secret, not a document).
MAX_TOKEN_BYTES = 4096


def runtime_dir() -> Path:
    """A private per-user directory for sockets, lock files, logs and the default token."""
    fallback = Path(tempfile.gettempdir()) / f"streamrec-{os.getuid()}"
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    for base in ([Path(xdg) / "streamrec"] if xdg else []) + [fallback]:
        try:
            base.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            continue  # e.g. an XDG_RUNTIME_DIR we may not write: use /tmp
        if os.access(base, os.W_OK):
            return base
    raise ServiceUnavailable(
        f"no writable runtime directory (tried $XDG_RUNTIME_DIR/streamrec and {fallback})"
    )


def write_token_file(path: str | os.PathLike[str]) -> Path:
    """Writes a new random token to ``path`` (mode 0600) unless a file is already there.

    Racing processes agree: the token is written to a private temporary file that is then
    hard-linked into place, so ``path`` appears complete or not at all and the first link wins.
    """
    target = Path(path)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".token-")
    try:
        os.write(fd, (secrets.token_hex(32) + "\n").encode())
        os.close(fd)
        with contextlib.suppress(FileExistsError):  # another process won: its token stands
            os.link(tmp, target)
    finally:
        os.unlink(tmp)
    return target


def token_file(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The token file to use: ``explicit``, else ``$STREAMREC_AUTH_TOKEN_FILE``, else the
    per-user default (created when missing)."""
    if explicit:
        return Path(explicit)
    env = os.environ.get(TOKEN_FILE_ENV)
    if env:
        return Path(env)
    return write_token_file(runtime_dir() / "auth-token")


def read_token(path: str | os.PathLike[str]) -> str:
    """The token held by ``path``, whitespace stripped.

    Raises:
        BadRequest: the file cannot be read, is too large, or holds fewer than
            ``MIN_TOKEN_CHARS`` characters or non-ASCII text (naming the file).
    """
    p = Path(path)
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_TOKEN_BYTES + 1)
    except OSError as exc:
        raise BadRequest(f"auth token file {str(p)!r}: cannot read: {exc.strerror}") from None
    if len(raw) > MAX_TOKEN_BYTES:
        raise BadRequest(f"auth token file {str(p)!r}: larger than {MAX_TOKEN_BYTES} bytes")
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise BadRequest(f"auth token file {str(p)!r}: not ASCII text") from None
    if len(token) < MIN_TOKEN_CHARS:
        raise BadRequest(
            f"auth token file {str(p)!r}: the token has {len(token)} characters, at least "
            f"{MIN_TOKEN_CHARS} are needed"
        )
    return token


def load_token(explicit: str | os.PathLike[str] | None = None) -> str:
    """The token from :func:`token_file` (``explicit``, env, per-user default)."""
    return read_token(token_file(explicit))


def token_matches(expected: str, got: object) -> bool:
    """Whether a request's ``got`` is the ``expected`` token, in constant time."""
    if not isinstance(got, str):
        return False
    return hmac.compare_digest(expected.encode(), got.encode("utf-8", "surrogatepass"))
