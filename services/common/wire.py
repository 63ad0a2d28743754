"""The ZeroMQ endpoints every StreamRec service talks through: :class:`RpcServer` and
:class:`RpcClient`. What they send is :mod:`streamrec.frames` (a msgpack header frame, then
one raw frame per array, never pickled); its names are importable from here too.

Peer auth comes first: a connection must complete a ZMTP ``PLAIN`` handshake whose password
is the shared peer token (:mod:`streamrec.auth`, checked by :mod:`streamrec.handshake`), so a
peer without the token cannot make a server read any message. A request's header also
carries ``"auth": <token>``; a server started with one decodes only the header frame (at
most ``MAX_HEADER_BYTES``), answers ``unauthorized`` when the token is missing or wrong
(compared in constant time) and drops the buffers unread.

Limits: ``max_message_bytes`` caps every frame at the socket (ZMQ_MAXMSGSIZE, so an
oversized frame is dropped before it is buffered) and the sum of the frames after receipt;
``MAX_FRAMES`` caps the frame count. Every client call has a timeout.

Servers (:class:`RpcServer`) run a ROUTER front end and a pool of worker threads so that
handlers that release the GIL (numpy, torch, the C++ extensions) use every core.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import zmq
from streamrec.auth import load_token, token_matches
from streamrec.errors import (
    BadRequest,
    RemoteError,
    RpcTimeout,
    ServiceUnavailable,
    StreamRecError,
    Unauthorized,
    quote,
)
from streamrec.frames import (
    ALLOWED_DTYPES,
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_DIMS,
    MAX_ERROR_CHARS,
    MAX_FRAMES,
    MAX_HEADER_BYTES,
    PROTOCOL_VERSION,
    ZERO_COPY_THRESHOLD,
    Arrays,
    Handler,
    Message,
    Meta,
    decode,
    decode_body,
    decode_header,
    encode,
    error_reply,
    frame_bytes,
)
from streamrec.handshake import connection_events, release, secure_client, secure_server

# the frames' names, for the services and tests that import the protocol from here
__all__ = [
    "ALLOWED_DTYPES",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "MAX_DIMS",
    "MAX_ERROR_CHARS",
    "MAX_FRAMES",
    "MAX_HEADER_BYTES",
    "PROTOCOL_VERSION",
    "ZERO_COPY_THRESHOLD",
    "Arrays",
    "Handler",
    "Message",
    "Meta",
    "RpcClient",
    "RpcServer",
    "decode",
    "decode_body",
    "decode_header",
    "encode",
    "error_reply",
]

log = logging.getLogger(__name__)


class RpcServer:
    """A ROUTER front end and ``workers`` threads that run ``handlers[op](meta, arrays)``.

    A handler returns ``(meta, arrays)`` for the reply. A :class:`StreamRecError` (or a
    ``ValueError``/``KeyError``/``TypeError`` from argument checks) becomes an error reply
    with its code; any other exception becomes ``internal`` and is logged. The server keeps
    serving in every case.

    Args:
        endpoint: where to bind, e.g. ``tcp://127.0.0.1:5555`` or ``ipc:///tmp/x.sock``.
        handlers: op name -> handler.
        workers: threads running handlers concurrently (handlers must be thread-safe).
        max_message_bytes: cap on one incoming message (and each frame at the socket).
        on_request: optional callback ``(op, seconds, error_code_or_None)`` for metrics.
        token: the peer token every request must carry (:mod:`streamrec.auth`); None serves
            anyone (in-process tests; a service process needs ``--insecure-no-auth`` for it).
    """

    def __init__(
        self,
        endpoint: str,
        handlers: Mapping[str, Handler],
        workers: int = 2,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        on_request: Callable[[str, float, str | None], None] | None = None,
        context: zmq.Context | None = None,
        token: str | None = None,
    ) -> None:
        self.handlers = dict(handlers)
        self.token = token
        self.max_message_bytes = max_message_bytes
        self.on_request = on_request
        self.ctx = context or zmq.Context.instance()
        self.frontend = self.ctx.socket(zmq.ROUTER)
        self.frontend.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        self.frontend.setsockopt(zmq.LINGER, 0)
        self._zap_domain = secure_server(self.frontend, self.ctx, token)
        self.frontend.bind(endpoint)
        self.endpoint = self.frontend.getsockopt_string(zmq.LAST_ENDPOINT)
        self._backend_addr = f"inproc://rpc-workers-{uuid.uuid4().hex}"
        self._control_addr = f"inproc://rpc-control-{uuid.uuid4().hex}"
        self.backend = self.ctx.socket(zmq.DEALER)
        self.backend.bind(self._backend_addr)
        self.control = self.ctx.socket(zmq.PAIR)
        self.control.bind(self._control_addr)
        # connected now: a pair connected at stop closed before the proxy read it (a 5 s stop)
        self._stopper = self.ctx.socket(zmq.PAIR)
        self._stopper.connect(self._control_addr)
        self._threads = [
            threading.Thread(target=self._worker, name=f"rpc-worker-{i}", daemon=True)
            for i in range(max(1, workers))
        ]
        self._proxy_thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def start(self) -> RpcServer:
        for t in self._threads:
            t.start()
        self._proxy_thread = threading.Thread(target=self._proxy, name="rpc-proxy", daemon=True)
        self._proxy_thread.start()
        return self

    def stop(self) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._stopper.send(b"TERMINATE")
        if self._proxy_thread is not None:
            self._proxy_thread.join(timeout=5)
        self._stopper.close(linger=0)

    def _proxy(self) -> None:
        try:
            zmq.proxy_steerable(self.frontend, self.backend, None, self.control)
        except zmq.ContextTerminated:
            pass
        finally:
            for sock in (self.frontend, self.backend, self.control):
                sock.close(linger=0)
            release(self.ctx, self._zap_domain)

    def _worker(self) -> None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self._backend_addr)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        try:
            while not self._stopping.is_set():
                if not poller.poll(200):
                    continue
                frames = sock.recv_multipart(copy=False)
                # ROUTER envelope: routing id(s), then an empty delimiter only if the peer
                # was a REQ socket. Our clients are DEALERs: [identity, header, buffers...].
                envelope, body = frames[:1], frames[1:]
                if body and body[0].bytes == b"":
                    envelope, body = frames[:2], frames[2:]
                reply = self.handle(body)
                # Dropped before the next wait: an idle worker would otherwise hold its last
                # request's frames (up to max_message_bytes) until the next one comes.
                del frames, body
                sock.send_multipart(envelope + reply, copy=False)
                del reply
        except zmq.ContextTerminated:
            pass
        finally:
            sock.close(linger=0)

    def handle(self, body: list) -> list:
        """The reply frames to one request's frames (what a worker thread runs; the handler
        fuzz target calls it in-process). Never raises."""
        started = time.perf_counter()
        op: object = "?"  # what the request names, checked below
        request_id: Any = None
        code: str | None = None
        try:
            if not body:
                raise BadRequest("empty message")
            if len(body) > MAX_FRAMES:
                raise BadRequest(f"too many frames: {len(body)} (at most {MAX_FRAMES})")
            # The header alone first: the token is checked before any buffer is looked at.
            header = decode_header(body[0], MAX_HEADER_BYTES)
            request_id = header.get("id")
            op = header.get("op")
            if self.token is not None and not token_matches(self.token, header.get("auth")):
                op = op if isinstance(op, str) and op in self.handlers else "?"
                del body[1:]  # an unauthenticated body is never decoded
                raise Unauthorized(
                    "request refused: missing or wrong auth token (send the token of the "
                    "server's --auth-token-file / $STREAMREC_AUTH_TOKEN_FILE)"
                )
            total = sum(frame_bytes(f).nbytes for f in body)
            if total > self.max_message_bytes:
                raise BadRequest(
                    f"message of {total} bytes exceeds the cap of {self.max_message_bytes}"
                )
            msg = decode_body(header, body[1:])
            if not isinstance(op, str) or op not in self.handlers:
                code = "unknown_op"
                known = ", ".join(sorted(self.handlers))
                return error_reply(request_id, code, f"unknown op {quote(op)}; known ops: {known}")
            meta, arrays = self.handlers[op](msg.meta, msg.arrays)
            return encode({"id": request_id, "ok": True}, meta, arrays)
        except StreamRecError as exc:
            code = exc.code
            return error_reply(request_id, code, str(exc))
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            code = "bad_request"
            return error_reply(request_id, code, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # the server must survive anything a handler does
            log.exception("handler for op %r failed", op)
            code = "internal"
            return error_reply(request_id, code, f"{type(exc).__name__}: {exc}")
        finally:
            if self.on_request is not None:
                self.on_request(str(op), time.perf_counter() - started, code)


class RpcClient:
    """A DEALER client: ``call(op, meta, arrays)`` returns ``(meta, arrays)`` or raises.

    ``send`` and ``receive`` are exposed separately so a caller can have requests in flight
    to several servers at once, and several to one server (the embedding-store client does;
    a server with several workers may answer them in any order: a reply to another request
    still awaited is kept for its ``receive``). Replies to requests that timed out are
    recognised by their id and dropped. One client is used by one thread at a time (a lock
    enforces it).

    ``token`` is the peer token sent with every request; None reads it from
    :func:`streamrec.auth.load_token` (``$STREAMREC_AUTH_TOKEN_FILE`` or the per-user file).

    Raises:
        RpcTimeout: no reply within ``timeout_s`` (the server may be dead or overloaded).
        RemoteError: the server answered with an error; ``.code`` and message say why.
    """

    _ids = itertools.count(1)

    def __init__(
        self,
        endpoint: str,
        timeout_s: float = 30.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        context: zmq.Context | None = None,
        token: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.token = token if token is not None else load_token()
        self.timeout_s = timeout_s
        self.max_message_bytes = max_message_bytes
        self.ctx = context or zmq.Context.instance()
        self.lock = threading.RLock()
        self.sock = self._connect()
        # ids sent and not yet received, and replies that came before their receive
        self._awaited: set[int] = set()
        #: failed handshakes seen while no request was in flight (reported at the next poll)
        self._refused = 0
        self._early: dict[int, tuple[Meta, Arrays] | RemoteError] = {}

    def _connect(self) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        self._monitor = secure_client(sock, self.token)
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        sock.connect(self.endpoint)
        return sock

    def _close_socket(self) -> None:
        if self.sock.closed:
            return
        self.sock.disable_monitor()
        self._monitor.close(linger=0)
        self.sock.close(linger=0)

    def poll(self, timeout_ms: int) -> bool:
        """Whether a reply is ready within ``timeout_ms``.

        Raises:
            RemoteError: ``unauthorized``: the server refused this client's token in the
                handshake (no request of it was read).
            ServiceUnavailable: the connection dropped with requests in flight (the server
                died: their replies never come; no waiting for the timeout).
        """
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            # a refusal seen while idle is reported at once, not after the wait
            wait_ms = 0 if self._refused else max(0, int((deadline - time.monotonic()) * 1000))
            ready = dict(self._poller.poll(wait_ms + 1))
            if self.sock in ready:
                return True
            if self._refused or self._monitor in ready:
                failed, dropped = connection_events(self._monitor)
                if dropped and not failed and self._monitor.poll(100):
                    failed += connection_events(self._monitor)[0]  # a refusal drops it too
                failed, self._refused = failed + self._refused, 0
                if failed:
                    raise self._unauthorized()
                if dropped and self._awaited:  # the server died: its replies never come
                    raise self._dropped()
            if time.monotonic() >= deadline:
                return False

    def _unauthorized(self) -> RemoteError:
        return RemoteError(
            "unauthorized",
            f"{self.endpoint} refused this client's peer token in the handshake (send the "
            "token of the server's --auth-token-file / $STREAMREC_AUTH_TOKEN_FILE)",
        )

    def _dropped(self) -> ServiceUnavailable:
        return ServiceUnavailable(
            f"the connection to {self.endpoint} dropped with {len(self._awaited)} request(s) "
            "in flight: the server stopped or restarted (a restarted store shard is empty)"
        )

    def _send_frames(self, frames: list[Any], copy: bool) -> None:
        """Queues ``frames``. A DEALER whose connection dropped (the server refused the
        handshake) has no peer to queue for, and a blocking send would wait for ever: this
        one waits at most ``timeout_s`` for a connection, and a refusal raises at once."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                self.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=copy)
                return
            except zmq.Again:
                pass
            failed, dropped = connection_events(self._monitor) if self._monitor.poll(50) else (0, 0)
            self._refused += failed
            error: StreamRecError | None = None
            if self._refused or (dropped and self._awaited):
                error = self._unauthorized() if self._refused else self._dropped()
            elif time.monotonic() >= deadline:
                error = RpcTimeout(
                    f"could not send to {self.endpoint} within {self.timeout_s:.1f}s"
                )
            if error is not None:
                self._refused = 0
                self._reset()
                raise error

    def send(
        self, op: str, meta: Meta | None = None, arrays: Mapping[str, Any] | None = None
    ) -> int:
        request_id = next(self._ids)
        frames = encode({"op": op, "id": request_id, "auth": self.token}, meta, arrays)
        size = sum(memoryview(f).nbytes for f in frames)
        if size > self.max_message_bytes:
            raise BadRequest(f"request of {size} bytes exceeds the cap of {self.max_message_bytes}")
        with self.lock:
            if not self._awaited:  # a connection dropped while idle concerns no request
                failed, _ = connection_events(self._monitor)
                self._refused += failed
            self._send_frames(frames, copy=size < ZERO_COPY_THRESHOLD)
            self._awaited.add(request_id)
        return request_id

    def receive(self, request_id: int, timeout_s: float | None = None) -> tuple[Meta, Arrays]:
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        with self.lock:
            while request_id not in self._early:
                remaining = deadline - time.monotonic()
                try:
                    ready = remaining > 0 and self.poll(int(remaining * 1000))
                except (RemoteError, ServiceUnavailable):
                    self._reset()
                    raise
                if not ready:
                    self._reset()
                    raise RpcTimeout(
                        f"no reply from {self.endpoint} within "
                        f"{self.timeout_s if timeout_s is None else timeout_s:.1f}s "
                        f"(request {request_id}); is the server running?"
                    )
                frames = self.sock.recv_multipart(copy=False)
                msg = decode(frames, self.max_message_bytes)
                got = msg.header.get("id")
                if got not in self._awaited:
                    continue  # a stale reply to an earlier request that timed out
                self._awaited.discard(got)
                if not msg.header.get("ok"):
                    err = msg.header.get("error") or {}
                    code, text = str(err.get("code", "unknown")), str(err.get("message", ""))
                    self._early[got] = RemoteError(code, text)
                else:
                    self._early[got] = (msg.meta, msg.arrays)
            reply = self._early.pop(request_id)
            if isinstance(reply, RemoteError):
                raise reply
            return reply

    def call(
        self,
        op: str,
        meta: Meta | None = None,
        arrays: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> tuple[Meta, Arrays]:
        with self.lock:
            return self.receive(self.send(op, meta, arrays), timeout_s)

    def _reset(self) -> None:
        """A fresh socket: late replies to the old one must not mix with the next ones."""
        self._close_socket()
        self.sock = self._connect()
        self._awaited.clear()
        self._early.clear()

    def close(self) -> None:
        with self.lock:
            self._close_socket()

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
