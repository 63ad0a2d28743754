"""The trainer pool: groups register, wait, and are given jobs by the control plane.

A trainer group started without a job (``streamrec-trainer-agent`` without ``--job-id``)
joins the pool: its rank 0 keeps a registration (``keys.pool_group(name)``, JSON with a TTL,
renewed like a heartbeat) saying how many ranks it has, where it runs and whether it is idle.
The API's scheduler gives a running job that no group serves to an idle group whose ranks fit
(``resources.trainer_ranks``), by writing ``keys.POOL_ASSIGNMENTS[name] = "<job id>:<token>"``;
the group reads it, runs the job, and when the job ends (stopped, succeeded, failed, deleted)
the scheduler clears the assignment and the group waits for the next one. A group whose job
failed, was stopped or could not start clears its registration's job at once; a registration
that still names an ended job (:func:`ended_jobs`) counts as free all the same. The token changes
with every assignment, so a group that finished a job never mistakes the same job started
again for the one it finished (or the other way round). It is the assignment's generation,
the next value of one counter (``keys.POOL_GENERATION``): the group's store requests carry it,
and the shards refuse a group that lost its job to a later assignment (a group that froze
and woke up after its job went elsewhere).

Deleting a job frees its rows in the store: the API queues the job's store namespace
(``keys.POOL_DROPS``) and the first idle group drops it on the shards (the groups hold the
data plane's token; the API does not).

A group's name is stable across restarts of its processes (torchrun's elastic restarts, a
pod restarted in place): a restarted group reads its assignment and goes on with its job
from the job's last checkpoint.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis
from streamrec.control import keys, redis_io
from streamrec.control.states import ACTIVE_STATES
from streamrec.errors import BadRequest

#: What a group name may be (it is part of Redis keys and metric labels).
GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def check_group_name(name: str) -> str:
    if not isinstance(name, str) or not GROUP_NAME.match(name):
        raise BadRequest(
            f"group name must match {GROUP_NAME.pattern} (letters, digits, '_.-', at most 63), "
            f"got {str(name)[:80]!r}"
        )
    return name


@dataclass(frozen=True)
class Assignment:
    """A job given to a group; ``token`` tells one assignment of the same job from another."""

    job_id: str
    token: str

    @property
    def generation(self) -> int | None:
        """The assignment's generation: its token, drawn from ``keys.POOL_GENERATION`` (only
        grows over every assignment); None for a token that is not one (an older API's)."""
        return int(self.token) if self.token.isdigit() and len(self.token) < 19 else None

    def encode(self) -> str:
        return f"{self.job_id}:{self.token}"

    @staticmethod
    def decode(raw: str | None) -> Assignment | None:
        if not raw or ":" not in raw:
            return None
        job_id, token = raw.split(":", 1)
        return Assignment(job_id, token)


@dataclass(frozen=True)
class GroupInfo:
    """A pooled group as its registration says (``job_id`` None: idle)."""

    name: str
    ranks: int
    host: str
    job_id: str | None
    ts: float

    @staticmethod
    def parse(name: str, raw: str | None) -> GroupInfo | None:
        if raw is None:
            return None
        try:
            d = json.loads(raw)
            return GroupInfo(
                name, int(d["ranks"]), str(d.get("host", "")), d.get("job_id") or None, d["ts"]
            )
        except (ValueError, KeyError, TypeError):
            return None


def live_groups(r: redis.Redis) -> list[GroupInfo]:
    """Every group whose registration has not expired, by name (expired ones are dropped
    from the set)."""
    names = sorted(redis_io.smembers(r, keys.POOL_GROUPS))
    if not names:
        return []
    with r.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.get(keys.pool_group(name))
        raws = pipe.execute()
    out, gone = [], []
    for name, raw in zip(names, raws, strict=True):
        info = GroupInfo.parse(name, raw)
        if info is None:
            gone.append(name)
        else:
            out.append(info)
    if gone:
        r.srem(keys.POOL_GROUPS, *gone)
    return out


def ended_jobs(r: redis.Redis, job_ids: Iterable[str]) -> set[str]:
    """Those of ``job_ids`` that no group works for any more: deleted, or in no active state
    (stopped, succeeded, failed; or never started). A group whose registration names one is
    free, and an assignment to one is cleared."""
    ids = sorted(set(job_ids))
    if not ids:
        return set()
    with r.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hget(keys.job(job_id), "state")
        states = pipe.execute()
    active = {s.value for s in ACTIVE_STATES}
    return {j for j, state in zip(ids, states, strict=True) if state not in active}


def assignments(r: redis.Redis) -> dict[str, Assignment]:
    """Group name -> its assignment."""
    raw: dict[str, str] = r.hgetall(keys.POOL_ASSIGNMENTS)  # type: ignore[assignment]
    out = {}
    for name, value in raw.items():
        a = Assignment.decode(value)
        if a is not None:
            out[name] = a
    return out


@dataclass(frozen=True)
class NamespaceDrop:
    """A deleted job's store namespace to free, on these shards."""

    namespace: str
    endpoints: tuple[str, ...]

    def encode(self) -> str:
        return json.dumps({"namespace": self.namespace, "endpoints": list(self.endpoints)})

    @staticmethod
    def decode(raw: str) -> NamespaceDrop | None:
        try:
            d = json.loads(raw)
            return NamespaceDrop(str(d["namespace"]), tuple(str(e) for e in d["endpoints"]))
        except (ValueError, KeyError, TypeError):
            return None


class PoolChannel:
    """Rank 0's side of the pool for one group.

    Args:
        r: a Redis client with ``decode_responses=True``.
        name: the group's name (stable across restarts).
        ranks: the group's world size.
        host: where rank 0 runs.
        ttl_s: the registration expires this long after the last renewal.
    """

    def __init__(self, r: redis.Redis, name: str, ranks: int, host: str, ttl_s: float) -> None:
        self.r = r
        self.name = check_group_name(name)
        self.ranks = ranks
        self.host = host
        self.ttl_ms = int(ttl_s * 1000)

    def register(self, job_id: str | None = None, **extra: Any) -> None:
        """Registers (or renews) the group, idle or working for ``job_id``."""
        body = {"ranks": self.ranks, "host": self.host, "job_id": job_id, "ts": time.time()}
        with self.r.pipeline(transaction=False) as pipe:
            pipe.set(keys.pool_group(self.name), json.dumps({**extra, **body}), px=self.ttl_ms)
            pipe.sadd(keys.POOL_GROUPS, self.name)
            pipe.execute()

    def assignment(self) -> Assignment | None:
        return Assignment.decode(redis_io.hget(self.r, keys.POOL_ASSIGNMENTS, self.name))

    def take_drop(self) -> NamespaceDrop | None:
        """The next deleted job's namespace to free (None: none); taken off the queue."""
        while (raw := self.r.lpop(keys.POOL_DROPS)) is not None:
            drop = NamespaceDrop.decode(str(raw))
            if drop is not None:
                return drop
        return None

    def leave(self) -> None:
        """Removes the registration (a clean exit); the assignment stays for the scheduler."""
        with self.r.pipeline(transaction=False) as pipe:
            pipe.delete(keys.pool_group(self.name))
            pipe.srem(keys.POOL_GROUPS, self.name)
            pipe.execute()
