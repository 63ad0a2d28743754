"""The streams between the API and a job's trainer group, and the scheduler's lease: the
API's repository of what is handed out and reported back.

- the **work** stream (group ``trainers``): passes handed out; an entry stays pending in the
  group while a trainer holds it, and is acknowledged here when its pass is settled;
- the **report** stream (group ``api``, consumer ``keys.API_CONSUMER``): what the trainers
  report, read and acknowledged one entry at a time;
- the **lease** (``keys.SCHEDULER_LOCK``): one API at a time schedules.
"""

from __future__ import annotations

import redis
from streamrec.control import keys, redis_io

_LEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class SchedulerLease:
    """The scheduler's lease, held by ``owner`` while it renews it.

    Args:
        r: a client with ``decode_responses=True``.
        owner: this API's scheduler (unique per process).
    """

    def __init__(self, r: redis.Redis, owner: str) -> None:
        self.owner = owner
        self._lease = r.register_script(_LEASE)
        self._release = r.register_script(_RELEASE)

    def hold(self, ttl_ms: int) -> bool:
        """Takes or renews the lease for ``ttl_ms``; False when another owner holds it."""
        return bool(self._lease(keys=[keys.SCHEDULER_LOCK], args=[self.owner, ttl_ms]))

    def release(self) -> None:
        """Hands the lease on (a no-op when another owner holds it)."""
        self._release(keys=[keys.SCHEDULER_LOCK], args=[self.owner])


class WorkQueue:
    """A job's work and report streams.

    Args:
        r: a client with ``decode_responses=True``.
    """

    def __init__(self, r: redis.Redis) -> None:
        self.r = r

    # ---- work -------------------------------------------------------------------------
    def holders(self, job_id: str) -> set[str]:
        """The consumers (trainer groups) holding a pass of the job, taken and not settled."""
        rows = self.r.xpending_range(
            keys.work(job_id), keys.TRAINER_GROUP, min="-", max="+", count=16
        )
        return {str(row["consumer"]) for row in rows}

    def settle(self, job_id: str) -> None:
        """Acknowledges every pending entry of the work group (at most one pass in flight)."""
        rows = self.r.xpending_range(
            keys.work(job_id), keys.TRAINER_GROUP, min="-", max="+", count=1000
        )
        ids = [row["message_id"] for row in rows]
        if ids:
            self.r.xack(keys.work(job_id), keys.TRAINER_GROUP, *ids)

    def depth(self, job_id: str) -> int:
        """Entries of the job's work stream not yet delivered to the trainers' group."""
        stream = keys.work(job_id)
        try:
            groups = self.r.xinfo_groups(stream)
        except redis.ResponseError:  # no work stream yet: nothing handed out
            return 0
        for group in groups:
            if group["name"] == keys.TRAINER_GROUP:
                last = group["last-delivered-id"]
                return len(self.r.xrange(stream, min=f"({last}", max="+") or [])
        return int(self.r.xlen(stream))

    # ---- reports ----------------------------------------------------------------------
    def reports(self, job_id: str, start: str, count: int) -> list[redis_io.Entry]:
        """Up to ``count`` reports of the job: this API's pending ones (``start`` "0") or
        new ones (">"), oldest first."""
        return redis_io.read_group(
            self.r, keys.API_GROUP, keys.API_CONSUMER, keys.reports(job_id), start, count
        )

    def ack_report(self, job_id: str, msg_id: str) -> None:
        self.r.xack(keys.reports(job_id), keys.API_GROUP, msg_id)


def queue_work(pipe: redis.client.Pipeline, job_id: str, fields: dict[str, str]) -> None:
    """Queues (in ``pipe``) a work item's entry on the job's work stream."""
    redis_io.xadd(pipe, keys.work(job_id), fields)


def queue_work_reset(pipe: redis.client.Pipeline, job_id: str) -> None:
    """Queues the drop of every pass on the job's work stream (taken or not): a rewound job
    hands its passes out again from its cursor."""
    pipe.delete(keys.work(job_id))
    pipe.xgroup_create(keys.work(job_id), keys.TRAINER_GROUP, id="0", mkstream=True)
