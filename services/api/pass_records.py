"""A job's pass records (``keys.pass_record``) and the job fields that move with them
(``cursor``, ``in_flight``, ``passes_done``, the restart count): the API's repository of
passes. Every change that touches the job and its passes is one transaction with its events.

The lineage rules (which passes the model a job goes on from contains) are
:mod:`~streamrec.api.lineage`'s; here they are written: a rewind marks the passes trained
after the checkpoint ``rolled_back`` (their record keeps its figures, ``passes_done`` no
longer counts them) and empties the work stream.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from streamrec.api.lineage import resume_cursor
from streamrec.api.state import append_event, watched
from streamrec.api.work_queue import queue_work, queue_work_reset
from streamrec.control import keys, redis_io
from streamrec.control.records import JobField, PassField
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

    def counts(self, job_id: str, day: str, pass_id: int) -> PassCounts:
        """The record's counts (zeros for a pass never handed out)."""
        rec = keys.pass_record(job_id, day, pass_id)
        wanted = [PassField.ATTEMPTS, PassField.STATE, PassField.FAILURES, PassField.SKIPPED_SPLITS]
        attempts, state, failures, skipped = redis_io.hmget(self.r, rec, wanted)
        return PassCounts(int(attempts or 0), int(failures or 0), _list(skipped), state)

    def attempts(self, job_id: str, day: str, pass_id: int) -> tuple[int, int]:
        """(the attempt handed out last, the last attempt retired), 0 for none."""
        rec = keys.pass_record(job_id, day, pass_id)
        current, retired = redis_io.hmget(self.r, rec, [PassField.ATTEMPTS, PassField.RETIRED])
        return int(current or 0), int(retired or 0)

    def state(self, job_id: str, day: str, pass_id: int) -> str | None:
        """The pass's state (None: no record)."""
        return redis_io.hget(self.r, keys.pass_record(job_id, day, pass_id), PassField.STATE)

    def hand_out(self, job_id: str, cursor: int, item: WorkItem, failures: int) -> None:
        """Writes the pass at plan index ``cursor`` queued (a fresh record), puts ``item`` on
        the work stream and in flight, the cursor after it, and the event: one transaction."""
        p = item.spec
        pk = keys.pass_key(p.day, p.pass_id)
        rec = keys.pass_record(job_id, p.day, p.pass_id)
        now = time.time()
        record = {
            PassField.DAY: p.day,
            PassField.PASS_ID: str(p.pass_id),
            PassField.SPLITS: json.dumps(list(p.splits)),
            PassField.STATE: PassState.QUEUED.value,
            PassField.ATTEMPTS: str(item.attempt),
            PassField.FAILURES: str(failures),
            PassField.SKIPPED_SPLITS: json.dumps(list(item.skip)),
            PassField.RESUME_FROM: item.resume_from or "",
            PassField.QUEUED_AT: f"{now:.3f}",
        }
        with self.r.pipeline() as pipe:
            pipe.delete(rec)
            redis_io.hset(pipe, rec, record)
            pipe.zadd(keys.passes(job_id), {pk: cursor})
            queue_work(pipe, job_id, item.to_fields(now))
            job = {JobField.IN_FLIGHT: pk, JobField.CURSOR: str(cursor + 1)}
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
        fields = {
            PassField.STATE: PassState.RUNNING.value,
            PassField.STARTED_AT: f"{time.time():.3f}",
            PassField.RANKS: str(ranks),
        }
        redis_io.hset(self.r, keys.pass_record(job_id, day, pass_id), fields)

    def mark_done(
        self,
        job_id: str,
        day: str,
        pass_id: int,
        figures: dict[str, str],
        ranks: int,
        in_flight: bool,
        event: tuple[str, dict[str, Any]],
    ) -> None:
        """The pass done with its ``figures``, counted in ``passes_done``, out of flight
        (``in_flight``: it is the job's), the restart count refilled (progress), and its
        ``event`` (message, data)."""
        fields = {
            **figures,
            PassField.STATE: PassState.DONE.value,
            PassField.ERROR: "",
            PassField.FINISHED_AT: f"{time.time():.3f}",
            PassField.RANKS: str(ranks),
        }
        with self.r.pipeline() as pipe:
            redis_io.hset(pipe, keys.pass_record(job_id, day, pass_id), fields)
            pipe.hincrby(keys.job(job_id), JobField.PASSES_DONE, 1)
            pipe.hset(keys.job(job_id), JobField.RESTARTS, "0")
            if in_flight:
                pipe.hset(keys.job(job_id), JobField.IN_FLIGHT, "")
            append_event(pipe, job_id, "pass", *event)
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
            wanted = [PassField.ATTEMPTS, PassField.FAILURES, PassField.SKIPPED_SPLITS]
            attempts, failures, skipped = redis_io.hmget(pipe, rec, wanted)
            read = PassCounts(
                attempts=int(attempts or 1),
                failures=int(failures or 0),
                skipped=_list(skipped),
                restarts=int(redis_io.hget(pipe, job, JobField.RESTARTS) or 0),
                rolled=[n for n in self.done_after(job_id, plan, cursor) if n != pk],
            )
            out = decide(read)
            now = time.time()
            fields = {
                PassField.ERROR: reason,
                PassField.RETIRED: str(read.attempts),
                PassField.FAILURES: str(out.failures),
            }
            if out.failed_why is not None:
                fields[PassField.STATE] = PassState.FAILED.value
                fields[PassField.FINISHED_AT] = f"{now:.3f}"
            else:
                fields[PassField.STATE] = PassState.QUEUED.value
                fields[PassField.SKIPPED_SPLITS] = json.dumps(out.skipped)
            pipe.multi()
            redis_io.hset(pipe, rec, fields)
            redis_io.hset(pipe, job, {JobField.IN_FLIGHT: "", JobField.CURSOR: str(cursor)})
            queue_rollback(pipe, job_id, read.rolled, checkpoint, reason)
            if out.restart is not None:
                restart = {
                    JobField.RESTARTS: str(out.restart.n),
                    JobField.NOT_BEFORE: f"{now + out.restart.backoff_s:.3f}",
                }
                redis_io.hset(pipe, job, restart)
                pipe.hincrby(job, JobField.RESTARTS_TOTAL, 1)
            if out.failed_why is not None:
                pipe.hset(job, JobField.ERROR, f"pass {pk}: {out.failed_why}")
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
            f = redis_io.hgetall(pipe, key)
            if f.get(JobField.STATE) not in (JobState.STOPPED, JobState.FAILED):
                pipe.multi()
                return []
            ckpt = f.get(JobField.LAST_CHECKPOINT) or ""
            cursor = resume_cursor(plan, ckpt)
            rolled = self.done_after(job_id, plan, cursor)
            pipe.multi()
            fields = {JobField.CURSOR: str(cursor), JobField.IN_FLIGHT: "", JobField.RESTARTS: "0"}
            redis_io.hset(pipe, key, fields)
            queue_work_reset(pipe, job_id)
            queue_rollback(pipe, job_id, rolled, ckpt, "the job starts again from its checkpoint")
            return rolled

        return list(watched(self.r, body, key))

    def rewind_to_group(
        self, job_id: str, plan: list[PassSpec], resumed: str | None, why: str
    ) -> list[str]:
        """A trainer group (re)started at ``resumed`` (its ``started`` report's
        ``resumed_from``: the checkpoint it loaded, None: a fresh model): the passes the job
        counts done after it are not in the model the job goes on from, so they are rolled
        back, the pass in flight (if any) dropped from the work stream and the cursor put
        after ``resumed``. Returns the rolled back passes ([]: the group is where the job
        is)."""
        key = keys.job(job_id)

        def body(pipe: redis.client.Pipeline) -> list[str]:
            f = redis_io.hgetall(pipe, key)
            if f.get(JobField.STATE) not in (JobState.RUNNING, JobState.STOPPING):
                pipe.multi()
                return []
            cursor = resume_cursor(plan, resumed or "")
            rolled = self.done_after(job_id, plan, cursor)
            pipe.multi()
            if not rolled:
                return []
            redis_io.hset(pipe, key, {JobField.CURSOR: str(cursor), JobField.IN_FLIGHT: ""})
            queue_work_reset(pipe, job_id)
            queue_rollback(pipe, job_id, rolled, resumed or "", why)
            return rolled

        return list(watched(self.r, body, key))


def queue_rollback(
    pipe: redis.client.Pipeline, job_id: str, rolled: list[str], checkpoint: str, why: str
) -> None:
    """Queues (in ``pipe``, after its ``multi()``) the marks of ``rolled`` as rolled back,
    the ``passes_done`` correction and the event."""
    if not rolled:
        return
    now = f"{time.time():.3f}"
    for name in rolled:
        redis_io.hset(
            pipe,
            keys.pass_record(job_id, *keys.parse_pass_key(name)),
            {PassField.STATE: PassState.ROLLED_BACK.value, PassField.ROLLED_BACK_AT: now},
        )
    pipe.hincrby(keys.job(job_id), JobField.PASSES_DONE, -len(rolled))
    append_event(
        pipe,
        job_id,
        "rollback",
        f"pass(es) {', '.join(rolled)} rolled back to {checkpoint or 'the start'} ({why}): "
        f"they are trained again",
        {"rolled_back": rolled, "resume_from": checkpoint or None},
    )


def _list(raw: str | None) -> list[str]:
    """A JSON list field (``[]`` when missing)."""
    return list(json.loads(raw or "[]"))
