"""A job's lineage: which passes the model it goes on from contains.

A pass is ``done`` only while the model the job goes on from contains it. The job goes on
from its last checkpoint after any rewind (a start after stop or failure, a group that died,
a shard lost before a checkpoint), so the passes trained after that checkpoint are marked
``rolled_back`` (their record keeps its figures, ``passes_done`` no longer counts them) and
are handed out again, in order, from the checkpoint; an event names them. The trainer
marks the same passes in ``passes.jsonl`` when it loads the checkpoint, so REST, the file and
the events agree after every fault.
"""

from __future__ import annotations

import time

import redis
from streamrec.api.models import JobCreate
from streamrec.api.state import append_event, watched
from streamrec.control import keys, redis_io
from streamrec.control.states import JobState, PassState
from streamrec.layout import PassSpec, iter_passes


def job_plan(spec: JobCreate) -> list[PassSpec]:
    """Every pass of the job, in training order."""
    d = spec.data
    return list(
        iter_passes(d.start_day, d.end_day, d.split_interval, d.split_per_pass, d.end_split)
    )


def resume_cursor(plan: list[PassSpec], checkpoint: str | None, limit: int | None = None) -> int:
    """The plan index the job goes on from after ``checkpoint`` (0 with none), at most
    ``limit``."""
    index = {keys.pass_key(p.day, p.pass_id): i for i, p in enumerate(plan)}
    cursor = index[checkpoint] + 1 if checkpoint and checkpoint in index else 0
    return cursor if limit is None else min(cursor, limit)


def done_after(r: redis.Redis, job_id: str, plan: list[PassSpec], cursor: int) -> list[str]:
    """The passes from ``cursor`` on whose record says ``done``."""
    names = [keys.pass_key(p.day, p.pass_id) for p in plan[cursor:]]
    if not names:
        return []
    with r.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.hget(keys.pass_record(job_id, *keys.parse_pass_key(name)), "state")
        states = pipe.execute()
    return [n for n, s in zip(names, states, strict=True) if s == PassState.DONE.value]


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
            {"state": PassState.ROLLED_BACK.value, "rolled_back_at": now},
        )
    pipe.hincrby(keys.job(job_id), "passes_done", -len(rolled))
    append_event(
        pipe,
        job_id,
        "rollback",
        f"pass(es) {', '.join(rolled)} rolled back to {checkpoint or 'the start'} ({why}): "
        f"they are trained again",
        {"rolled_back": rolled, "resume_from": checkpoint or None},
    )


def queue_work_reset(pipe: redis.client.Pipeline, job_id: str) -> None:
    """Queues the drop of every pass on the job's work stream (taken or not): a rewound job
    hands its passes out again from its cursor."""
    pipe.delete(keys.work(job_id))
    pipe.xgroup_create(keys.work(job_id), keys.TRAINER_GROUP, id="0", mkstream=True)


def rewind_for_start(r: redis.Redis, job_id: str, plan: list[PassSpec]) -> list[str]:
    """Before a stopped or failed job starts again: cursor to after its last checkpoint, the
    passes trained since marked rolled back, the work stream emptied. Returns the rolled
    back passes ([] when the job is in another state or the checkpoint is the last pass)."""
    key = keys.job(job_id)

    def body(pipe: redis.client.Pipeline) -> list[str]:
        f = redis_io.hgetall(pipe, key)
        if f.get("state") not in (JobState.STOPPED, JobState.FAILED):
            pipe.multi()
            return []
        ckpt = f.get("last_checkpoint") or ""
        cursor = resume_cursor(plan, ckpt)
        rolled = done_after(r, job_id, plan, cursor)
        pipe.multi()
        redis_io.hset(pipe, key, {"cursor": str(cursor), "in_flight": "", "restarts": "0"})
        queue_work_reset(pipe, job_id)
        queue_rollback(pipe, job_id, rolled, ckpt, "the job starts again from its checkpoint")
        return rolled

    rolled = watched(r, body, key)
    return list(rolled)


def rewind_to_group(
    r: redis.Redis, job_id: str, plan: list[PassSpec], resumed: str | None, why: str
) -> list[str]:
    """A trainer group (re)started at ``resumed`` (its ``started`` report's
    ``resumed_from``: the checkpoint it loaded, None: a fresh model): the passes the job
    counts done after it are not in the model the job goes on from, so they are rolled
    back, the pass in flight (if any) dropped from the work stream and the cursor put after
    ``resumed``. Returns the rolled back passes ([]: the group is where the job is)."""
    key = keys.job(job_id)

    def body(pipe: redis.client.Pipeline) -> list[str]:
        f = redis_io.hgetall(pipe, key)
        if f.get("state") not in (JobState.RUNNING, JobState.STOPPING):
            pipe.multi()
            return []
        cursor = resume_cursor(plan, resumed or "")
        rolled = done_after(r, job_id, plan, cursor)
        pipe.multi()
        if not rolled:
            return []
        redis_io.hset(pipe, key, {"cursor": str(cursor), "in_flight": ""})
        queue_work_reset(pipe, job_id)
        queue_rollback(pipe, job_id, rolled, resumed or "", why)
        return rolled

    return list(watched(r, body, key))
