"""``ShardLink``: the embedding store client's sockets to its N shards (the transport).

Every request of a call is sent to its shard at once, then every reply is received in order
and matched to its request; an error is named by its shard and endpoint.

Threads: the client may be shared by several threads (a prefetch thread pulls while the main
thread pushes). Each thread gets its own ZeroMQ socket per shard (``threading.local``), so
requests of different threads are in flight at the same time and never see each other's
replies. A thread's sockets are closed when the thread ends (with its ``threading.local``)
or at :meth:`ShardLink.close` (the client's ``close``), which closes those of every thread.

Failures: a request that fails on one shard raises after every shard has answered; the other
shards may have applied their part (a push is then partly applied, as with any parameter
server; the client refuses malformed input before sending to avoid that in the common case).

Restarts: the link holds the incarnation each shard first answered with
(:mod:`~streamrec.embedding_store.service.incarnation`). A shard restarted empty at the same address
answers its next data op (pull, push, shrink, advance_day, save) with
:class:`~streamrec.embedding_store.errors.ShardRestarted` and does nothing; ``ping``,
``size``, ``stats`` and ``load`` run. A full :meth:`EmbeddingStoreClient.load` (a checkpoint)
takes the new incarnation, as :meth:`EmbeddingStoreClient.accept_restarts` does.

Namespaces: every request but ``ping`` carries the client's namespace, and with it the
client's generation when it has one (a shard refuses an older one: ``StaleGeneration``).
"""

from __future__ import annotations

import os
import threading
import weakref

from streamrec.auth import load_token
from streamrec.embedding_store.errors import ShardRestarted, StaleGeneration, UnknownNamespace
from streamrec.embedding_store.service.generations import GENERATION_FIELD
from streamrec.embedding_store.service.incarnation import Incarnations, restarted_message
from streamrec.errors import BadRequest, RemoteError
from streamrec.wire import DEFAULT_MAX_MESSAGE_BYTES, Arrays, Meta, RpcClient

#: (shard, op, meta, arrays) of one request
Request = tuple[int, str, Meta, Arrays]


class _ThreadSockets:
    """One thread's RpcClients; closed when the thread ends and its local storage goes."""

    def __init__(self, clients: list[RpcClient]) -> None:
        self.clients = clients

    def __del__(self) -> None:
        for c in self.clients:
            c.close()


class ShardLink:
    """Sockets to every shard, one set per thread, and the incarnation each shard has.

    Args:
        endpoints: shard K's ZeroMQ endpoint at index K.
        timeout_s: per request and shard.
        max_message_bytes: cap on one message each way.
        token: the shards' peer token.
        namespace: sent with every request but ``ping`` ("" sends none).
        generation: the trainer group's assignment, sent with the namespace (None: none;
            :mod:`~streamrec.embedding_store.service.generations`).
    """

    def __init__(
        self,
        endpoints: list[str],
        timeout_s: float,
        max_message_bytes: int,
        token: str,
        namespace: str,
        generation: int | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.namespace = namespace
        self.timeout_s = timeout_s
        self.max_message_bytes = max_message_bytes
        # added to every request but ping (one dict merge per request, nothing per key)
        self._ns_meta: Meta = {"namespace": namespace} if namespace else {}
        if namespace and generation is not None:
            self._ns_meta[GENERATION_FIELD] = generation
        self._token = token
        self._local = threading.local()
        # weak: the sockets of a thread that ended go with its threading.local storage
        self._all_clients: weakref.WeakSet[RpcClient] = weakref.WeakSet()
        self._clients_lock = threading.Lock()
        self._closed = False
        self.incarnations = Incarnations(endpoints)

    def _clients(self) -> list[RpcClient]:
        """This thread's RpcClient per shard (made on first use)."""
        if self._closed:
            raise BadRequest("the EmbeddingStoreClient is closed")
        held = getattr(self._local, "sockets", None)
        if held is None:
            held = _ThreadSockets(
                [
                    RpcClient(
                        e,
                        timeout_s=self.timeout_s,
                        max_message_bytes=self.max_message_bytes,
                        token=self._token,
                    )
                    for e in self.endpoints
                ]
            )
            with self._clients_lock:
                self._all_clients.update(held.clients)
            self._local.sockets = held
        return held.clients

    def exchange(
        self, requests: list[tuple[int, str, Meta, Arrays]], adopt: bool = False
    ) -> list[tuple[Meta, Arrays]]:
        """Sends every (shard, op, meta, arrays) at once, then receives every reply in order.

        Each reply's shard incarnation is checked (``adopt``: taken as the one to expect, see
        :class:`~streamrec.embedding_store.service.incarnation.Incarnations`). Raises the first
        error (a :class:`ShardRestarted` before any other) only after every reply is in (or timed
        out), so no reply is left behind on a socket.
        """
        clients = self._clients()
        known = self.incarnations
        sent: list[tuple[int, str, int | None, BaseException | None]] = []
        for shard, op, meta, arrays in requests:
            if self._ns_meta and op != "ping":
                meta = {**meta, **self._ns_meta}
            try:
                sent_id = clients[shard].send(op, known.expect(shard, op, meta), arrays)
                sent.append((shard, op, sent_id, None))
            except Exception as exc:  # refused before sending (e.g. over the size cap)
                sent.append((shard, op, None, exc))
        replies: list[tuple[Meta, Arrays]] = []
        error: BaseException | None = None
        for shard, op, request_id, failure in sent:
            if failure is None and request_id is not None:
                try:
                    reply = clients[shard].receive(request_id)
                    known.check(shard, op, reply[0], adopt)
                    replies.append(reply)
                    continue
                except Exception as exc:
                    failure = exc
            replies.append(({}, {}))
            if isinstance(failure, RemoteError) and failure.code == UnknownNamespace.code:
                failure = UnknownNamespace(
                    f"shard {shard} ({self.endpoints[shard]}) holds no namespace "
                    f"{self.namespace!r}: it restarted empty, or the namespace was dropped "
                    f"({failure.remote_message}); reload the job's last checkpoint "
                    f"(EmbeddingStoreClient.load makes its tables again) or call "
                    f"accept_restarts() to go on with fresh rows"
                )
            elif isinstance(failure, RemoteError) and failure.code == StaleGeneration.code:
                failure = StaleGeneration(
                    f"shard {shard} ({self.endpoints[shard]}): {failure.remote_message}"
                )
            elif isinstance(failure, RemoteError) and failure.code == ShardRestarted.code:
                failure = ShardRestarted(
                    restarted_message(shard, self.endpoints[shard], failure.remote_message)
                )
            elif isinstance(failure, RemoteError):
                failure.args = (f"shard {shard} ({self.endpoints[shard]}): {failure}",)
            if error is None or (
                isinstance(failure, ShardRestarted) and not isinstance(error, ShardRestarted)
            ):
                error = failure
        if error is not None:
            raise error
        return replies

    def broadcast(self, op: str, meta: Meta | None = None, adopt: bool = False) -> list[Meta]:
        """Sends ``op`` with ``meta`` to every shard; their reply metas in shard order."""
        requests: list[tuple[int, str, Meta, Arrays]] = [
            (k, op, meta or {}, {}) for k in range(len(self.endpoints))
        ]
        return [m for m, _ in self.exchange(requests, adopt)]

    def open_sockets(self) -> int:
        """Sockets open now over every thread (those of ended threads are closed)."""
        with self._clients_lock:
            return len(self._all_clients)

    def close(self) -> None:
        """Closes the sockets of every thread; the link is unusable afterwards."""
        self._closed = True
        with self._clients_lock:
            for c in list(self._all_clients):
                c.close()
            self._all_clients.clear()


def shard_count(
    endpoint: str, timeout_s: float = 10.0, auth_token_file: str | os.PathLike[str] | None = None
) -> int:
    """The number of shards the shard at ``endpoint`` says the store has (its ``ping``): how
    a trainer finds that a job's store now runs another shard count.

    Raises:
        RemoteError / ServiceUnavailable: the shard refused or did not answer.
    """
    link = ShardLink(
        [endpoint], timeout_s, DEFAULT_MAX_MESSAGE_BYTES, load_token(auth_token_file), ""
    )
    try:
        count = link.broadcast("ping")[0].get("num_shards")
    finally:
        link.close()
    if not isinstance(count, int) or count < 1:
        raise RemoteError("bad_reply", f"{endpoint}: ping says num_shards {count!r}")
    return count
