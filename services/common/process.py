"""Local child processes: the one way StreamRec starts, watches and stops them.

Used by the one-machine launcher (``streamrec up``), the embedding store's ``LocalShards``,
the sampler's auto-start and the tests. A child runs in a session of its own (so a signal to
its group reaches what it forks, torchrun's ranks included), reads nothing from stdin and
writes stdout and stderr to one log.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TypeGuard

from streamrec.errors import StreamRecError

PR_SET_PDEATHSIG = 1


class SpawnError(StreamRecError):
    """A child process could not be found or started."""

    code = "spawn"


#: where free_port() picks: below Linux's default ephemeral range (32768-60999), from which
#: the kernel takes the local port of every outgoing connection and of every bind to port 0
PICKED_PORTS = range(20000, 32768)
#: a port handed out is not handed out again by this host's free_port() for this long
PORT_HELD_S = 3600.0


def free_port() -> int:
    """A TCP port on 127.0.0.1, free now, for a child to bind later.

    A port the kernel picked (bind to port 0) is an ephemeral one: between the pick and the
    child's bind, any process's outgoing connection may take it as its local port, and the
    child fails with EADDRINUSE (seen in a parallel test run). So the pick is outside that
    range, and a marker file per port (``O_EXCL``, under the temporary directory) keeps two
    callers on this host, in any process, from handing out the same port within an hour.
    """
    held = Path(tempfile.gettempdir()) / f"streamrec-ports-{os.getuid()}"
    held.mkdir(mode=0o700, exist_ok=True)
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.choice(PICKED_PORTS)
        if not claim_marker(held / str(port)):
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    # every try taken: the kernel's pick, as before
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def claim_marker(marker: Path) -> bool:
    """Takes ``marker`` for this caller: new, or left by a caller more than PORT_HELD_S ago."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:
        pass
    try:
        if time.time() - marker.stat().st_mtime < PORT_HELD_S:
            return False
        # stale: of the callers that find it so, the one whose rename succeeds retries
        stale = marker.parent / f"{marker.name}.{os.getpid()}.stale"
        os.rename(marker, stale)
    except OSError:
        return False
    stale.unlink(missing_ok=True)
    return claim_marker(marker)


def bin_path(name: str) -> str:
    """A console script of this environment (beside the running Python), else from PATH."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise SpawnError(f"{name} not found beside {sys.executable} nor on PATH")
    return found


def _die_with_parent(parent: int) -> Callable[[], None]:
    """What the child runs before exec: SIGTERM when the parent thread dies (Linux), so a test
    or benchmark killed hard leaves no child behind. A parent gone before the request took
    effect (the child was reparented) is noticed too."""
    prctl: Callable[..., int] | None = None
    with contextlib.suppress(OSError, AttributeError):
        # looked up here: loading a library in the forked child may deadlock on a lock
        # another thread of the parent held at the fork
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl

    def arm() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def spawn(
    args: list[str],
    log: Path | IO | None = None,
    env: dict[str, str] | None = None,
    die_with_parent: bool = False,
    stdout_pipe: bool = False,
) -> subprocess.Popen:
    """Starts ``args`` in a new session.

    Args:
        args: the command line.
        log: a path (appended to, parents made) or an open file for stdout and stderr;
            None discards them.
        env: variables added to this process's environment.
        die_with_parent: SIGTERM the child when the thread that started it ends.
        stdout_pipe: stdout to a pipe the caller reads (stderr still goes to ``log``).
    """
    full_env = {**os.environ, **(env or {})}
    preexec = _die_with_parent(os.getpid()) if die_with_parent else None
    out_file: IO | None = None
    try:
        if isinstance(log, Path):
            log.parent.mkdir(parents=True, exist_ok=True)
            out_file = log.open("ab")
            sink: IO | int = out_file
        elif log is None:
            sink = subprocess.DEVNULL
        else:
            sink = log
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout_pipe else sink,
            stderr=sink if stdout_pipe or log is not None else subprocess.DEVNULL,
            env=full_env,
            start_new_session=True,
            close_fds=True,
            preexec_fn=preexec,  # noqa: PLW1509 (only prctl, async-signal-safe)
            text=stdout_pipe,
        )
    except OSError as exc:
        raise SpawnError(f"cannot start {args[0]}: {exc}") from exc
    finally:
        if out_file is not None:
            out_file.close()  # the child holds its own descriptor


def pid_alive(pid: object) -> TypeGuard[int]:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped by its parent, does not).
    Anything but a positive int (a pid read from a file, say) is not a live pid."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc), children first."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out.extend(kids)
        todo.extend(kids)
    return out


def stop_process(proc: subprocess.Popen | int, timeout_s: float = 10.0) -> None:
    """SIGTERM to the child's process group, then SIGKILL to it and every descendant it
    had when asked to stop (torchrun puts each rank in a session of its own).

    ``proc`` is a Popen of ours or the pid of a process we did not start (then it is
    signalled alone, not its group, and waited for by polling)."""
    pid = proc if isinstance(proc, int) else proc.pid
    if not pid_alive(pid) or (not isinstance(proc, int) and proc.poll() is not None):
        return
    below = descendants(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if isinstance(proc, int):
            os.kill(pid, signal.SIGTERM)
        else:
            os.killpg(pid, signal.SIGTERM)
    if not _wait_gone(proc, timeout_s):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if isinstance(proc, int):
                os.kill(pid, signal.SIGKILL)
            else:
                os.killpg(pid, signal.SIGKILL)
        _wait_gone(proc, 5.0)
    left = [child for child in below if pid_alive(child)]
    for child in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)
    for child in left:  # gone on return: a caller may reuse their ports and files at once
        _wait_gone(child, 5.0)


def _wait_gone(proc: subprocess.Popen | int, timeout_s: float) -> bool:
    if not isinstance(proc, int):
        try:
            proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(proc):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(proc, os.WNOHANG)
            return True
        time.sleep(0.05)
    return False
