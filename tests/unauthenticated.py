"""Helpers of the peer-auth tests: a process's resident memory, one large message sent by a
peer that does not have the token, one hand-made request from a peer that has it, and a trap
that records the token of any peer that connects to it."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import msgpack
import numpy as np
import zmq
from streamrec.handshake import FAILED_EVENTS, ZAP_ENDPOINT, set_credentials
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


class PlainTrap:
    """A real ZeroMQ socket at an address a job might name, recording what peers send it.

    A ROUTER on ``tcp://127.0.0.1:<free port>`` that speaks ZMTP ``PLAIN`` as a server (as
    every StreamRec server does), with a ZAP handler of its own context that records each
    handshake's (user name, password) and refuses it; a monitor counts the connections it
    accepted and any message that got through is kept. A peer that sends the data-plane token
    here leaves it in :attr:`credentials`. All sockets live in the trap's thread.
    """

    def __init__(self) -> None:
        self.credentials: list[tuple[bytes, bytes]] = []
        self.messages: list[list[bytes]] = []
        self.accepted = 0
        self.endpoint = ""
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="plain-trap", daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "the trap did not bind"

    def _run(self) -> None:
        ctx = zmq.Context()
        zap = ctx.socket(zmq.REP)
        zap.bind(ZAP_ENDPOINT)
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.PLAIN_SERVER, 1)
        sock.setsockopt(zmq.ZAP_DOMAIN, b"trap")
        monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPTED)
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self._ready.set()
        poller = zmq.Poller()
        for s in (zap, sock, monitor):
            poller.register(s, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(100))
                if zap in ready:  # version, id, domain, address, identity, mechanism, creds
                    version, request_id, _, _, _, mechanism, *creds = zap.recv_multipart()
                    if mechanism == b"PLAIN":
                        self.credentials.append((creds[0], creds[1]))
                    zap.send_multipart([version, request_id, b"400", b"trapped", b"", b""])
                if monitor in ready:
                    monitor.recv_multipart()
                    self.accepted += 1
                if sock in ready:
                    self.messages.append(sock.recv_multipart())
        finally:
            sock.disable_monitor()
            for s in (monitor, sock, zap):
                s.close(linger=0)
            ctx.term()

    def received(self) -> bool:
        """Whether any peer connected, presented credentials or sent a message."""
        return bool(self.accepted or self.credentials or self.messages)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
