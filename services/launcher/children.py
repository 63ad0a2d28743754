"""A child process the stack supervises: started, polled, restarted, stopped."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from streamrec.process import spawn, stop_process


@dataclass
class Child:
    """A service of the stack, run by :func:`streamrec.process.spawn` (a session of its own,
    stdout and stderr appended to ``log``).

    Args:
        name: the name in the stack's output and in ``stack.json`` (``store-0``, ``api``).
        args: the command line; the stack replaces it before a restart where it must change.
        log: the log file, kept across restarts.
        restartable: whether its death may be answered by a restart (its state lives
            elsewhere or comes back) or ends the run.
        env: variables added to the launcher's environment.
    """

    name: str
    args: list[str]
    log: Path
    restartable: bool
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    restarts: int = 0
    #: the log's size when the current process started: where its own output begins
    log_offset: int = 0
    #: exited with 0 where that is its job done (datagen, trainers): no longer watched
    done: bool = False

    def start(self) -> None:
        try:
            self.log_offset = self.log.stat().st_size
        except OSError:
            self.log_offset = 0
        # the stack's main thread starts every child: if `streamrec up` is killed outright
        # (no tear-down), its children get SIGTERM instead of running on as orphans
        self.proc = spawn(self.args, log=self.log, env=self.env, die_with_parent=True)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def exited(self) -> int | None:
        """The exit code, None while it runs (or before it started)."""
        return None if self.proc is None else self.proc.poll()

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM to its process group, SIGKILL after ``timeout_s`` (and to every descendant:
        torchrun puts each rank in a session of its own)."""
        if self.proc is not None:
            stop_process(self.proc, timeout_s)

    def output(self) -> str:
        """What the current process wrote to the log (not its predecessors' lines)."""
        try:
            with self.log.open("rb") as f:
                f.seek(self.log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def tail(self, n: int = 15) -> str:
        """The last ``n`` lines of its log."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""
