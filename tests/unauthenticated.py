"""Helpers of the peer-auth tests: a process's resident memory, one large message sent by a
peer that does not have the token, and one hand-made request from a peer that has it."""

from __future__ import annotations

import contextlib
from pathlib import Path

import msgpack
import numpy as np
import zmq
from streamrec.handshake import FAILED_EVENTS, set_credentials
from streamrec.wire import PROTOCOL_VERSION, encode


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def send_unauthenticated(endpoint: str, body: np.ndarray, password: str | None) -> str:
    """One ``ping`` carrying ``body`` from a peer without the token (no credentials, or
    ``password``); returns how it ended: ``"reply"`` or ``"refused"`` (the handshake)."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if password is not None:
        set_credentials(sock, password)
    monitor = sock.get_monitor_socket(FAILED_EVENTS)
    try:
        sock.connect(endpoint)
        # not blocking: once a refused handshake has dropped the connection, a DEALER has no
        # peer to queue for, and a blocking send would wait for ever
        with contextlib.suppress(zmq.Again):
            frames = encode({"op": "ping", "id": 1}, None, {"x": body})
            sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        ready = dict(poller.poll(60_000))
        assert ready, "neither a reply nor a refused handshake within 60 s"
        return "reply" if sock in ready else "refused"
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)


def raw_call(endpoint: str, header: dict, token: str) -> dict:
    """One hand-made request (no RpcClient) from a peer that passed the handshake with
    ``token``: the header past the handshake is checked next. Returns the reply header."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    set_credentials(sock, token)
    sock.connect(endpoint)
    try:
        sock.send_multipart(
            [msgpack.packb({"v": PROTOCOL_VERSION, "meta": {}, "arrays": [], **header})]
        )
        assert sock.poll(10_000), "no reply"
        return msgpack.unpackb(sock.recv_multipart()[0], raw=False)
    finally:
        sock.close()
