"""Who serves a sampler endpoint: the process named by the lock file beside its socket.

A server writes its pid into ``<socket>.lock`` and holds that file locked while it runs
(:meth:`~streamrec.sampler.server.SamplerServer.start`). A client that cannot solve a problem
itself (a server that refuses its peer token: started by someone else, with another token)
says which process that is and how to stop it, instead of an anonymous refusal.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from streamrec.sampler.config import lock_base


def _flag(args: list[str], name: str) -> str | None:
    """The value after ``name`` in a command line, if any."""
    for i, arg in enumerate(args[:-1]):
        if arg == name:
            return args[i + 1]
    return None


def holder_pid(endpoint: str) -> int | None:
    """The pid written in ``endpoint``'s lock file, if that process still runs here."""
    lock = Path(f"{lock_base(endpoint)}.lock")
    try:
        pid = int(lock.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def describe_holder(endpoint: str) -> str:
    """A sentence naming the process that serves ``endpoint`` on this machine (pid, command
    line, since when, the token file it was given) and how to stop it; or saying that the
    lock file names none (a server on another host, or one started elsewhere)."""
    lock = Path(f"{lock_base(endpoint)}.lock")
    pid = holder_pid(endpoint)
    if pid is None:
        return (
            f"no process of this machine is named in {lock} (the server runs on another "
            f"host or as another user): ask whoever runs it which token it serves"
        )
    args: list[str] = []
    with contextlib.suppress(OSError):
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        args = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    since = ""
    with contextlib.suppress(OSError):
        started = lock.stat().st_mtime  # written when the server took the lock
        since = (
            f"; it runs since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))} "
            f"({(time.time() - started) / 60:.0f} min)"
        )
    token = _flag(args, "--auth-token-file")
    serves = f", serving the token of {token}" if token else ""
    command = " ".join(args)[:200] or "?"
    # the pid and how to stop it first: a job's error keeps only its first few hundred chars
    return (
        f"it is pid {pid}{serves}: stop it with `kill {pid}` (it removes its socket; the next "
        f"client starts one with its own token) or give this client its token file{since}; "
        f"its command: {command}"
    )
