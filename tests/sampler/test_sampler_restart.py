"""A sampler server that dies, is replaced, refuses a token or sits idle: what its clients
see (real server processes, SIGKILL, real sockets)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from sampler_workers import TAGS, small_table, start_server
from servers import wait_for
from streamrec.auth import write_token_file
from streamrec.sampler import LocalRpcDataSampler
from streamrec.sampler.client import stop_server
from streamrec.sampler.errors import SamplerRefused, SamplerUnavailable

POS, CATS = torch.tensor([0, 100, 200]), torch.tensor([0, 1, 2])


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"


@pytest.mark.timeout(120)
def test_a_killed_server_is_replaced_its_table_put_back_and_the_call_sent_again(short_dir):
    endpoint = f"ipc://{short_dir}/auto.sock"
    loader = LocalRpcDataSampler(*TAGS, endpoint=endpoint, timeout_s=30)
    other = LocalRpcDataSampler(*TAGS, endpoint=endpoint, timeout_s=30)  # another rank
    other.keep_table(small_table())  # names the table without loading it
    pids = [loader.server_pid]
    try:
        loader.reload(small_table())
        assert other.sample_ids(POS, 4, CATS).numel() == 12
        os.kill(pids[0], signal.SIGKILL)
        started = time.monotonic()
        ids = other.sample_ids(POS, 4, CATS)  # finds it dead, starts one, loads the table
        seconds = time.monotonic() - started
        pids.append(other.server_pid)
        assert ids.numel() == 12 and bool((ids % 100 == 0).all())
        assert other.server_pid != pids[0] and other.recoveries == 1
        assert other.server_info["rows"] == 50 and seconds < 20, seconds
        print(f"recovery (kill -> the call answered by the new server): {seconds:.2f}s")
        # the loader finds the new server with its table: nothing loaded twice
        assert loader.sample_ids(POS, 4, CATS).numel() == 12
        assert loader.recoveries == 1 and loader.server_pid == pids[1]
        assert loader.stats()["generation"] == 1
    finally:
        loader.close()
        other.close()
        for pid in pids:
            stop_server(pid)


@pytest.mark.timeout(120)
def test_a_call_in_flight_when_the_server_is_killed_is_answered_by_its_successor(short_dir):
    """The launcher's way: a server run by someone else is killed and started again at the
    same address; clients that may not start one wait for it."""
    srv = start_server(short_dir)
    client = LocalRpcDataSampler(*TAGS, endpoint=srv.endpoint, auto_start=False, timeout_s=30)
    successor: list = []
    done = threading.Event()
    try:
        client.reload(small_table())

        def kill_and_restart() -> None:
            os.kill(srv.proc.pid, signal.SIGKILL)
            srv.proc.wait(timeout=10)
            time.sleep(1.0)  # whoever runs it notices (the launcher polls every 0.5 s)
            successor.append(start_server(short_dir))
            done.wait(60)  # the successor dies with the thread that started it

        killer = threading.Thread(target=kill_and_restart)
        killer.start()
        sampled = 0
        deadline = time.monotonic() + 60
        while client.recoveries == 0 and time.monotonic() < deadline:
            sampled += client.sample_ids(POS.repeat(500), 50, CATS.repeat(500)).numel()
        assert client.recoveries == 1, "the kill was never seen"
        wait_for(lambda: successor, 30, what="start_server's return")  # it pings too
        assert client.server_pid == successor[0].proc.pid
        assert client.sample_ids(POS, 3, CATS).numel() == 9 and sampled > 0
        print(f"recovery, successor started 1 s after the kill: {client.last_recovery_s:.2f}s")
    finally:
        done.set()
        killer.join(timeout=60)
        client.close()
        for s in [srv, *successor]:
            stop_server(s.proc.pid)
            s.proc.wait(timeout=10)


@pytest.mark.timeout(60)
def test_no_successor_within_the_reconnect_timeout_is_unavailable_naming_it(short_dir):
    srv = start_server(short_dir)
    client = LocalRpcDataSampler(
        *TAGS, endpoint=srv.endpoint, auto_start=False, reconnect_timeout_s=2
    )
    try:
        client.reload(small_table())
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait(timeout=10)
        started = time.monotonic()
        with pytest.raises(SamplerUnavailable, match="reconnect_timeout_s=2s") as err:
            client.sample_ids(POS, 2, CATS)
        assert time.monotonic() - started < 15
        assert srv.endpoint in str(err.value)
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_a_successor_without_a_table_and_no_client_to_load_it_is_unavailable(short_dir):
    srv = start_server(short_dir)
    loader = LocalRpcDataSampler(*TAGS, endpoint=srv.endpoint, auto_start=False)
    client = LocalRpcDataSampler(
        *TAGS, endpoint=srv.endpoint, auto_start=False, reconnect_timeout_s=2
    )
    successor = None
    try:
        loader.reload(small_table())
        loader.close()  # the only client that could put the table back
        stop_server(srv.proc.pid)
        srv.proc.wait(timeout=10)
        successor = start_server(short_dir)
        with pytest.raises(SamplerUnavailable, match="came back without a table"):
            client.sample_ids(POS, 2, CATS)
    finally:
        client.close()
        if successor is not None:
            stop_server(successor.proc.pid)


@pytest.mark.timeout(60)
def test_an_auto_started_server_exits_when_idle(short_dir, monkeypatch):
    monkeypatch.setenv("STREAMREC_SAMPLER_IDLE_EXIT_S", "2")
    endpoint = f"ipc://{short_dir}/idle.sock"
    client = LocalRpcDataSampler(*TAGS, endpoint=endpoint)
    pid = client.server_pid
    try:
        client.reload(small_table())
        t0 = time.monotonic()
        for _ in range(4):  # requests keep it up
            assert client.sample_ids(POS, 2, CATS).numel() == 6
            time.sleep(0.6)
        assert not gone(pid)
        client.close()  # its last client gone, the server is idle from now on
        wait_for(lambda: gone(pid), 20, 0.1, what="the idle server's exit")
        assert time.monotonic() - t0 >= 2.0
        assert not Path(endpoint[6:]).exists()  # it removed its socket
        # a client that comes later gets a new server
        later = LocalRpcDataSampler(*TAGS, endpoint=endpoint)
        assert later.server_pid != pid
        later.reload(small_table())
        assert later.sample_ids(POS, 2, CATS).numel() == 6
        later.close()
        stop_server(later.server_pid)
    finally:
        client.close()
        stop_server(pid)


@pytest.mark.timeout(60)
def test_a_connected_quiet_client_keeps_an_idle_server_up_until_it_closes(short_dir, monkeypatch):
    """The idle exit counts connected clients, not requests: a client connected but quiet
    for three idle periods keeps its server up; once it closes, the server exits after the
    idle time."""
    monkeypatch.setenv("STREAMREC_SAMPLER_IDLE_EXIT_S", "1")
    endpoint = f"ipc://{short_dir}/quiet.sock"
    client = LocalRpcDataSampler(*TAGS, endpoint=endpoint)
    pid = client.server_pid
    try:
        client.reload(small_table())
        quiet_until = time.monotonic() + 3.5
        while time.monotonic() < quiet_until:  # no request: only the connection
            assert not gone(pid), "the server exited with a client connected"
            time.sleep(0.1)
        closed = time.monotonic()
        client.close()
        wait_for(lambda: gone(pid), 20, 0.05, what="the server's exit after its client left")
        assert time.monotonic() - closed >= 1.0
        assert not Path(endpoint[6:]).exists()  # it removed its socket
    finally:
        client.close()
        stop_server(pid)


@pytest.mark.timeout(60)
def test_a_server_with_another_token_is_named_with_its_pid_and_how_to_stop_it(
    short_dir, monkeypatch
):
    theirs = write_token_file(Path(short_dir) / "their-token")
    with monkeypatch.context() as env:
        env.setenv("STREAMREC_AUTH_TOKEN_FILE", str(theirs))  # start_server's ping uses it
        srv = start_server(short_dir, "--auth-token-file", str(theirs))
    mine = write_token_file(Path(short_dir) / "my-token")
    try:
        with pytest.raises(SamplerRefused) as err:
            LocalRpcDataSampler(*TAGS, endpoint=srv.endpoint, auth_token_file=mine)
        text = str(err.value)
        assert f"pid {srv.proc.pid}" in text and f"kill {srv.proc.pid}" in text, text
        assert str(theirs) in text and str(mine) in text, text
        assert isinstance(err.value, SamplerUnavailable)  # infrastructure, to the trainer
        assert srv.proc.poll() is None  # it still serves its own clients
    finally:
        stop_server(srv.proc.pid)
        srv.proc.wait(timeout=10)
