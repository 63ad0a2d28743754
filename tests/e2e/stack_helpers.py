"""What the end-to-end tests share: `streamrec up` started as a child, its output followed
line by line, and the run's children looked up in ``RUN/stack.json``."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from servers import wait_for
from streamrec.process import descendants, spawn

STREAMREC = str(Path(sys.executable).parent / "streamrec")


class Output:
    """Collects a child's stdout lines in a thread, so the test can wait for one."""

    def __init__(self, proc: subprocess.Popen, stderr: Path) -> None:
        self.stderr = stderr
        self.lines: list[str] = []
        self.times: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self.times.append(time.strftime("%T"))

    def wait_for(self, needle: str, timeout: float) -> str:
        """The first output line holding ``needle``, within ``timeout`` seconds."""
        return wait_for(
            lambda: next((line for line in list(self.lines) if needle in line), None),
            timeout,
            0.1,
            what=f"{needle!r} in the output",
            detail=lambda: (
                "\n".join(self.lines[-60:])
                + f"\nstderr:\n{self.stderr.read_text(errors='replace')}"
            ),
        )

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def stderr_log(run: Path) -> Path:
    return run.parent / "up.stderr"


def start_stack(
    run: Path, *flags: str, split_interval: int = 240, rate: float = 0.3
) -> subprocess.Popen:
    """`streamrec up` on one day of small planted data (4 slots) in ``run``, ``flags`` added."""
    common = [
        "--run-dir",
        str(run),
        "--days",
        "1",
        "--split-interval",
        str(split_interval),
        "--slots",
        "4",
        "--rate",
        str(rate),
    ]
    # stderr (``streamrec up: <error>``) beside the run; SIGTERM to it if this test dies
    return spawn(
        [STREAMREC, "up", *common, *flags],
        log=stderr_log(run),
        die_with_parent=True,
        stdout_pipe=True,
    )


def child_pids(run: Path) -> dict[str, int]:
    """The pid of each child of the stack now (a restart changes it)."""
    state = json.loads((run / "stack.json").read_text())
    return {name: info["pid"] for name, info in state["children"].items()}


def trainer_rank(trainers_pid: int, rank: int) -> int:
    """The pid of rank ``rank`` of the torchrun group ``trainers_pid``."""
    for pid in descendants(trainers_pid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"streamrec.trainer.agent" in cmd and f"RANK={rank}".encode() in env:
            return pid
    raise AssertionError(f"no rank {rank} under torchrun {trainers_pid}")
