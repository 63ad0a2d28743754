"""streamrec.process on real processes: a child's log, its session, stopping a whole tree,
and the death signal a child gets when the one who started it dies."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from servers import wait_for
from streamrec.process import (
    PICKED_PORTS,
    PORT_HELD_S,
    SpawnError,
    bin_path,
    claim_marker,
    descendants,
    free_port,
    pid_alive,
    spawn,
    stop_process,
)

PY = sys.executable


def read_line(proc: subprocess.Popen, timeout_s: float = 30.0) -> str:
    """The next line of ``proc``'s stdout pipe, waiting at most ``timeout_s``."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    if not ready:
        raise AssertionError(f"no line from pid {proc.pid} within {timeout_s}s")
    return proc.stdout.readline().strip()


def wait_dead(pid: int, timeout_s: float = 10.0) -> bool:
    """Whether ``pid`` is gone within ``timeout_s`` (False: still alive then)."""
    try:
        return wait_for(lambda: not pid_alive(pid), timeout_s, 0.02, what=f"pid {pid} to end")
    except AssertionError:
        return False


def test_child_logs_both_streams_in_a_session_of_its_own(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "child.log"  # the parent directory is made
    code = textwrap.dedent(
        """
        import os, sys
        print("out", os.environ["PROBE"], sys.stdin.read() == "", flush=True)
        print("err", os.getsid(0) == os.getpid(), file=sys.stderr, flush=True)
        """
    )
    proc = spawn([PY, "-c", code], log=log, env={"PROBE": "v1"})
    assert proc.wait(timeout=30) == 0
    first = log.read_text()
    assert "out v1 True" in first and "err True" in first
    # a restart appends to the same log
    assert spawn([PY, "-c", code], log=log, env={"PROBE": "v2"}).wait(timeout=30) == 0
    assert log.read_text().startswith(first) and "out v2 True" in log.read_text()


def test_stdout_pipe_and_stderr_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "err.log"
    code = "import sys; print('ready'); print('oops', file=sys.stderr)"
    proc = spawn([PY, "-c", code], log=log, stdout_pipe=True)
    assert read_line(proc) == "ready"
    assert proc.wait(timeout=30) == 0
    assert log.read_text().strip() == "oops"


def test_stop_process_kills_the_group_and_a_grandchild_in_its_own_session() -> None:
    # the child ignores SIGTERM (so SIGKILL must follow); one grandchild shares its group,
    # the other leads a session of its own as torchrun's ranks do
    code = textwrap.dedent(
        f"""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        same = subprocess.Popen([{PY!r}, "-c", "import time; time.sleep(120)"])
        own = subprocess.Popen(
            [{PY!r}, "-c", "import time; time.sleep(120)"], start_new_session=True
        )
        print(same.pid, own.pid, flush=True)
        time.sleep(120)
        """
    )
    proc = spawn([PY, "-c", code], stdout_pipe=True)
    try:
        same, own = (int(x) for x in read_line(proc).split())
        assert os.getpgid(same) == proc.pid and os.getsid(own) == own
        assert set(descendants(proc.pid)) == {same, own}
        started = time.monotonic()
        stop_process(proc, timeout_s=0.5)
        assert time.monotonic() - started < 10
        assert proc.returncode == -signal.SIGKILL
        assert not pid_alive(proc.pid) and not pid_alive(same) and not pid_alive(own)
    finally:
        for pid in descendants(proc.pid):
            os.kill(pid, signal.SIGKILL)
        stop_process(proc, timeout_s=0.5)


def test_stop_process_by_pid_and_on_a_finished_child() -> None:
    proc = spawn(["sleep", "60"])
    stop_process(proc.pid)  # as a pid: SIGTERM to it alone, polled until gone
    assert not pid_alive(proc.pid)
    assert proc.wait(timeout=10) in (0, -signal.SIGTERM)  # reaped by stop_process or here
    stop_process(proc)  # already gone: nothing to do, no error
    stop_process(proc.pid)


@pytest.mark.parametrize("die_with_parent", [True, False])
def test_die_with_parent(die_with_parent: bool) -> None:
    # a middle process starts a sleeper, reports its pid and is killed outright
    code = textwrap.dedent(
        f"""
        import time
        from streamrec.process import spawn
        child = spawn(["sleep", "120"], die_with_parent={die_with_parent})
        print(child.pid, flush=True)
        time.sleep(120)
        """
    )
    middle = spawn([PY, "-c", code], stdout_pipe=True)
    sleeper = int(read_line(middle))
    try:
        assert pid_alive(sleeper)
        middle.kill()
        middle.wait(timeout=10)
        if die_with_parent:
            assert wait_dead(sleeper)
        else:
            # SIGTERM comes at once when asked for; without it the sleeper lives on
            assert not wait_dead(sleeper, timeout_s=1.0)
    finally:
        stop_process(sleeper)
    assert not pid_alive(sleeper)


def test_pid_alive_refuses_what_is_not_a_live_pid() -> None:
    assert pid_alive(os.getpid())
    assert not pid_alive(None) and not pid_alive("1") and not pid_alive(0) and not pid_alive(-5)
    proc = spawn(["true"])
    assert wait_dead(proc.pid)  # exited, not yet reaped
    assert proc.poll() == 0


def test_bin_path_and_spawn_errors(tmp_path: Path) -> None:
    assert bin_path("python") == str(Path(sys.executable).parent / "python")
    with pytest.raises(SpawnError, match="no-such-program-xyz"):
        bin_path("no-such-program-xyz")
    with pytest.raises(SpawnError, match="cannot start"):
        spawn([str(tmp_path / "missing")])


def test_free_port_can_be_bound() -> None:
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_free_port_picks_outside_the_ephemeral_range_and_never_twice_across_processes() -> None:
    """Two processes picking at once get disjoint ports, none in the kernel's ephemeral range
    (where an outgoing connection could take it before the child binds it)."""
    code = "from streamrec.process import free_port\nprint(*[free_port() for _ in range(50)])"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    picked = [[int(p) for p in proc.communicate(timeout=60)[0].split()] for proc in procs]
    assert all(len(ports) == 50 for ports in picked)
    both = picked[0] + picked[1]
    assert len(set(both)) == 100, "a port handed out twice"
    low, _high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert all(p in PICKED_PORTS and p < low for p in both)


def test_free_port_hands_out_again_a_port_held_past_the_hour(tmp_path: Path) -> None:
    marker = tmp_path / "20123"
    assert claim_marker(marker) and not claim_marker(marker)
    old = time.time() - PORT_HELD_S - 5
    os.utime(marker, (old, old))
    assert claim_marker(marker) and not claim_marker(marker)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["20123"]
