"""The API's repository: the only API modules that call Redis are this one, the ones it
holds (:mod:`~streamrec.api.pass_records` the passes, :mod:`~streamrec.api.work_queue` the
work and report streams and the scheduler's lease, :mod:`~streamrec.api.pool_records` the
trainer pool) and :mod:`~streamrec.api.state` (the state machine's transaction).

Here: jobs, triggers, events and heartbeats. Every write that touches more than one key is
one MULTI/EXEC, so a crash of the API between two calls never leaves a half-written job. Key
names come from :mod:`streamrec.control.keys`, hash fields from
:mod:`streamrec.control.records`.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from streamrec.api.config import Settings
from streamrec.api.errors import (
    InvalidTransition,
    JobNotFound,
    PassNotFound,
    SpecInvalid,
    TriggerNotFound,
)
from streamrec.api.lineage import job_plan
from streamrec.api.models import JobCreate, TriggerCreate, stored_spec
from streamrec.api.pass_records import PassRecords
from streamrec.api.pool_records import PoolRecords
from streamrec.api.public import (
    EventsPublic,
    JobPublic,
    JobsPublic,
    PassesPublic,
    PassPublic,
    TriggerPublic,
    TriggersPublic,
    WorkerPublic,
    event_public,
    job_public,
    pass_public,
    trigger_public,
)
from streamrec.api.spec_checks import (
    SpecPolicy,
    check_spec,
    model_path_clash,
    trainer_config,
)
from streamrec.api.state import (
    ACTIVE_STATES,
    JobAction,
    JobState,
    TriggerState,
    append_event,
    change_state,
    next_state,
    watched,
)
from streamrec.api.work_queue import SchedulerLease, WorkQueue
from streamrec.control import keys, redis_io
from streamrec.control.commands import Command, CommandType
from streamrec.control.pool import NamespaceDrop
from streamrec.control.records import JobField, JobRecord, PassRecord, TriggerRecord
from streamrec.control.trainer_config import END_LANDED, OnlineMode
from streamrec.layout import count_passes


def connect(settings: Settings) -> redis.Redis:
    """A client that gives up after ``redis_timeout_s`` instead of hanging."""
    return redis.Redis.from_url(
        settings.redis_url,
        password=settings.redis_password(),
        decode_responses=True,
        socket_timeout=settings.redis_timeout_s,
        socket_connect_timeout=settings.redis_timeout_s,
        health_check_interval=30,
        # rides out a Redis restart; requests meanwhile wait, then get 503
        retry=redis_io.reconnecting(outage_s=settings.redis_outage_s),
    )


class Repo:
    """The API's view of Redis.

    Args:
        r: a client with ``decode_responses=True``.
        policy: what a job may name (roots, endpoints, Redis URLs, binds); the default
            allows nothing beyond the node.
    """

    def __init__(self, r: redis.Redis, policy: SpecPolicy | None = None) -> None:
        self.r = r
        self.policy = policy or SpecPolicy()
        self.passes = PassRecords(r)
        self.work = WorkQueue(r)
        self.pool = PoolRecords(r)

    def close(self) -> None:
        """Closes the client's connections (the API is stopping)."""
        self.r.close()

    def ping(self) -> None:
        """Raises redis.ConnectionError or TimeoutError when Redis does not answer."""
        self.r.ping()

    def lease(self, owner: str) -> SchedulerLease:
        """The scheduler's lease, held by ``owner``."""
        return SchedulerLease(self.r, owner)

    # ---- jobs -------------------------------------------------------------------------
    def create_job(self, spec: JobCreate) -> JobPublic:
        """Stores a new job in state ``created`` with its streams and consumer groups."""
        spec = check_spec(spec, self.policy)  # a copy, its paths resolved
        if spec.data.end_split == END_LANDED:  # stored as the split it is now: a fixed plan
            end = spec.data.landed_end()
            if end is None:
                raise SpecInvalid(
                    [
                        (
                            "data.end_split",
                            "no split has landed under data.train_data_dir",
                            END_LANDED,
                        )
                    ]
                )
            spec.data.end_day, spec.data.end_split = end
        job_id = uuid.uuid4().hex[:16]
        trainer = trainer_config(spec, job_id, self.policy)
        d = spec.data  # the pass count is computed (days x passes a day), never counted
        now = time.time()
        record = JobRecord(
            id=job_id,
            name=spec.name,
            spec=spec.model_dump_json(),
            trainer_config=json.dumps(trainer),
            state=JobState.CREATED,
            created_at=now,
            updated_at=now,
            passes_total=count_passes(
                d.start_day, d.end_day, d.split_interval, d.split_per_pass, d.end_split
            ),
        )
        model_path = spec.checkpoint.model_save_path

        def create(pipe: redis.client.Pipeline) -> None:
            # one model path, one job: checked and claimed in one transaction, so of two
            # concurrent creates naming one path the second sees the first and gets a 409
            paths, unindexed = live_model_paths(pipe)
            clash = model_path_clash(model_path, paths)
            if clash is not None:
                raise clash
            pipe.multi()
            redis_io.hset(pipe, keys.MODEL_PATHS, {**unindexed, job_id: model_path})
            redis_io.hset(pipe, keys.job(job_id), record.to_fields())
            pipe.zadd(keys.JOBS, {job_id: now})
            pipe.sadd(keys.jobs_in_state(JobState.CREATED.value), job_id)
            pipe.xgroup_create(keys.work(job_id), keys.TRAINER_GROUP, id="0", mkstream=True)
            pipe.xgroup_create(keys.commands(job_id), keys.TRAINER_GROUP, id="0", mkstream=True)
            pipe.xgroup_create(keys.reports(job_id), keys.API_GROUP, id="0", mkstream=True)
            append_event(pipe, job_id, "state", "created", {"to": "created"})

        watched(self.r, create, keys.JOBS, keys.MODEL_PATHS)
        return self.get_job(job_id)

    def _job_fields(self, job_id: str) -> dict[str, str]:
        """The job's hash; JobNotFound when there is no such job."""
        fields = redis_io.hgetall(self.r, keys.job(job_id))
        if not fields:
            raise JobNotFound(f"job {job_id!r} not found")
        return fields

    def job_record(self, job_id: str) -> JobRecord:
        """The job's record; JobNotFound when there is no such job."""
        return JobRecord.from_fields(self._job_fields(job_id))

    def job_spec(self, job_id: str) -> JobCreate:
        return stored_spec(self.job_record(job_id).spec)

    def get_job(self, job_id: str) -> JobPublic:
        return job_public(self.job_record(job_id))

    def list_jobs(self, state: JobState | None, offset: int, limit: int) -> JobsPublic:
        if state is None:
            total = int(self.r.zcard(keys.JOBS))
            ids = redis_io.zrange(self.r, keys.JOBS, offset, offset + limit - 1)
        else:
            members = redis_io.smembers(self.r, keys.jobs_in_state(state.value))
            scores = self.r.zmscore(keys.JOBS, list(members)) if members else []
            ordered = sorted(zip(members, scores, strict=True), key=lambda m: (m[1] or 0, m[0]))
            total = len(ordered)
            ids = [m[0] for m in ordered[offset : offset + limit]]
        with self.r.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hgetall(keys.job(job_id))
            rows = pipe.execute()
        jobs = [job_public(JobRecord.from_fields(f)) for f in rows if f]
        return JobsPublic(data=jobs, count=total)

    def act(self, job_id: str, action: JobAction) -> JobPublic:
        """Applies an operator action (start, stop, pause, resume) to a job."""
        command = Command(CommandType.STOP, ts=time.time()) if action == JobAction.STOP else None
        extra = None
        if action == JobAction.START:
            rec = self.job_record(job_id)
            spec = stored_spec(rec.spec)
            self._check_model_path(job_id, spec.checkpoint.model_save_path)
            start: dict[str, Any] = {"error": None, "started_at": time.time()}
            if not rec.trainer_config:  # a job stored before the API kept it
                start["trainer_config"] = json.dumps(trainer_config(spec, job_id, self.policy))
            extra = JobRecord.patch(**start)
            # a stopped or failed job goes on from its last checkpoint: what was trained
            # after it is rolled back and trained again (lineage.py)
            self.passes.rewind_for_start(job_id, job_plan(spec))
        change_state(self.r, job_id, action, reason="operator", extra=extra, command=command)
        return self.get_job(job_id)

    def _check_model_path(self, job_id: str, path: str) -> None:
        """ModelPathTaken (409) when another live job's model path is, holds or lies inside
        ``path``: two jobs created before the API refused that must not both run."""
        paths, _ = live_model_paths(self.r)
        paths.pop(job_id, None)
        clash = model_path_clash(str(Path(path).resolve()), paths)
        if clash is not None:
            raise clash

    def delete_job(self, job_id: str) -> None:
        """Removes a finished (or never started) job and everything under it."""
        key = keys.job(job_id)

        def delete(pipe: redis.client.Pipeline) -> None:
            state = redis_io.hget(pipe, key, JobField.STATE)
            if state is None:
                raise JobNotFound(f"job {job_id!r} not found")
            try:
                next_state(JobState(state), JobAction.DELETE)
            except KeyError:
                raise InvalidTransition(job_id, state, "delete") from None
            spec_raw = redis_io.hget(pipe, key, JobField.SPEC)
            endpoints = stored_spec(spec_raw).store.endpoints if spec_raw else []
            pass_keys = redis_io.zrange(pipe, keys.passes(job_id), 0, -1)
            trigger_ids = redis_io.zrange(pipe, keys.triggers(job_id), 0, -1)
            pipe.multi()
            pipe.delete(*keys.all_job_keys(job_id))
            for pk in pass_keys:
                pipe.delete(keys.pass_record(job_id, *keys.parse_pass_key(pk)))
            for tid in trigger_ids:
                pipe.delete(keys.trigger(job_id, tid))
            pipe.srem(keys.jobs_in_state(state), job_id)
            pipe.zrem(keys.JOBS, job_id)
            pipe.hdel(keys.MODEL_PATHS, job_id)  # its model path free for a new job
            if endpoints:  # its rows in the store: freed by the first idle trainer group
                pipe.rpush(keys.POOL_DROPS, NamespaceDrop(job_id, tuple(endpoints)).encode())

        watched(self.r, delete, key, keys.passes(job_id), keys.triggers(job_id))

    # ---- what the scheduler reads and writes of a job ----------------------------------
    def job_record_or_none(self, job_id: str) -> JobRecord | None:
        """The job's record; None when there is no such job."""
        fields = redis_io.hgetall(self.r, keys.job(job_id))
        return JobRecord.from_fields(fields) if fields else None

    def job_spec_json(self, job_id: str) -> str | None:
        """The job's stored spec (JSON); None when there is no such job."""
        return redis_io.hget(self.r, keys.job(job_id), JobField.SPEC)

    def job_state(self, job_id: str) -> str | None:
        """The job's state; None when there is no such job."""
        return redis_io.hget(self.r, keys.job(job_id), JobField.STATE)

    def jobs_in(self, state: str) -> list[str]:
        """The ids of the jobs in ``state``, sorted."""
        return sorted(redis_io.smembers(self.r, keys.jobs_in_state(state)))

    def count_in(self, state: str) -> int:
        """How many jobs are in ``state``."""
        return int(self.r.scard(keys.jobs_in_state(state)))

    def heartbeat(self, job_id: str) -> str | None:
        """The job's trainer group's last heartbeat (JSON text); None once it expired."""
        return redis_io.get(self.r, keys.heartbeat(job_id))

    def has_heartbeat(self, job_id: str) -> bool:
        """Whether a trainer group's heartbeat for the job is alive."""
        return bool(self.r.exists(keys.heartbeat(job_id)))

    def set_last_checkpoint(self, job_id: str, pass_key: str) -> None:
        """The checkpoint after pass ``pass_key`` is the one the job goes on from."""
        redis_io.hset(self.r, keys.job(job_id), JobRecord.patch(last_checkpoint=pass_key))

    def set_error(self, job_id: str, message: str) -> None:
        redis_io.hset(self.r, keys.job(job_id), JobRecord.patch(error=message))

    def set_waiting_for(
        self, job_id: str, split: str, event: tuple[str, dict[str, Any]] | None
    ) -> None:
        """Keeps the split the job's next pass waits for ("": none) with its ``data_wait``
        event (message, data), when one is given."""
        with self.r.pipeline() as pipe:
            redis_io.hset(pipe, keys.job(job_id), JobRecord.patch(waiting_for=split))
            if event is not None:
                append_event(pipe, job_id, "data_wait", *event)
            pipe.execute()

    def append_event(
        self, job_id: str, kind: str, message: str, data: dict[str, Any] | None = None
    ) -> None:
        append_event(self.r, job_id, kind, message, data)

    def change_state(self, job_id: str, action: JobAction, reason: str = "") -> JobState:
        """Applies a scheduler's ``action`` (:func:`~streamrec.api.state.change_state`)."""
        return change_state(self.r, job_id, action, reason=reason)

    def trigger_record(self, job_id: str, trigger_id: str) -> TriggerRecord | None:
        """The trigger's record; None when the job has no such trigger."""
        fields = redis_io.hgetall(self.r, keys.trigger(job_id, trigger_id))
        return TriggerRecord.from_fields(fields) if fields else None

    def finish_trigger(self, job_id: str, trigger_id: str, outcome: dict[str, str]) -> None:
        """Writes a trigger's outcome: a :meth:`TriggerRecord.patch` of ``state``,
        ``finished_at`` and ``result`` or ``error``."""
        redis_io.hset(self.r, keys.trigger(job_id, trigger_id), outcome)

    # ---- passes -----------------------------------------------------------------------
    def list_passes(self, job_id: str, offset: int, limit: int) -> PassesPublic:
        self._job_fields(job_id)
        total = int(self.r.zcard(keys.passes(job_id)))
        names = redis_io.zrange(self.r, keys.passes(job_id), offset, offset + limit - 1)
        with self.r.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hgetall(keys.pass_record(job_id, *keys.parse_pass_key(name)))
            rows = pipe.execute()
        passes = [pass_public(PassRecord.from_fields(f)) for f in rows if f]
        return PassesPublic(data=passes, count=total)

    def get_pass(self, job_id: str, day: str, pass_id: int) -> PassPublic:
        self._job_fields(job_id)
        f = redis_io.hgetall(self.r, keys.pass_record(job_id, day, pass_id))
        if not f:
            raise PassNotFound(f"job {job_id!r} has no pass {day}/{pass_id}")
        return pass_public(PassRecord.from_fields(f))

    # ---- triggers ---------------------------------------------------------------------
    def create_trigger(self, job_id: str, body: TriggerCreate) -> TriggerPublic:
        """Queues a command for the job's trainers; they report its outcome by trigger id.

        Refused (409) unless a trainer group may be at work (running, paused, stopping), and
        (422) an online export of a job that publishes to no serving Redis.
        """
        if body.mode == OnlineMode.ONLINE:
            self._check_serving_redis(job_id)
        key = keys.job(job_id)
        trigger_id = uuid.uuid4().hex[:12]
        now = round(time.time(), 3)  # the record's time: what the zset and the command carry
        mode = body.mode.value if body.mode else None

        def create(pipe: redis.client.Pipeline) -> None:
            state = redis_io.hget(pipe, key, JobField.STATE)
            if state is None:
                raise JobNotFound(f"job {job_id!r} not found")
            if JobState(state) not in ACTIVE_STATES:
                raise InvalidTransition(job_id, state, f"trigger {body.kind}")
            pipe.multi()
            pending = TriggerRecord.patch(
                id=trigger_id,
                kind=body.kind,
                mode=mode,
                state=TriggerState.PENDING,
                created_at=now,
            )
            redis_io.hset(pipe, keys.trigger(job_id, trigger_id), pending)
            pipe.zadd(keys.triggers(job_id), {trigger_id: now})
            command = Command(body.kind.value, mode, trigger_id, now)
            redis_io.xadd(pipe, keys.commands(job_id), command.to_fields())
            what = body.kind.value + (f" {body.mode.value}" if body.mode else "")
            append_event(
                pipe,
                job_id,
                "trigger",
                f"{what} requested ({trigger_id})",
                {"trigger_id": trigger_id, "kind": body.kind.value, "mode": body.mode},
            )

        watched(self.r, create, key)
        return self.get_trigger(job_id, trigger_id)

    def _check_serving_redis(self, job_id: str) -> None:
        """SpecInvalid (422) naming ``mode`` when the job's trainer config has no
        ``online.redis_url``: accepted, the trigger would fail on the trainers."""
        raw = self.job_record(job_id).trainer_config
        online = (json.loads(raw).get("online") or {}) if raw else {}
        if raw and not online.get("redis_url"):
            reason = (
                f"job {job_id!r} publishes to no serving Redis: its model.online.redis_url is "
                f"unset and the API names no default (--default-online-redis-url)"
            )
            raise SpecInvalid([("mode", reason, OnlineMode.ONLINE.value)])

    def get_trigger(self, job_id: str, trigger_id: str) -> TriggerPublic:
        self._job_fields(job_id)
        rec = self.trigger_record(job_id, trigger_id)
        if rec is None:
            raise TriggerNotFound(f"job {job_id!r} has no trigger {trigger_id!r}")
        return trigger_public(rec)

    def list_triggers(self, job_id: str, offset: int, limit: int) -> TriggersPublic:
        self._job_fields(job_id)
        total = int(self.r.zcard(keys.triggers(job_id)))
        ids = redis_io.zrange(self.r, keys.triggers(job_id), offset, offset + limit - 1)
        with self.r.pipeline(transaction=False) as pipe:
            for tid in ids:
                pipe.hgetall(keys.trigger(job_id, tid))
            rows = pipe.execute()
        records = [TriggerRecord.from_fields(f) for f in rows if f]
        return TriggersPublic(data=[trigger_public(r) for r in records], count=total)

    # ---- events, workers --------------------------------------------------------------
    def events(self, job_id: str, after: str | None, limit: int) -> EventsPublic:
        """One page of events, oldest first, strictly after the stream id ``after``."""
        self._job_fields(job_id)
        start = "-" if after is None else f"({after}"
        rows = redis_io.xrange(self.r, keys.events(job_id), start, "+", count=limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        data = [event_public(i, f) for i, f in rows]
        return EventsPublic(data=data, next=data[-1].id if (more and data) else None)

    def worker(self, job_id: str, stuck_s: float | None = None) -> WorkerPublic:
        """The trainer group's last heartbeat; ``stuck`` when it says the group has worked
        without progress for more than ``stuck_s`` (None: not judged)."""
        rec = self.job_record(job_id)
        pool = {"trainers": rec.trainers, "group": rec.group}
        raw = redis_io.get(self.r, keys.heartbeat(job_id))
        if raw is None:
            return WorkerPublic(alive=False, **pool)
        ttl = self.r.pttl(keys.heartbeat(job_id))
        try:
            hb = json.loads(raw)
        except ValueError:
            hb = {"raw": raw[:200]}
        beat = hb if isinstance(hb, dict) else {"value": hb}
        return WorkerPublic(
            alive=True,
            stuck=stuck_s is not None and stuck_for(beat, stuck_s) is not None,
            heartbeat=beat,
            ttl_s=ttl / 1000 if ttl and ttl > 0 else None,
            **pool,
        )


def live_model_paths(r: redis.Redis) -> tuple[dict[str, str], dict[str, str]]:
    """(job id -> resolved model path of every live job, those of them missing from the
    index :data:`~streamrec.control.keys.MODEL_PATHS`: jobs stored before it, read from their
    specs for the caller to index)."""
    paths = redis_io.hgetall(r, keys.MODEL_PATHS)
    unindexed: dict[str, str] = {}
    if len(paths) != int(r.zcard(keys.JOBS)):
        for job_id in redis_io.zrange(r, keys.JOBS, 0, -1):
            raw = None if job_id in paths else redis_io.hget(r, keys.job(job_id), JobField.SPEC)
            if raw:
                unindexed[job_id] = stored_spec(raw).checkpoint.model_save_path
    return {**paths, **unindexed}, unindexed


def stuck_for(beat: dict[str, Any], limit_s: float) -> float | None:
    """Seconds a trainer group has worked without progress, from its heartbeat, when more
    than ``limit_s``; None when it is idle, moving, or says nothing of its progress."""
    ts = beat.get("progress_ts")
    if not beat.get("busy") or not isinstance(ts, int | float):
        return None
    quiet = time.time() - ts
    return quiet if quiet > limit_s else None
