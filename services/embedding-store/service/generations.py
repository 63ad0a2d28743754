"""Generation fencing: a trainer group that lost its job must not write into the new group's rows.

A group of the trainer pool runs a job under an assignment whose ``generation`` only grows
(the API draws it from one Redis counter, ``keys.POOL_GENERATION``, at every assignment).
The group's store client sends it with every namespaced request (meta ``generation``). A
shard remembers, per namespace, the newest generation it has seen: a request of an older
one is refused (``stale_generation``) before it touches the store, a newer one raises the
fence. So a group that froze (SIGSTOP, a descheduled VM, a long GC) while the API gave its
job to another group cannot, once it wakes, push gradients, load a checkpoint or save into
the rows the new group trains: no socket closed and no process exited, yet every write it
still believes it may make is refused, and it stops (the agent returns the group to the pool).

A request without a generation (a job pinned to its group with ``--job-id``, the CLI, tools)
is not fenced: a pinned group is the only one ever running its job, and a group restarted by
torchrun reuses its assignment (its old ranks are dead). Dropping a namespace forgets its
fence; a shard restarted empty starts without fences (its rows are gone: the incarnation check,
:mod:`~streamrec.embedding_store.service.incarnation`, refuses the old clients there).
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator

from streamrec.embedding_store.errors import StaleGeneration
from streamrec.errors import BadRequest, quote
from streamrec.wire import Meta

#: The request meta field that carries the sender's generation.
GENERATION_FIELD = "generation"
#: Largest generation accepted (an int64, so msgpack and Redis agree on it).
MAX_GENERATION = 2**63 - 1


def request_generation(meta: Meta) -> int | None:
    """The request's generation; None when it carries none.

    Raises:
        BadRequest: the field is there but not an integer in [0, 2**63).
    """
    value = meta.get(GENERATION_FIELD)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GENERATION:
        raise BadRequest(
            f"field {GENERATION_FIELD!r} must be an integer in [0, 2**63), got {quote(value)}"
        )
    return value


class GenerationFence:
    """The newest generation seen per namespace, the check of each request against it, and
    the requests of each generation in flight.

    A shard runs requests on several worker threads, so an older generation's push that
    passed the check may still be writing when the newer generation's first request comes
    (a shard that thaws with both groups' requests on its sockets). That first request waits
    until the older ones in flight are done: every write of an old group either ends before
    the new group's first request runs, or is refused."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._newest: dict[str, int] = {}
        self._in_flight: dict[str, collections.Counter[int]] = {}

    @contextlib.contextmanager
    def admit(self, op: str, namespace: str, meta: Meta) -> Iterator[None]:
        """Runs the body of ``op`` on ``namespace`` as a request of its generation: refused
        when older than the newest seen there; a newer one becomes the newest, once the older
        requests in flight have ended.

        Raises:
            StaleGeneration: an older generation (nothing was done).
            BadRequest: the generation field is malformed.
        """
        generation = request_generation(meta)
        if generation is None:
            yield
            return
        with self._changed:
            newest = self._newest.get(namespace, -1)
            if generation < newest:
                raise StaleGeneration(
                    f"{op} refused, nothing was done: namespace {namespace!r} belongs to "
                    f"generation {newest}, this request's is {generation} (its trainer group "
                    f"lost the job to a newer assignment)"
                )
            self._newest[namespace] = generation  # from now on the older ones are refused
            busy = self._in_flight.setdefault(namespace, collections.Counter())
            # busy holds the generations with requests in flight (a count of 0 is removed)
            self._changed.wait_for(lambda: not any(g < generation for g in busy))
            busy[generation] += 1
        try:
            yield
        finally:
            with self._changed:
                busy[generation] -= 1
                if not busy[generation]:
                    del busy[generation]
                    self._changed.notify_all()

    def newest(self, namespace: str) -> int | None:
        """The newest generation seen on ``namespace`` (None: no fenced request yet)."""
        with self._changed:
            return self._newest.get(namespace)

    def forget(self, namespace: str) -> None:
        """Drops ``namespace``'s fence (the namespace was dropped)."""
        with self._changed:
            self._newest.pop(namespace, None)
            if not self._in_flight.get(namespace):  # requests in flight keep their own count
                self._in_flight.pop(namespace, None)
