"""Which clients are connected to the sampler server, for its idle exit.

A client that holds its connection open but sends nothing for a while (a trainer between
passes) is still there: the idle exit must not take its server (and its table) away. The
server's ROUTER socket is watched with a ZeroMQ socket monitor: a peer counts from the
accepted connection until it closes (the events name the connection's file descriptor; a
handshake's do not, and a peer the token refuses is disconnected at once).
ZMTP heartbeats on the socket (``HEARTBEAT_IVL_MS``, ``HEARTBEAT_TIMEOUT_MS``) close the
connection of a peer that stopped answering without closing it (its host gone, its process
frozen), so such a peer stops counting too.
"""

from __future__ import annotations

import threading
import time

import zmq
from zmq.utils.monitor import parse_monitor_message

#: How often the server pings each peer, and how long without any traffic from a peer
#: (a live peer's ZeroMQ answers the pings by itself) before its connection is closed.
HEARTBEAT_IVL_MS = 5_000
HEARTBEAT_TIMEOUT_MS = 30_000


class ClientPresence:
    """Counts the peers connected to ``sock`` (a bound server socket) from a thread.

    Attach it before the socket is used by another thread: ZeroMQ sockets are not
    thread-safe, and the monitor and the heartbeat options are set here.

    Args:
        sock: the server's front-end socket.
    """

    def __init__(self, sock: zmq.Socket) -> None:
        sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        self._monitor = sock.get_monitor_socket(
            zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_MONITOR_STOPPED
        )
        self._peers: set[int] = set()  # the file descriptors of connected peers
        self._left_at = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sampler-presence", daemon=True)

    def start(self) -> ClientPresence:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def connected(self) -> int:
        """Peers connected now."""
        with self._lock:
            return len(self._peers)

    def absent_seconds(self) -> float:
        """Seconds since the last peer left (or since the start); 0 while one is connected."""
        with self._lock:
            return 0.0 if self._peers else time.monotonic() - self._left_at

    def _watch(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._monitor.poll(200):
                    continue
                event = parse_monitor_message(self._monitor.recv_multipart())
                kind, fd = event["event"], event["value"]
                if kind == zmq.EVENT_MONITOR_STOPPED:
                    break
                with self._lock:
                    if kind == zmq.EVENT_ACCEPTED:
                        self._peers.add(fd)
                    elif fd in self._peers:
                        self._peers.discard(fd)
                        if not self._peers:
                            self._left_at = time.monotonic()
        except zmq.ZMQError:  # the context terminated: the server is stopping
            pass
        finally:
            self._monitor.close(linger=0)
