"""A client's link to the node's sampler server: find it, start it, call it, survive it.

:class:`ServerLink` is what :class:`~streamrec.sampler.client.LocalRpcDataSampler` talks
through. It finds the server at the endpoint (starting one when none answers and it may: a
lock file makes racing clients start exactly one), sends each call, and when the server dies
or is replaced mid-call it does not give up::

    call ──► reply ─────────────────────────────────────────────► result
      │
      └─ server gone (its process exited, the connection dropped, or it did not answer and
         a ping finds another server_id)
           ├─ wait for a server at the endpoint (start one when auto_start), at most
           │  reconnect_timeout_s
           ├─ it has no table: ``restore()`` (the owner puts its table back, see
           │  LocalRpcDataSampler._restore_table)
           └─ send the call again (at most MAX_RECOVERIES times per call)

A server that refuses this client's peer token is no crash to ride out: it raises
:class:`~streamrec.sampler.errors.SamplerRefused` naming the process that holds the endpoint
(:mod:`.owner`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from streamrec.auth import read_token
from streamrec.errors import RemoteError, RpcTimeout, ServiceUnavailable
from streamrec.process import spawn
from streamrec.sampler.config import lock_base
from streamrec.sampler.errors import SamplerRefused, SamplerUnavailable
from streamrec.sampler.owner import describe_holder
from streamrec.wire import RpcClient

log = logging.getLogger(__name__)

#: Recoveries one call may go through before it raises (a request that kills every server
#: it reaches must not restart them for ever).
MAX_RECOVERIES = 3


class _Lost(Exception):
    """The call's server is gone (or silent): the call may be sent again after recovery."""

    def __init__(self, why: str, silent: bool = False) -> None:
        super().__init__(why)
        self.silent = silent


class ServerLink:
    """One client's connection to the sampler server at ``endpoint``.

    Args:
        endpoint: ipc://PATH or tcp://HOST:PORT (checked by the caller).
        auth_token_file: the peer token file; an auto-started server is given it too.
        auto_start: start a server when none answers.
        timeout_s: how long one request may take.
        start_timeout_s: how long to wait for a starting server.
        reconnect_timeout_s: how long a call waits for a server again after its server
            died or was replaced (0: it raises at once).
        serve_args: ``streamrec-sampler serve`` flags of an auto-started server.
        restore: called after a recovery found a server without a table.
    """

    def __init__(
        self,
        endpoint: str,
        auth_token_file: Path,
        *,
        auto_start: bool,
        timeout_s: float,
        start_timeout_s: float,
        reconnect_timeout_s: float,
        serve_args: Sequence[str],
        restore: Callable[[], None],
    ) -> None:
        self.endpoint = endpoint
        self.auth_token_file = auth_token_file
        self.auto_start = auto_start
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self.serve_args = list(serve_args)
        self.restore = restore
        self._token = read_token(auth_token_file)
        self._proc: subprocess.Popen | None = None
        self._rpc = RpcClient(endpoint, timeout_s=timeout_s, token=self._token)
        self._lock = threading.RLock()  # one call (and recovery) at a time
        #: The server's ``ping`` (pid, hostname, server_id, generation, rows).
        self.server_info: dict[str, Any] = {}
        #: Servers found dead or replaced and come back from, and how long the last took.
        self.recoveries = 0
        self.last_recovery_s = 0.0
        self._restoring = False
        try:
            info = self._try_ping(timeout_s=2.0)
            if info is None:
                if not auto_start:
                    raise SamplerUnavailable(
                        f"no sampler server answers at {endpoint} (auto_start=False)"
                    )
                info = self._start_server()
        except BaseException:
            self._rpc.close()
            raise
        self.server_info = info

    # ---- discovery and start ----------------------------------------------------------

    def _try_ping(self, timeout_s: float) -> dict[str, Any] | None:
        if self.endpoint.startswith("ipc://") and not Path(self.endpoint[6:]).exists():
            return None
        try:
            meta, _ = self._rpc.call("ping", timeout_s=timeout_s)
        except (RpcTimeout, ServiceUnavailable):
            return None
        except RemoteError as exc:
            if exc.code == "unauthorized":
                raise self.refused() from exc
            raise
        return meta

    def refused(self) -> SamplerRefused:
        """The error of a server that refused this client's token, naming who holds it."""
        return SamplerRefused(
            f"the sampler at {self.endpoint} refused this client's peer token "
            f"({self.auth_token_file}); {describe_holder(self.endpoint)}"
        )

    def _server_lock_held(self) -> bool:
        path = Path(f"{lock_base(self.endpoint)}.lock")
        if not path.exists():
            return False
        with open(path, "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
            return False

    def _start_server(self) -> dict[str, Any]:
        base = lock_base(self.endpoint)
        base.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{base}.start", "a+") as start_lock:
            fcntl.flock(start_lock, fcntl.LOCK_EX)  # racing clients queue here
            info = self._try_ping(timeout_s=1.0)
            if info is not None:
                return info  # another client started it while we waited
            if not self._server_lock_held():
                # detached (a session of its own, no death signal): the server outlives this
                # client and serves every later one on the node, until its idle exit
                self._proc = spawn(
                    [
                        sys.executable,
                        "-m",
                        "streamrec.sampler",
                        "serve",
                        "--endpoint",
                        self.endpoint,
                        "--auth-token-file",
                        str(self.auth_token_file),
                        *self.serve_args,
                    ],
                    log=Path(f"{base}.log"),
                )
            return self._wait_for_server(self.start_timeout_s)

    def _wait_for_server(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise SamplerUnavailable(
                    f"the sampler server started for {self.endpoint} exited with code "
                    f"{self._proc.returncode}; see {lock_base(self.endpoint)}.log:\n"
                    f"{_tail(Path(f'{lock_base(self.endpoint)}.log'))}"
                )
            info = self._try_ping(timeout_s=1.0)
            if info is not None:
                return info
            time.sleep(0.05)
        raise SamplerUnavailable(
            f"no sampler server answered at {self.endpoint} within {timeout_s:.0f}s"
        )

    def server_alive(self) -> bool | None:
        """Whether the server process we talk to still runs (``None``: cannot tell)."""
        if self._proc is not None and self._proc.pid == self.server_info.get("pid"):
            return self._proc.poll() is None
        pid = self.server_info.get("pid")
        if not isinstance(pid, int) or self.server_info.get("hostname") != socket.gethostname():
            return None
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        state = stat.rsplit(")", 1)[-1].split()[0]
        return state not in ("Z", "X") and b"streamrec" in cmdline

    # ---- calls ------------------------------------------------------------------------

    def call(
        self, op: str, meta: dict[str, Any] | None = None, arrays: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Sends ``op`` and returns the reply, riding out a server that died or was replaced
        (see the module docstring).

        Raises:
            SamplerUnavailable: no server came back within ``reconnect_timeout_s``, the
                server did not answer within ``timeout_s`` (and still runs), or the call
                lost its server ``MAX_RECOVERIES`` times.
            SamplerRefused: the server refused this client's token.
            RemoteError: the server answered with an error.
        """
        with self._lock:  # one request in flight per client; the prefetch thread queues here
            for attempt in range(MAX_RECOVERIES + 1):
                try:
                    return self._call_once(op, meta, arrays)
                except _Lost as lost:
                    if not self.reconnect_timeout_s or self._restoring:
                        raise SamplerUnavailable(
                            f"{lost}; create a new LocalRpcDataSampler to restart it (then "
                            "reload the table)"
                        ) from None
                    if attempt == MAX_RECOVERIES:
                        raise SamplerUnavailable(
                            f"{lost}; the call {op!r} lost its server {attempt + 1} times"
                        ) from None
                    self._recover(op, lost)
            raise AssertionError("unreachable")

    def _call_once(
        self, op: str, meta: dict[str, Any] | None, arrays: Mapping[str, Any] | None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        rpc = self._rpc
        deadline = time.monotonic() + self.timeout_s
        gone = f"the sampler server at {self.endpoint} (pid {self.server_info.get('pid')}) died"
        if self.server_alive() is False:  # known gone: no request to a socket nobody reads
            raise _Lost(gone)
        try:
            request_id = rpc.send(op, meta, arrays)
            while True:
                try:
                    if rpc.poll(250):
                        break
                except ServiceUnavailable:  # dropped with the request in flight: never answered
                    raise _Lost(f"{gone} or dropped the connection") from None
                if self.server_alive() is False:
                    raise _Lost(gone)
                if time.monotonic() > deadline:
                    raise _Lost(
                        f"sampler server at {self.endpoint} did not answer {op!r} within "
                        f"{self.timeout_s:.0f}s",
                        silent=True,
                    )
            return rpc.receive(request_id, max(0.0, deadline - time.monotonic()))
        except (RpcTimeout, ServiceUnavailable) as exc:  # the send found no server
            raise _Lost(f"{gone}: {exc}") from exc
        except RemoteError as exc:
            if exc.code == "unauthorized":
                raise self.refused() from exc
            raise

    def _recover(self, op: str, lost: _Lost) -> None:
        """Waits for a server at the endpoint again (starting one when ``auto_start``), and
        has its table put back when it has none. A silent server that still answers pings
        as the same server is overloaded, not gone: that raises."""
        started = time.monotonic()
        old_id = self.server_info.get("server_id")
        self.reset()
        deadline = started + self.reconnect_timeout_s
        info = None
        while info is None:
            info = self._try_ping(timeout_s=1.0)
            if info is None and self.auto_start:
                with contextlib.suppress(SamplerUnavailable):  # e.g. another start won
                    info = self._start_server()
            if info is None and time.monotonic() > deadline:
                raise SamplerUnavailable(
                    f"{lost}; no sampler server answered at {self.endpoint} within "
                    f"reconnect_timeout_s={self.reconnect_timeout_s:.0f}s (whoever runs it: "
                    f"the launcher, the DaemonSet{', or this client' if self.auto_start else ''}"
                    f" did not bring it back)"
                )
            if info is None:
                time.sleep(0.2)
        if lost.silent and info.get("server_id") == old_id:
            raise SamplerUnavailable(f"{lost} (the server still runs: overloaded?)")
        self.server_info = info
        if info.get("rows") is None:
            self._restoring = True  # a server lost while its table goes back: no recursion
            try:
                self.restore()
                self.has_table()  # server_info says the rows now
            finally:
                self._restoring = False
        seconds = time.monotonic() - started
        self.recoveries += 1
        self.last_recovery_s = seconds
        log.warning(
            "%s: back on the sampler at %s (pid %s) in %.1fs; %r is sent again",
            lost,
            self.endpoint,
            info.get("pid"),
            seconds,
            op,
        )

    def has_table(self) -> bool:
        """Whether the server (asked now) has a table."""
        info = self._try_ping(timeout_s=self.timeout_s)
        if info is None:
            raise SamplerUnavailable(f"no sampler server answers at {self.endpoint}")
        self.server_info = info
        return info.get("rows") is not None

    def wait_for_table(self, why: str) -> None:
        """Until the server has a table (another client of the node puts it back), at most
        ``reconnect_timeout_s``."""
        deadline = time.monotonic() + self.reconnect_timeout_s
        while time.monotonic() < deadline:
            info = self._try_ping(timeout_s=1.0)
            if info is not None and info.get("rows") is not None:
                self.server_info = info
                return
            time.sleep(0.2)
        raise SamplerUnavailable(
            f"the sampler at {self.endpoint} came back without a table and no client loaded "
            f"one within {self.reconnect_timeout_s:.0f}s ({why})"
        )

    def reset(self) -> None:
        """A fresh connection (a dropped one forgets its requests)."""
        self._rpc.close()
        self._rpc = RpcClient(self.endpoint, timeout_s=self.timeout_s, token=self._token)

    def close(self) -> None:
        self._rpc.close()


def _tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""
