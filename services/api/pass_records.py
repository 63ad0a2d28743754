"""A job's pass records (``keys.pass_record``) and the job fields that move with them
(``cursor``, ``in_flight``, ``passes_done``, the restart count): the API's repository of
passes. Every change that touches the job and its passes is one transaction with its events.

The lineage rules (which passes the model a job goes on from contains) are
:mod:`~streamrec.api.lineage`'s; here they are written: a rewind marks the passes trained
after the checkpoint ``rolled_back`` (their record keeps its figures, ``passes_done`` no
longer counts them) and empties the work stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import redis
from streamrec.api.lineage import resume_cursor
from streamrec.api.state import append_event, watched
from streamrec.api.work_queue import queue_work, queue_work_reset
from streamrec.control import keys, redis_io
from streamrec.control.records import JobField, JobRecord, PassField, PassRecord
from streamrec.control.states import JobState, PassState
from streamrec.control.work import WorkItem
from streamrec.layout import PassSpec


@dataclass(frozen=True)
class PassCounts:
    """A pass record's counts, read before it is handed out or requeued."""

    #: the attempt handed out last (0: never handed out)
    attempts: int
    failures: int
    skipped: list[str]
    state: str | None = None
    #: the job's infrastructure restarts in a row (read by a requeue)
    restarts: int = 0
    #: passes done after the cursor a requeue goes back to, the pass requeued left out
    rolled: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Restart:
    """An infrastructure restart of the job's group: ``n`` in a row, the next hand-out not
    before ``backoff_s`` from now."""

    n: int
    backoff_s: float


class RequeueCause(Enum):
    """Why the pass in flight goes back from the last checkpoint (``Scheduler.requeue``),
    which says what it counts against."""

    #: the pass's own failure (a transient error): counted, a second one fails the job
    PASS_FAILED = "pass_failed"
    #: bad data under ``on_bad_split: fail``: a retry cannot pass, the job fails at once
    BAD_DATA = "bad_data"
    #: bad splits under ``on_bad_split: skip``: handed out again without them, no failure
    SKIP_SPLITS = "skip_splits"
    #: the trainer group died, was killed, stuck or released the pass: no failure of the
    #: pass but an infrastructure restart (the job's restart budget, backoff)
    RESTART = "restart"
    #: the job goes back through no fault of the pass or the group (a store shard restarted
    #: empty): neither a failure nor a restart
    REWIND = "rewind"

    @property
    def counts_failure(self) -> bool:
        return self in (RequeueCause.PASS_FAILED, RequeueCause.BAD_DATA)


@dataclass(frozen=True)
class Requeue:
    """What a requeue writes, decided from the :class:`PassCounts` it read."""

    failures: int
    skipped: list[str]
    #: why the pass failed the job (None: it is handed out again)
    failed_why: str | None
    restart: Restart | None
    #: (kind, message, data) of each event, in order, after the rollback's
    events: list[tuple[str, str, dict[str, Any]]]


class PassRecords:
    """A job's passes in Redis.

    Args:
        r: a client with ``decode_responses=True``.
    """

    def __init__(self, r: redis.Redis) -> None:
        self.r = r

    def record(self, job_id: str, day: str, pass_id: int) -> PassRecord:
        """The pass's record (every field empty for a pass never handed out)."""
        return PassRecord.from_fields(
            redis_io.hgetall(self.r, keys.pass_record(job_id, day, pass_id))
        )

    def counts(self, job_id: str, day: str, pass_id: int) -> PassCounts:
        """The record's counts (zeros for a pass never handed out)."""
        rec = self.record(job_id, day, pass_id)
        state = None if rec.state is None else rec.state.value
        return PassCounts(rec.attempts, rec.failures, list(rec.skipped_splits), state)

    def attempts(self, job_id: str, day: str, pass_id: int) -> tuple[int, int]:
        """(the attempt handed out last, the last attempt retired), 0 for none."""
        rec = self.record(job_id, day, pass_id)
        return rec.attempts, rec.retired

    def state(self, job_id: str, day: str, pass_id: int) -> str | None:
        """The pass's state (None: no record)."""
        state = self.record(job_id, day, pass_id).state
        return None if state is None else state.value

    def hand_out(self, job_id: str, cursor: int, item: WorkItem, failures: int) -> None:
        """Writes the pass at plan index ``cursor`` queued (a fresh record), puts ``item`` on
        the work stream and in flight, the cursor after it, and the event: one transaction."""
        p = item.spec
        pk = keys.pass_key(p.day, p.pass_id)
        rec = keys.pass_record(job_id, p.day, p.pass_id)
        now = time.time()
        record = PassRecord.patch(
            day=p.day,
            pass_id=p.pass_id,
            splits=tuple(p.splits),
            state=PassState.QUEUED,
            attempts=item.attempt,
            failures=failures,
            skipped_splits=item.skip,
            resume_from=item.resume_from,
            queued_at=now,
        )
        with self.r.pipeline() as pipe:
            pipe.delete(rec)
            redis_io.hset(pipe, rec, record)
            pipe.zadd(keys.passes(job_id), {pk: cursor})
            queue_work(pipe, job_id, item.to_fields(now))
            job = JobRecord.patch(in_flight=pk, cursor=cursor + 1)
            redis_io.hset(pipe, keys.job(job_id), job)
            append_event(
                pipe,
                job_id,
                "pass",
                f"pass {pk} handed out (attempt {item.attempt})",
                {"pass": pk, "attempt": item.attempt, "resume_from": item.resume_from or None},
            )
            pipe.execute()

    def mark_running(self, job_id: str, day: str, pass_id: int, ranks: int) -> None:
        fields = PassRecord.patch(state=PassState.RUNNING, started_at=time.time(), ranks=ranks)
        redis_io.hset(self.r, keys.pass_record(job_id, day, pass_id), fields)

    def mark_done(
        self,
        job_id: str,
        day: str,
        pass_id: int,
        figures: Mapping[PassField, int | float],
        ranks: int,
        in_flight: bool,
        event: tuple[str, dict[str, Any]],
        more_events: Sequence[tuple[str, str, dict[str, Any]]] = (),
    ) -> None:
        """The pass done with its ``figures`` (of :data:`~streamrec.control.records.PASS_METRICS`),
        counted in ``passes_done``, out of flight (``in_flight``: it is the job's), the restart
        count refilled (progress), its ``event`` (message, data) and ``more_events`` (kind,
        message, data: what the pass's figures say besides, after it). ContractError (nothing
        written) for a figure of the wrong type."""
        fields = PassRecord.patch(
            **{name.value: v for name, v in figures.items()},
            state=PassState.DONE,
            error=None,
            finished_at=time.time(),
            ranks=ranks,
        )
        job = JobRecord.patch(restarts=0, **({"in_flight": None} if in_flight else {}))
        with self.r.pipeline() as pipe:
            redis_io.hset(pipe, keys.pass_record(job_id, day, pass_id), fields)
            pipe.hincrby(keys.job(job_id), JobField.PASSES_DONE, 1)
            redis_io.hset(pipe, keys.job(job_id), job)
            append_event(pipe, job_id, "pass", *event)
            for kind, message, data in more_events:
                append_event(pipe, job_id, kind, message, data)
            pipe.execute()

    def requeue(
        self,
        job_id: str,
        pk: str,
        plan: list[PassSpec],
        cursor: int,
        checkpoint: str,
        reason: str,
        decide: Callable[[PassCounts], Requeue],
    ) -> Requeue:
        """Takes the pass ``pk`` out of flight, the cursor back to plan index ``cursor`` (after
        ``checkpoint``) and the passes done since rolled back; its record queued again or
        failed, as ``decide`` says from the counts read: one transaction under WATCH of the
        record and the job (``decide`` runs again when either changed)."""
        rec = keys.pass_record(job_id, *keys.parse_pass_key(pk))
        job = keys.job(job_id)

        def body(pipe: redis.client.Pipeline) -> Requeue:
            record = PassRecord.from_fields(redis_io.hgetall(pipe, rec))
            read = PassCounts(
                attempts=record.attempts or 1,
                failures=record.failures,
                skipped=list(record.skipped_splits),
                restarts=JobRecord.from_fields(redis_io.hgetall(pipe, job)).restarts,
                rolled=[n for n in self.done_after(job_id, plan, cursor) if n != pk],
            )
            out = decide(read)
            now = time.time()
            if out.failed_why is not None:
                ended: dict[str, Any] = {"state": PassState.FAILED, "finished_at": now}
            else:
                ended = {"state": PassState.QUEUED, "skipped_splits": tuple(out.skipped)}
            fields = PassRecord.patch(
                error=reason, retired=read.attempts, failures=out.failures, **ended
            )
            pipe.multi()
            redis_io.hset(pipe, rec, fields)
            redis_io.hset(pipe, job, JobRecord.patch(in_flight=None, cursor=cursor))
            queue_rollback(pipe, job_id, read.rolled, checkpoint, reason)
            if out.restart is not None:
                backoff = now + out.restart.backoff_s
                restart = JobRecord.patch(restarts=out.restart.n, not_before=backoff)
                redis_io.hset(pipe, job, restart)
                pipe.hincrby(job, JobField.RESTARTS_TOTAL, 1)
            if out.failed_why is not None:
                failed = JobRecord.patch(error=f"pass {pk}: {out.failed_why}")
                redis_io.hset(pipe, job, failed)
            for kind, message, data in out.events:
                append_event(pipe, job_id, kind, message, data)
            return out

        return watched(self.r, body, rec, job)

    # ---- lineage ----------------------------------------------------------------------
    def done_after(self, job_id: str, plan: list[PassSpec], cursor: int) -> list[str]:
        """The passes from ``cursor`` on whose record says ``done``."""
        names = [keys.pass_key(p.day, p.pass_id) for p in plan[cursor:]]
        if not names:
            return []
        with self.r.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hget(keys.pass_record(job_id, *keys.parse_pass_key(name)), PassField.STATE)
            states = pipe.execute()
        return [n for n, s in zip(names, states, strict=True) if s == PassState.DONE.value]

    def rewind_for_start(self, job_id: str, plan: list[PassSpec]) -> list[str]:
        """Before a stopped or failed job starts again: cursor to after its last checkpoint,
        the passes trained since marked rolled back, the work stream emptied. Returns the
        rolled back passes ([] when the job is in another state or the checkpoint is the
        last pass)."""
        key = keys.job(job_id)

        def body(pipe: redis.client.Pipeline) -> list[str]:
            f = JobRecord.from_fields(redis_io.hgetall(pipe, key))
            if f.state not in (JobState.STOPPED, JobState.FAILED):
                pipe.multi()
                return []
            ckpt = f.last_checkpoint or ""
            cursor = resume_cursor(plan, ckpt)
            rolled = self.done_after(job_id, plan, cursor)
            pipe.multi()
            fields = JobRecord.patch(cursor=cursor, in_flight=None, restarts=0)
            redis_io.hset(pipe, key, fields)
            queue_work_reset(pipe, job_id)
            queue_rollback(pipe, job_id, rolled, ckpt, "the job starts again from its checkpoint")
            return rolled

        return list(watched(self.r, body, key))

    def rewind_to_group(
        self,
        job_id: str,
        plan: list[PassSpec],
        resumed: str | None,
        why: str,
        restart: Callable[[int], Restart],
    ) -> tuple[list[str], Restart | None]:
        """A trainer group (re)started at ``resumed`` (its ``started`` report's
        ``resumed_from``: the checkpoint it loaded, None: a fresh model): the passes the job
        counts done after it are not in the model the job goes on from, so they are rolled
        back, the pass in flight (if any) dropped from the work stream and the cursor put
        after ``resumed``. Passes to roll back mean the group that trained them is gone: an
        infrastructure restart, ``restart(n)`` for the ``n``-th in a row (counted, backoff,
        a ``restart`` event, in the same transaction). A restart already seen another way
        (a requeue of the pass in flight) rewound the job first and leaves nothing to roll
        back here, so it is counted once. Returns the rolled back passes ([]: the group is
        where the job is) and the restart (None with [])."""
        key = keys.job(job_id)

        def body(pipe: redis.client.Pipeline) -> tuple[list[str], Restart | None]:
            f = JobRecord.from_fields(redis_io.hgetall(pipe, key))
            if f.state not in (JobState.RUNNING, JobState.STOPPING):
                pipe.multi()
                return [], None
            cursor = resume_cursor(plan, resumed or "")
            rolled = self.done_after(job_id, plan, cursor)
            pipe.multi()
            if not rolled:
                return [], None
            out = restart(f.restarts + 1)
            fields = JobRecord.patch(
                cursor=cursor,
                in_flight=None,
                restarts=out.n,
                not_before=time.time() + out.backoff_s,
            )
            redis_io.hset(pipe, key, fields)
            pipe.hincrby(key, JobField.RESTARTS_TOTAL, 1)
            queue_work_reset(pipe, job_id)
            queue_rollback(pipe, job_id, rolled, resumed or "", why)
            append_event(
                pipe,
                job_id,
                "restart",
                f"trainer group restart {out.n} in a row ({why}, passes trained after it "
                f"lost); next pass in {out.backoff_s:.1f} s",
                {"restarts": out.n, "backoff_s": out.backoff_s},
            )
            return list(rolled), out

        return watched(self.r, body, key)


def queue_rollback(
    pipe: redis.client.Pipeline, job_id: str, rolled: list[str], checkpoint: str, why: str
) -> None:
    """Queues (in ``pipe``, after its ``multi()``) the marks of ``rolled`` as rolled back,
    the ``passes_done`` correction and the event."""
    if not rolled:
        return
    fields = PassRecord.patch(state=PassState.ROLLED_BACK, rolled_back_at=time.time())
    for name in rolled:
        redis_io.hset(pipe, keys.pass_record(job_id, *keys.parse_pass_key(name)), fields)
    pipe.hincrby(keys.job(job_id), JobField.PASSES_DONE, -len(rolled))
    append_event(
        pipe,
        job_id,
        "rollback",
        f"pass(es) {', '.join(rolled)} rolled back to {checkpoint or 'the start'} ({why}): "
        f"they are trained again",
        {"rolled_back": rolled, "resume_from": checkpoint or None},
    )
