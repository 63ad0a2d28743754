"""Peer auth on the sampler: a real server process over a real socket refuses requests without
its token (or with another) and keeps serving good clients; an auto-started server gets the
token file of the client that started it."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from sampler_workers import TAGS, small_table, start_server
from streamrec.auth import TOKEN_FILE_ENV, read_token, write_token_file
from streamrec.errors import RemoteError
from streamrec.sampler import LocalRpcDataSampler
from streamrec.sampler.client import stop_server
from streamrec.sampler.errors import SamplerRefused
from streamrec.wire import RpcClient
from unauthenticated import raw_call, rss_bytes, send_unauthenticated


@pytest.fixture
def token_server(short_dir, monkeypatch):
    """A server started with its own token file (through the environment, as a Kubernetes
    Secret would be), and that file."""
    token = write_token_file(f"{short_dir}/token")
    monkeypatch.setenv(TOKEN_FILE_ENV, str(token))
    srv = start_server(short_dir)
    yield srv, token
    stop_server(srv.proc.pid)
    srv.proc.wait(timeout=10)


def test_requests_without_the_token_are_refused_and_good_clients_served(token_server, tmp_path):
    srv, token = token_server
    good = LocalRpcDataSampler(*TAGS, endpoint=srv.endpoint, auto_start=False)
    good.reload(small_table())
    before = good.stats()["generation"]
    for header in (
        {"op": "reload", "id": 1, "meta": {"tags": {}}},  # no token
        {"op": "ping", "id": 2, "auth": "not-the-token-but-long-enough"},
        {"op": "stats", "id": 3, "auth": None},
    ):
        reply = raw_call(srv.endpoint, header, read_token(token))
        assert reply["error"]["code"] == "unauthorized", (header, reply)
    wrong = tmp_path / "wrong"
    wrong.write_text("another-token-of-enough-length-0000")
    started = time.monotonic()
    with pytest.raises(SamplerRefused) as err:  # naming who holds the endpoint
        LocalRpcDataSampler(
            *TAGS, endpoint=srv.endpoint, auto_start=False, auth_token_file=wrong, timeout_s=60
        )
    assert err.value.code == "unauthorized" and f"pid {srv.proc.pid}" in str(err.value)
    assert time.monotonic() - started < 10  # refused in the handshake: told, not timed out
    ids = good.sample_ids(torch.tensor([0, 100]), 3, torch.tensor([0, 1]))
    assert ids.numel() == 6
    assert good.stats()["generation"] == before  # nothing reloaded by the refused peers
    good.close()


def test_an_auto_started_server_gets_the_clients_token_file(short_dir, monkeypatch):
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    token = write_token_file(f"{short_dir}/own-token")
    endpoint = f"ipc://{short_dir}/auto.sock"
    s = LocalRpcDataSampler(*TAGS, endpoint=endpoint, auth_token_file=token, timeout_s=30)
    try:
        s.reload(small_table())
        assert s.sample_ids(torch.tensor([0]), 4, torch.tensor([0])).numel() == 4
        with RpcClient(endpoint, timeout_s=10, token="x" * 40) as other:
            with pytest.raises(RemoteError) as err:
                other.call("ping")
            assert err.value.code == "unauthorized"
        with RpcClient(endpoint, timeout_s=10, token=read_token(token)) as same:
            assert same.call("ping")[0]["pid"] == s.server_pid
    finally:
        stop_server(s.server_pid)
        s.close()


@pytest.mark.slow
def test_unauthenticated_400mb_messages_cost_the_sampler_no_memory(token_server):
    """Three 400 MB messages from peers without the token: none is read, and the sampler's
    resident memory stays within 50 MB of where it started; good clients are served."""
    srv, _token = token_server
    good = LocalRpcDataSampler(*TAGS, endpoint=srv.endpoint, auto_start=False)
    good.reload(small_table())
    start = rss_bytes(srv.proc.pid)
    body = np.ones(400 << 20, np.uint8)
    ends = [send_unauthenticated(srv.endpoint, body, pw) for pw in (None, "x" * 40, None)]
    assert ends == ["refused"] * 3
    assert good.sample_ids(torch.tensor([0]), 4, torch.tensor([0])).numel() == 4
    grown = rss_bytes(srv.proc.pid) - start
    assert grown <= 50 << 20, f"sampler RSS grew by {grown >> 20} MB"
    good.close()
