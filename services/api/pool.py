"""The scheduler's side of the trainer pool: give running jobs to free groups, take them back.

Each tick (leader only):

1. **Release.** An assignment whose job has ended (stopped, succeeded, failed, deleted) is
   cleared: the group waits for its next job. An assignment whose group's registration has
   been missing for ``gone_after_s`` (the group is gone: its processes died and did not come
   back) is cleared too, so the job goes to another group (or the same one once it is back);
   a group restarting (torchrun restarts all its ranks) keeps its job meanwhile. A group
   whose registration still names an ended job (``pool.ended_jobs``) is free all the same:
   ``streamrec_api_pool_groups_held_by_ended_jobs`` counts such groups (a group clears its
   registration as its job ends, so a count that stays says a group did not come back).
2. **Assign.** A running job that no group serves (no assignment, no heartbeat of a group
   pinned to it with ``--job-id``) goes to an idle, unassigned group whose ranks fit
   ``resources.trainer_ranks`` (any size when unset), the first by name. With none, the job
   shows ``trainers: waiting_for_trainers`` (REST job and ``/workers``), an event says so
   once, and ``streamrec_api_jobs_waiting_for_trainers`` counts it.
"""

from __future__ import annotations

import time

from streamrec.api.metrics import ApiMetrics
from streamrec.api.models import stored_spec
from streamrec.api.pool_records import ASSIGNED, PINNED, WAITING, PoolRecords
from streamrec.api.repo import Repo
from streamrec.control import pool

__all__ = ["ASSIGNED", "PINNED", "WAITING", "PoolScheduler"]


class PoolScheduler:
    """Matches running jobs with the pool's groups (see the module docstring).

    Args:
        repo: the API's repository (jobs, heartbeats; the pool's records as ``repo.pool``).
        metrics: where the pool's gauges live.
        gone_after_s: how long a group's registration may be missing before it loses its job.
    """

    def __init__(self, repo: Repo, metrics: ApiMetrics, gone_after_s: float = 30.0) -> None:
        self.repo = repo
        self.records: PoolRecords = repo.pool
        self.metrics = metrics
        #: a group whose registration is missing this long loses its job (a restart of its
        #: processes, torchrun's, takes seconds: the job waits for it meanwhile)
        self.gone_after_s = gone_after_s
        self._missing_since: dict[str, float] = {}

    def tick(self, running: list[str]) -> None:
        groups = {g.name: g for g in self.records.live_groups()}
        held = self.release(groups)
        # a registration naming an ended job holds nothing: the group is free (a group that
        # kept it would otherwise count busy for ever, and jobs would wait for trainers)
        ended = self.records.ended_jobs(g.job_id for g in groups.values() if g.job_id)
        stale = {name for name, g in groups.items() if g.job_id in ended}
        working = {name for name, g in groups.items() if g.job_id and name not in stale}
        busy = set(held) | working
        self.metrics.pool_groups.labels("busy").set(len(busy & set(groups)))
        self.metrics.pool_groups.labels("idle").set(len(set(groups) - busy))
        self.metrics.pool_groups_held_by_ended_jobs.set(len(stale))
        served = {a.job_id for a in held.values()}
        waiting = 0
        for job_id in running:
            if job_id in served:
                continue
            if self.repo.has_heartbeat(job_id):  # a group pinned to it (--job-id)
                self.mark(job_id, PINNED)
                continue
            name = self.pick(job_id, groups, busy)
            if name is None:
                waiting += self.mark_waiting(job_id)
            else:
                busy.add(name)
                self.records.assign(job_id, name)
        self.metrics.jobs_waiting_for_trainers.set(waiting)

    def release(self, groups: dict[str, pool.GroupInfo]) -> dict[str, pool.Assignment]:
        """Clears the assignments of ended jobs and gone groups; returns the ones kept."""
        kept = {}
        now = time.monotonic()
        given = self.records.assignments()
        over = self.records.ended_jobs(a.job_id for a in given.values())
        for name, a in given.items():
            ended = a.job_id in over
            if name in groups:
                self._missing_since.pop(name, None)
                gone = False
            else:  # gone, or restarting (torchrun): it keeps its job a while
                gone = now - self._missing_since.setdefault(name, now) > self.gone_after_s
            if not ended and not gone:
                kept[name] = a
                continue
            self._missing_since.pop(name, None)
            self.records.unassign(name, a, "the job ended" if ended else "the group is gone")
        return kept

    def pick(self, job_id: str, groups: dict[str, pool.GroupInfo], busy: set[str]) -> str | None:
        """The first idle group (by name) whose ranks fit the job; None when none does."""
        raw = self.repo.job_spec_json(job_id)
        if raw is None:
            return None
        want = stored_spec(raw).resources.trainer_ranks
        for name, g in sorted(groups.items()):
            if name not in busy and (want is None or g.ranks == want):
                return name
        return None

    def mark(self, job_id: str, standing: str) -> None:
        """Sets the job's ``trainers`` field when it differs (no write otherwise)."""
        if self.records.standing(job_id) != standing:
            self.records.set_standing(job_id, standing)

    def mark_waiting(self, job_id: str) -> int:
        """Marks the job waiting for trainers (an event the first time); returns 1."""
        if self.records.standing(job_id) != WAITING:
            groups = [
                {"name": g.name, "ranks": g.ranks, "job_id": g.job_id}
                for g in self.records.live_groups()
            ]
            self.records.set_waiting(
                job_id,
                "waiting for trainers: no free trainer group in the pool fits "
                "resources.trainer_ranks (start one with streamrec-trainer-agent "
                "without --job-id)",
                {"groups": groups},
            )
        return 1
