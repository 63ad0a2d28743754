"""A rank's liveness under the control plane: the group's heartbeat (rank 0), a watchdog
that ends a rank stuck without progress, and SIGTERM (the rank ends, its pass released).
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from streamrec.control.channel import TrainerChannel

log = logging.getLogger("streamrec.trainer.agent")

#: Exit code of a rank whose watchdog saw no progress for --stuck-timeout-s.
STUCK_EXIT = 4


#: How often a rank checks that its launcher is still its parent.
ORPHAN_CHECK_S = 0.2


class Heartbeat:
    """Renews the group's heartbeat every ``ttl/3`` seconds in a daemon thread.

    torchrun starts each rank in its own session, so a launcher killed outright leaves its
    ranks running; a rank whose parent changed (orphaned) stops beating and exits, so the
    group is seen dead and its pass handed to the next group.
    """

    def __init__(
        self,
        channel: TrainerChannel,
        ttl_s: float,
        progress: Callable[[], dict[str, Any]] | None = None,
        **info: Any,
    ) -> None:
        self.channel = channel
        self.period = ttl_s / 3
        self.info = info
        #: The group's progress, sent with every beat (the API tells stuck from alive).
        self.progress = progress or dict
        self.parent = os.getppid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-heartbeat", daemon=True)

    def start(self) -> None:
        self.channel.heartbeat(**self.info, **self.progress())
        self._thread.start()

    def _run(self) -> None:
        next_beat = time.monotonic() + self.period
        # the parent is looked at every ORPHAN_CHECK_S, not only at each beat: an orphaned
        # group must stop within a pass or so, not go on training for a third of the TTL
        while not self._stop.wait(min(ORPHAN_CHECK_S, self.period)):
            if os.getppid() != self.parent:
                log.error("launcher (pid %d) is gone: this rank exits", self.parent)
                os._exit(3)
            if time.monotonic() < next_beat:
                continue
            next_beat = time.monotonic() + self.period
            try:
                self.channel.heartbeat(**self.info, **self.progress())
            except Exception as exc:  # Redis blip: the next beat may succeed
                log.warning("heartbeat failed: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class Watchdog:
    """Exits the process (code 4) when the rank has been working without progress for
    ``timeout_s``: a rank stuck outside any bounded call (a collective is bounded by
    ``distributed.timeout_s``) must not hold its group forever; its supervisor (torchrun,
    Kubernetes) restarts the group and the API hands the pass out again.

    ``busy_since()`` returns when the current work started (None while idle) and
    ``progress_at()`` the last progress; both ``time.monotonic()``.
    """

    def __init__(
        self,
        timeout_s: float,
        busy_since: Callable[[], float | None],
        progress_at: Callable[[], float],
        limit_now: Callable[[], float] | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.busy_since = busy_since
        self.progress_at = progress_at
        #: the limit in the current phase (a checkpoint save or load has its own); None:
        #: always ``timeout_s``
        self.limit_now = limit_now
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            since = self.busy_since()
            if since is None:
                continue
            quiet = time.monotonic() - max(since, self.progress_at())
            limit = self.timeout_s if self.limit_now is None else self.limit_now()
            if quiet > limit:
                log.error(
                    "no progress for %.0f s (stuck timeout %.0f s): this rank exits",
                    quiet,
                    limit,
                )
                logging.shutdown()
                os._exit(STUCK_EXIT)

    def stop(self) -> None:
        self._stop.set()


#: Set by SIGTERM: the rank was told to end (its pass is released, not a crash's to requeue).
TERMINATING = threading.Event()


#: Seconds a rank told to end has to end cleanly before it exits outright.
TERMINATE_GRACE_S = 10.0
#: The wakeup socket pair of :func:`handle_sigterm`.
_WAKEUP: list[Any] = []


def terminate(signum: int, _frame: Any) -> None:
    """The SIGTERM handler: the rank ends cleanly (``Agent.close`` releases its pass)."""
    TERMINATING.set()
    log.warning("SIGTERM: this rank ends (the pass in hand is released)")
    raise SystemExit(128 + signum)


def enable_fault_stacks() -> None:
    """A C++ abort (std::terminate, a segfault) prints every thread's Python stack on
    stderr; a no-op where stderr is no file (a test capturing it)."""
    with contextlib.suppress(io.UnsupportedOperation, AttributeError, ValueError):
        faulthandler.enable()


def handle_sigterm(grace_s: float = TERMINATE_GRACE_S) -> None:
    """Installs :func:`terminate`, and a thread that ends the rank outright ``grace_s``
    after a SIGTERM it has not ended by. Python runs a signal handler on the main thread
    between bytecodes only: a rank blocked in native code (joining a process group whose
    peer died, an all-reduce) would otherwise hold torchrun's restart for its whole stop
    timeout (30 s) or its own (60 s). The C-level handler writes to the wakeup fd at once,
    whatever the main thread is doing. Call from the main thread."""
    import signal
    import socket

    read_end, write_end = socket.socketpair()
    write_end.setblocking(False)
    signal.set_wakeup_fd(write_end.fileno(), warn_on_full_buffer=False)
    signal.signal(signal.SIGTERM, terminate)

    _WAKEUP.extend((read_end, write_end))  # open for the process's life

    def watch() -> None:
        while (got := read_end.recv(1)) != bytes([signal.SIGTERM]):
            if not got:
                return
        time.sleep(grace_s)
        log.warning("SIGTERM %.0f s ago and this rank still runs: it exits now", grace_s)
        logging.shutdown()
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="sigterm-grace", daemon=True).start()
