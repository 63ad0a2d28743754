"""The trainer pool as the API's scheduler sees it in Redis: the groups' registrations, their
assignments (``keys.POOL_ASSIGNMENTS``) and how each job stands with the pool (its hash's
``trainers``, ``group``, ``last_group``). The API's repository of the pool; the matching
rules are :mod:`~streamrec.api.pool`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis
from streamrec.api.state import append_event
from streamrec.control import keys, pool, redis_io
from streamrec.control.records import JobField, JobRecord

#: The job hash's ``trainers`` field: how the job stands with the pool.
WAITING = "waiting_for_trainers"
ASSIGNED = "assigned"
PINNED = "pinned"


class PoolRecords:
    """The pool's registrations and assignments.

    Args:
        r: a client with ``decode_responses=True``.
    """

    def __init__(self, r: redis.Redis) -> None:
        self.r = r

    def live_groups(self) -> list[pool.GroupInfo]:
        """Every group whose registration has not expired, by name."""
        return pool.live_groups(self.r)

    def ended_jobs(self, job_ids: Iterable[str]) -> set[str]:
        """Those of ``job_ids`` deleted or in no active state."""
        return pool.ended_jobs(self.r, job_ids)

    def assignments(self) -> dict[str, pool.Assignment]:
        """Group name -> its assignment."""
        return pool.assignments(self.r)

    def assign(self, job_id: str, name: str) -> None:
        """Gives the job to group ``name``, with the job's standing and its event."""
        # the token is the assignment's generation: it only grows, so a store shard can
        # refuse the writes of a group that lost the job to a later one (store generations.py)
        a = pool.Assignment(job_id, str(self.r.incr(keys.POOL_GENERATION)))
        with self.r.pipeline() as pipe:
            pipe.hset(keys.POOL_ASSIGNMENTS, name, a.encode())
            # last_group: kept when the job ends (and "group" is cleared), to say who ran it
            fields = JobRecord.patch(group=name, last_group=name, trainers=ASSIGNED)
            redis_io.hset(pipe, keys.job(job_id), fields)
            append_event(pipe, job_id, "pool", f"assigned to trainer group {name}", {"group": name})
            pipe.execute()

    def unassign(self, name: str, a: pool.Assignment, why: str) -> None:
        """Clears group ``name``'s assignment ``a`` (nothing when it changed meanwhile) and,
        when its job still exists, the job's standing, with an event saying ``why``."""

        def body(pipe: redis.client.Pipeline) -> None:
            if redis_io.hget(pipe, keys.POOL_ASSIGNMENTS, name) != a.encode():
                pipe.multi()
                return
            exists = pipe.exists(keys.job(a.job_id))
            pipe.multi()
            pipe.hdel(keys.POOL_ASSIGNMENTS, name)
            if exists:
                redis_io.hset(pipe, keys.job(a.job_id), JobRecord.patch(group=None, trainers=None))
                append_event(
                    pipe, a.job_id, "pool", f"trainer group {name} released: {why}", {"group": name}
                )

        self.r.transaction(body, keys.POOL_ASSIGNMENTS)

    def standing(self, job_id: str) -> str | None:
        """The job's ``trainers`` field (None: unset or no job)."""
        return redis_io.hget(self.r, keys.job(job_id), JobField.TRAINERS)

    def set_standing(self, job_id: str, standing: str) -> None:
        redis_io.hset(self.r, keys.job(job_id), JobRecord.patch(trainers=standing))

    def set_waiting(self, job_id: str, message: str, data: dict[str, Any]) -> None:
        """Marks the job waiting for trainers (no group), with its event."""
        with self.r.pipeline() as pipe:
            fields = JobRecord.patch(trainers=WAITING, group=None)
            redis_io.hset(pipe, keys.job(job_id), fields)
            append_event(pipe, job_id, "pool", message, data)
            pipe.execute()
