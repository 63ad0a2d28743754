"""The run state ``streamrec up`` keeps in ``RUN/stack.json``, and ``streamrec down``, which
stops what it records.

The file holds the launcher's pid (``supervisor_pid``), the Redis, API and sampler addresses,
the token files, the job id, every /metrics address by Prometheus job name (``metrics``), the
Prometheus URL (``prometheus_url``, None without ``--prometheus``) and, per child, its pid and
command name. It is replaced atomically on every change and removed when the stack is down.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from streamrec.process import pid_alive

STATE_FILE = "stack.json"


def write_state(run: Path, state: dict[str, Any]) -> None:
    tmp = run / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(run / STATE_FILE)


def read_state(run: Path) -> dict[str, Any] | None:
    """The recorded state, None when there is none (or it cannot be read)."""
    try:
        return json.loads((run / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def remove_state(run: Path) -> None:
    with contextlib.suppress(OSError):
        (run / STATE_FILE).unlink()


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def stack_down(run: Path, out: TextIO = sys.stdout, timeout_s: float = 60) -> int:
    """Stops the stack recorded in ``run``: its supervisor first (which stops its children in
    order), then any child it left. Only a process that still runs the recorded command is
    signalled, never a reused pid. Returns the exit code of ``streamrec down``."""
    state = read_state(run)
    if state is None:
        print(f"no stack recorded in {run}", file=out)
        return 0
    sup = state.get("supervisor_pid")
    if pid_alive(sup) and "streamrec" in _cmdline(sup):
        os.kill(sup, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pid_alive(sup) and time.monotonic() < deadline:
            time.sleep(0.2)
    for name, info in (state.get("children") or {}).items():
        pid = info.get("pid")
        if pid_alive(pid) and info.get("cmd", "\0") in _cmdline(pid):
            # each child leads a process group of its own (streamrec.process.spawn)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
            print(f"stopped {name} (pid {pid})", file=out)
    remove_state(run)
    print(f"stack in {run} is down", file=out)
    return 0
