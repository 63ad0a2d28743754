"""A shard's incarnation: which life of a shard process answered, so a restart is seen.

An orchestrator (a Kubernetes StatefulSet) restarts a crashed shard at the same address,
EMPTY. Without a check its clients would go on pulling fresh rows and pushing into them: a
silently wrong model. So each shard process draws a random 64-bit id when it starts
(:func:`new_incarnation`, never 0) and the wire carries it::

    every successful reply   meta {"incarnation": <id>, ...}
    a data op's request      meta {"expect_incarnation": <id>, ...}  (when the client knows it)

A shard refuses a data op (:data:`DATA_OPS`) that expects another incarnation with
:class:`~streamrec.embedding_store.errors.ShardRestarted` before it touches its store, so a
pull creates no row and a push writes nothing there. The other ops (``ping``, ``tables``,
``size``, ``stats``, ``load``) are safe on an empty shard and always run.

:class:`Incarnations` is the client's side: the incarnation each shard first answered with,
the expectation its data ops send, and the check of every reply. A reply without the field
(a shard older than this protocol) is accepted and checks nothing. The client takes a new
incarnation only from a full load (``checkpoint``/``batch``: the shard's rows are the
checkpoint's again, the reload IS the recovery) or when told to (``accept_restarts``).
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Sequence

from streamrec.embedding_store.errors import ShardRestarted
from streamrec.errors import BadRequest, quote
from streamrec.wire import Meta

#: Reply meta field: the answering shard's incarnation.
REPLY_FIELD = "incarnation"
#: Request meta field of a data op: the incarnation the client holds for that shard.
EXPECT_FIELD = "expect_incarnation"
#: Ops that read or change the rows the job trained: refused by a restarted shard.
DATA_OPS: frozenset[str] = frozenset(
    {"pull", "push", "pull_many", "push_many", "shrink", "advance_day", "save"}
)
_LIMIT = 1 << 64


def new_incarnation() -> int:
    """A random id in [1, 2**64) for this shard process (0 means "unknown" elsewhere)."""
    return secrets.randbelow(_LIMIT - 1) + 1


def _as_id(value: object, field: str) -> int:
    if type(value) is not int or not 0 < value < _LIMIT:
        raise BadRequest(f"field {field!r} must be an integer in [1, 2**64), got {quote(value)}")
    return value


def check_request(op: str, meta: Meta, incarnation: int) -> None:
    """The shard's check of a request: a data op expecting another incarnation is refused.

    Raises:
        ShardRestarted: this process is not the one the client trained against.
        BadRequest: ``expect_incarnation`` is not an id.
    """
    if op not in DATA_OPS or meta.get(EXPECT_FIELD) is None:
        return
    expected = _as_id(meta[EXPECT_FIELD], EXPECT_FIELD)
    if expected != incarnation:
        raise ShardRestarted(
            f"{op} refused, nothing was done: this shard restarted (incarnation "
            f"{incarnation:#x}, the client trained against {expected:#x})"
        )


def reply_incarnation(meta: Meta) -> int | None:
    """Takes the incarnation out of a reply's meta; None when the shard sent none (older
    shards: accepted).

    Raises:
        BadRequest: the field is there but not an id.
    """
    value = meta.pop(REPLY_FIELD, None)
    return None if value is None else _as_id(value, REPLY_FIELD)


def restarted_message(shard: int, endpoint: str, detail: str) -> str:
    """What :class:`ShardRestarted` says on the client: the shard, and what to do."""
    return (
        f"shard {shard} ({endpoint}) restarted, its rows are gone ({detail}); the job must "
        f"reload its last checkpoint into every shard (EmbeddingStoreClient.load takes the new "
        f"incarnation), or call accept_restarts() to go on with the shards as they are"
    )


class Incarnations:
    """The incarnation each shard answered with first, held for every thread of a client.

    Args:
        endpoints: shard K's endpoint at index K (named in errors).
    """

    def __init__(self, endpoints: Sequence[str]) -> None:
        self.endpoints = list(endpoints)
        self._known: list[int | None] = [None] * len(self.endpoints)
        self._lock = threading.Lock()

    def known(self) -> list[int | None]:
        """Shard K's incarnation as this client holds it (None: not answered yet, or a shard
        that sends none)."""
        with self._lock:
            return list(self._known)

    def expect(self, shard: int, op: str, meta: Meta) -> Meta:
        """``meta`` of a request to ``shard``, with the expectation when ``op`` is a data op."""
        if op not in DATA_OPS:
            return meta
        with self._lock:
            held = self._known[shard]
        return meta if held is None else {**meta, EXPECT_FIELD: held}

    def check(self, shard: int, op: str, meta: Meta, adopt: bool = False) -> None:
        """Checks a successful reply of ``shard`` to ``op`` (its field is taken out of
        ``meta``): the first incarnation seen is held; another one raises for a data op, is
        held when ``adopt`` (a full load, ``accept_restarts``), and is let pass otherwise (a
        safe op: the client keeps expecting the old one).

        Raises:
            ShardRestarted: a data op answered by another incarnation than the one held.
        """
        got = reply_incarnation(meta)
        if got is None:
            return
        with self._lock:
            held = self._known[shard]
            if held is None or adopt:
                self._known[shard] = got
                return
        if got != held and op in DATA_OPS:
            raise ShardRestarted(
                restarted_message(
                    shard, self.endpoints[shard], f"incarnation {held:#x}, now {got:#x}"
                )
            )

    def adopt(self, incarnations: Sequence[int | None]) -> list[str]:
        """Holds ``incarnations`` (one per shard; None or 0: learn it from the next reply);
        returns the endpoints whose incarnation changed."""
        if len(incarnations) != len(self.endpoints):
            raise BadRequest(
                f"incarnations: one per shard ({len(self.endpoints)}), got {len(incarnations)}"
            )
        ids = [None if not i else _as_id(i, "incarnations") for i in incarnations]
        with self._lock:
            changed = [
                e
                for e, old, new in zip(self.endpoints, self._known, ids, strict=True)
                if old is not None and new is not None and old != new
            ]
            self._known = ids
        return changed
