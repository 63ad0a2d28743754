"""The peer token checked in the ZeroMQ handshake, before a peer may send any message.

ZeroMQ delivers a multipart message whole: a server sees the first frame only after every
frame has been received and buffered, and ``ZMQ_MAXMSGSIZE`` bounds each frame, not their
number. A token in the header alone is therefore checked after the peer's bytes already
cost memory. So every :class:`~streamrec.wire.RpcServer` socket is a ZMTP ``PLAIN`` server
whose credentials a ZAP handler (ZeroMQ's authentication protocol, one thread per context)
checks at connection time: the password must be the server's peer token (compared in
constant time). A peer without it never completes the handshake, so none of its messages
is read; the connection is dropped and the client sees ``EVENT_HANDSHAKE_FAILED_AUTH``
(:func:`connection_events` lets the client turn that into an ``unauthorized`` error instead
of a timeout).

PLAIN sends the token in clear, as the header did: it proves the peer knows the token, it
does not encrypt the data plane (see RELIABILITY.md). A server run without a token
(``--insecure-no-auth``) still speaks PLAIN and accepts any password, so clients need no
setting to reach it.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
import uuid

import zmq

log = logging.getLogger(__name__)

#: ZeroMQ's fixed address for the ZAP handler of a context.
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
#: The PLAIN user name every StreamRec peer sends (the password is the token).
USERNAME = b"streamrec"
#: The monitor events that mean the handshake failed (wrong token, or no PLAIN at all).
FAILED_EVENTS = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
#: A refused peer address is logged at most this often.
LOG_EVERY_S = 60.0


class _ZapHandler:
    """The ZAP handler of one context: ZAP domain (one per server socket) -> its token.

    A domain with token None accepts every PLAIN peer (a server started insecure).
    """

    def __init__(self, ctx: zmq.Context) -> None:
        self.tokens: dict[bytes, bytes | None] = {}
        self.lock = threading.Lock()
        self.logged: dict[str, float] = {}
        self.sock = ctx.socket(zmq.REP)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(ZAP_ENDPOINT)
        self.thread = threading.Thread(target=self._serve, name="zap-handler", daemon=True)
        self.thread.start()

    def _allowed(self, domain: bytes, mechanism: bytes, user: bytes, password: bytes) -> bool:
        with self.lock:
            if domain not in self.tokens:
                return False
            token = self.tokens[domain]
        if mechanism != b"PLAIN":
            return False
        if token is None:
            return True
        return hmac.compare_digest(user, USERNAME) & hmac.compare_digest(password, token)

    def _log_refusal(self, address: str) -> None:
        """A warning per peer address at most once a minute (a refused peer reconnects
        every 100 ms)."""
        now = time.monotonic()
        if now - self.logged.get(address, -LOG_EVERY_S) >= LOG_EVERY_S:
            if len(self.logged) > 10_000:
                self.logged.clear()
            self.logged[address] = now
            log.warning("peer %s refused in the handshake: wrong or missing peer token", address)

    def _serve(self) -> None:
        try:
            while True:
                frames = self.sock.recv_multipart()
                # version, request id, domain, address, identity, mechanism, credentials...
                # (libzmq sends at least six frames; fewer is refused, never a dead handler)
                padded = [*frames, *[b""] * 6]
                version, request_id, domain, address, _identity, mechanism = padded[:6]
                creds = frames[6:8] if len(frames) >= 8 else [b"", b""]
                ok = len(frames) >= 6 and self._allowed(domain, mechanism, creds[0], creds[1])
                if not ok:
                    self._log_refusal(address.decode(errors="replace"))
                status = [b"200", b"OK"] if ok else [b"400", b"wrong or missing peer token"]
                self.sock.send_multipart([version, request_id, *status, b"", b""])
        except zmq.ContextTerminated:
            pass
        finally:
            self.sock.close(linger=0)


_handlers: dict[int, _ZapHandler] = {}
_handlers_lock = threading.Lock()


def _handler(ctx: zmq.Context) -> _ZapHandler:
    with _handlers_lock:
        handler = _handlers.get(id(ctx))
        if handler is None or not handler.thread.is_alive():
            handler = _handlers[id(ctx)] = _ZapHandler(ctx)
        return handler


def secure_server(sock: zmq.Socket, ctx: zmq.Context, token: str | None) -> bytes:
    """Makes ``sock`` (not yet bound) accept only peers that send ``token``; returns the ZAP
    domain to give :func:`release` when the socket closes. ``token`` None accepts anyone."""
    handler = _handler(ctx)
    domain = f"streamrec-{uuid.uuid4().hex}".encode()
    with handler.lock:
        handler.tokens[domain] = None if token is None else token.encode()
    sock.setsockopt(zmq.ZAP_DOMAIN, domain)
    sock.setsockopt(zmq.PLAIN_SERVER, 1)
    return domain


def release(ctx: zmq.Context, domain: bytes) -> None:
    """Forgets a closed server socket's domain (its peers are refused from now on)."""
    with _handlers_lock:
        handler = _handlers.get(id(ctx))
    if handler is not None:
        with handler.lock:
            handler.tokens.pop(domain, None)


def set_credentials(sock: zmq.Socket, token: str) -> None:
    """Makes ``sock`` (not yet connected) present ``token`` in the PLAIN handshake."""
    sock.setsockopt(zmq.PLAIN_USERNAME, USERNAME)
    sock.setsockopt(zmq.PLAIN_PASSWORD, token.encode())


def secure_client(sock: zmq.Socket, token: str) -> zmq.Socket:
    """:func:`set_credentials`, and a monitor socket that receives the events of a failed
    handshake and of a dropped connection (read by :func:`connection_events`)."""
    set_credentials(sock, token)
    return sock.get_monitor_socket(FAILED_EVENTS | zmq.EVENT_DISCONNECTED)


def connection_events(monitor: zmq.Socket) -> tuple[int, int]:
    """(failed handshakes, dropped connections) among the events ``monitor`` holds now
    (read without waiting)."""
    failed = dropped = 0
    while monitor.poll(0):
        frames = monitor.recv_multipart()
        event = int.from_bytes(frames[0][:2], "little")
        failed += bool(event & FAILED_EVENTS)
        dropped += bool(event & zmq.EVENT_DISCONNECTED)
    return failed, dropped
