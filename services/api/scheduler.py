"""Pass scheduling: from donefiles to the trainers' work stream, and back from their reports.

One API at a time schedules (a lease in Redis, renewed every tick), so several API replicas or
a restarted one never hand out a pass twice. Each tick, for every job that may be at work:

1. **Reports.** Apply the job's trainer reports (``reports.py``: pass outcomes,
   checkpoints, trigger outcomes; idempotent, a pass already done stays done).
2. **Dead group.** A pass in flight that a trainer took (pending in the work group) while the
   group's heartbeat key has expired (or is renewed without progress for
   ``trainer_stuck_s`` while it works: stuck) means the group died: the job's cursor goes
   back to the pass after the last checkpoint and the passes from there are handed out
   again (a pass that fails twice fails the job; passes re-handed by the rewind are no
   failures, only their ``attempts`` count grows).
3. **Hand-out.** A running job with no pass in flight gets its next pass (in training order)
   as soon as every split of it holds its donefile: a pass record is written and the pass is
   XADDed to the work stream (group ``trainers``), in one transaction.

A pass that failed on bad data follows the job's ``data.on_bad_split``: ``fail`` fails the
job at once (a retry cannot pass), ``skip`` hands the pass out again from the last
checkpoint without the bad splits (``skipped_splits`` of the pass record, a ``skip`` event).
Work items name ``after`` (the previous pass) and ``resume_from`` so a group loads exactly
the checkpoint the API knows, never a newer one it never reported.

Every pass, requeue, checkpoint, trigger outcome and state change is an event. The running
jobs' heartbeat and progress ages and queue depths are gauges (``job_gauges.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import redis
from streamrec.api.config import Settings
from streamrec.api.errors import ApiError
from streamrec.api.job_gauges import RunningJobGauges
from streamrec.api.lineage import job_plan, resume_cursor
from streamrec.api.metrics import ApiMetrics
from streamrec.api.models import stored_spec
from streamrec.api.pass_records import PassCounts, Requeue, RequeueCause, Restart
from streamrec.api.pool import PoolScheduler
from streamrec.api.repo import Repo, stuck_for
from streamrec.api.reports import ReportApplier
from streamrec.api.state import ACTIVE_STATES, JobAction, JobState, PassState
from streamrec.control import keys
from streamrec.control.records import JobRecord
from streamrec.control.work import WorkItem
from streamrec.layout import PassSpec, pass_ready

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 2


class Scheduler:
    """The scheduling loop, in a daemon thread of the API process.

    Args:
        repo: the API's Redis repository.
        settings: ``scheduler_interval_s`` (tick period), ``lock_ttl_s`` (lease).
        metrics: where pass and trigger outcomes are counted.
    """

    def __init__(self, repo: Repo, settings: Settings, metrics: ApiMetrics) -> None:
        self.repo = repo
        self.passes = repo.passes
        self.settings = settings
        self.metrics = metrics
        self.owner = f"{settings.api_id}-{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._redis_reachable = False  # whether the last tick reached Redis (none yet: no)
        self._plans: dict[str, tuple[str, list[PassSpec]]] = {}
        self._last_probe: dict[str, float] = {}
        self.lease = repo.lease(self.owner)
        self.gauges = RunningJobGauges(repo, metrics)
        self.pool = PoolScheduler(repo, metrics, gone_after_s=3 * settings.heartbeat_ttl_s)
        self.reports = ReportApplier(
            repo,
            metrics,
            self.requeue,
            repo.work.settle,
            restart=self._restart,
            restart_budget=self._restart_budget,
        )

    # ---- thread -----------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends the loop and hands the lease on. Unless the last tick reached Redis, a tick
        still retrying is not waited for (it is a daemon thread; leaving it is what a
        kill of the API does, which the scheduler's transactions are built to survive) and
        the lease is left to expire (``lock_ttl_s``): both would wait out the client's whole
        reconnect policy (about 5 s each) in a process that is stopping anyway."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10 if self._redis_reachable else 0.5)
        if self._redis_reachable:
            with contextlib.suppress(redis.RedisError):
                self.lease.release()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                self.tick()
                self.metrics.redis_up.set(1)
                self._redis_reachable = True
            except redis.RedisError as exc:
                self._redis_reachable = False
                self.metrics.redis_up.set(0)
                self.metrics.redis_errors.inc()
                log.warning("scheduler: redis unavailable: %s", exc)
            except Exception:  # keep scheduling other jobs; the error is logged
                log.exception("scheduler tick failed")
            self.metrics.scheduler_tick_seconds.observe(time.perf_counter() - t0)
            self._stop.wait(self.settings.scheduler_interval_s)

    # ---- one tick ---------------------------------------------------------------------
    def tick(self) -> bool:
        """One scheduling round; returns False when another API holds the lease."""
        lease_ms = int(self.settings.lock_ttl_s * 1000)
        leader = self.lease.hold(lease_ms)
        self.metrics.scheduler_leader.set(1 if leader else 0)
        if not leader:
            return False
        for state in sorted(ACTIVE_STATES):
            for job_id in self.repo.jobs_in(state):
                self.metrics.start_job(job_id)
                try:
                    self.step(job_id)
                except ApiError as exc:  # deleted or changed under us: next tick sees it
                    log.info("scheduler: job %s: %s", job_id, exc)
        for state in JobState:
            self.metrics.jobs.labels(state.value).set(self.repo.count_in(state.value))
        running = self.repo.jobs_in(JobState.RUNNING.value)
        self.pool.tick(running)
        self.gauges.observe(running)
        return True

    def step(self, job_id: str) -> None:
        """Reports, dead-group check, then hand-out, for one job."""
        self.reports.apply(job_id)
        job = self.repo.job_record(job_id)
        if job.state in ACTIVE_STATES:
            self.check_dead(job_id, job)
            job = self.repo.job_record(job_id)
        if job.state == JobState.STOPPING and not self.repo.has_heartbeat(job_id):
            self.repo.change_state(
                job_id, JobAction.TRAINERS_STOPPED, reason="no trainer group alive"
            )
        elif job.state == JobState.RUNNING:
            self.hand_out(job_id, job)

    def plan(self, job_id: str, spec_json: str) -> list[PassSpec]:
        """Every pass of the job in training order (cached per job spec)."""
        cached = self._plans.get(job_id)
        if cached is None or cached[0] != spec_json:
            cached = (spec_json, job_plan(stored_spec(spec_json)))
            self._plans[job_id] = cached
        return cached[1]

    # ---- hand-out ---------------------------------------------------------------------
    def hand_out(self, job_id: str, job: JobRecord) -> None:
        """Puts the next pass on the work stream when it is ready and none is in flight."""
        if job.in_flight:
            return
        plan = self.plan(job_id, job.spec)
        cursor = job.cursor
        if cursor >= len(plan):
            if job.passes_done >= job.passes_total:
                end = f"{plan[-1].day}/{plan[-1].splits[-1]}" if plan else "-"
                self.repo.change_state(
                    job_id, JobAction.SUCCEED, reason=f"every pass done, through split {end}"
                )
            return
        if time.time() < (job.not_before or 0.0):
            return  # backing off after an infrastructure restart
        spec = stored_spec(job.spec)
        now = time.monotonic()
        if now - self._last_probe.get(job_id, 0.0) < spec.data.data_sleep_second:
            return
        p = plan[cursor]
        if not pass_ready(spec.data.train_data_dir, p, spec.data.data_donefile):
            self._last_probe[job_id] = now
            return
        self._last_probe.pop(job_id, None)
        before = self.passes.counts(job_id, p.day, p.pass_id)
        # a pass that failed the job starts its count afresh when the operator restarts it
        restarted = before.state == PassState.FAILED.value
        attempts = 1 if restarted else before.attempts + 1
        failures = 0 if restarted else before.failures
        resume_from = (job.last_checkpoint or "") if attempts > 1 else ""
        after = keys.pass_key(plan[cursor - 1].day, plan[cursor - 1].pass_id) if cursor else ""
        item = WorkItem("", p, attempts, resume_from, after, tuple(before.skipped))
        self.passes.hand_out(job_id, cursor, item, failures)
        self.metrics.passes_handed_out.labels(job_id).inc()

    # ---- dead groups ------------------------------------------------------------------
    def check_dead(self, job_id: str, job: JobRecord) -> None:
        """Requeues the pass in flight when the trainer group that took it is gone.

        Gone: the job's heartbeat key has expired, or it is now renewed by another group (a
        restarted group heartbeats under a new consumer name while the dead one's pass is
        still pending).
        """
        if not job.in_flight:
            return
        holders = self.repo.work.holders(job_id)
        if not holders:
            return  # handed out but not taken yet: nobody died holding it
        raw = self.repo.heartbeat(job_id)
        if raw is not None:
            try:
                beat = json.loads(raw)
                beating = beat.get("consumer")
            except (ValueError, AttributeError):
                beat, beating = {}, None
            if beating is None:
                return
            if beating in holders:
                quiet = stuck_for(beat, self.settings.trainer_stuck_s)
                if quiet is None:
                    return
                reason = f"trainer group stuck: no progress for {quiet:.0f} s"
            else:
                reason = f"trainer group {sorted(holders)} replaced by {beating!r}"
        else:
            if self.reports.apply(job_id):  # what the group said as it went (e.g. released)
                return  # first: the next tick judges what is left
            reason = "trainer group heartbeat expired"
        self.metrics.trainers_dead.labels(job_id).inc()
        self.requeue(job_id, job, reason, RequeueCause.RESTART)

    def requeue(
        self,
        job_id: str,
        job: JobRecord,
        reason: str,
        cause: RequeueCause,
        skip: Sequence[str] = (),
    ) -> None:
        """Hands the pass in flight out again from the last checkpoint, or fails the job.

        The cursor goes back to the pass after the last reported checkpoint (the group loads
        it) and the passes trained since are rolled back (``lineage.py``), so no pass trained
        since then is lost or counted twice. ``cause`` says what the requeue counts against
        (:class:`RequeueCause`): the pass's failures (a second one, or bad data under
        ``on_bad_split: fail``, fails the job), or the job's restart budget with exponential
        backoff (a group that died, was killed or stuck: the job fails when the budget is
        spent), or neither. ``skip`` (``SKIP_SPLITS`` only) adds splits to the pass's
        ``skipped_splits``. The cursor is rewound either way, so an operator's ``start``
        retries from the checkpoint.
        """
        if skip and cause is not RequeueCause.SKIP_SPLITS:
            raise ValueError(f"splits to skip {list(skip)} with a requeue for {cause.name}")
        pk = job.in_flight
        if pk is None:
            raise ValueError(f"job {job_id!r} has no pass in flight to requeue")
        self.repo.work.settle(job_id)
        plan = self.plan(job_id, job.spec)
        index = {keys.pass_key(p.day, p.pass_id): i for i, p in enumerate(plan)}
        ckpt = job.last_checkpoint or ""
        cursor = resume_cursor(plan, ckpt, limit=index[pk])
        budget = self._restart_budget(job)

        def decide(read: PassCounts) -> Requeue:
            failures = read.failures + (1 if cause.counts_failure else 0)
            skipped = read.skipped + [x for x in skip if x not in read.skipped]
            restart = None
            if cause is RequeueCause.RESTART:
                restart = self._restart(job, read.restarts + 1)
            failed_why = None
            if cause is RequeueCause.BAD_DATA or failures >= MAX_ATTEMPTS:
                failed_why = reason
            elif restart is not None and restart.n > budget:
                failed_why = (
                    f"{reason}; restart budget spent ({restart.n} restarts in a row, "
                    f"resources.restart_budget {budget})"
                )
            events: list[tuple[str, str, dict[str, Any]]] = []
            if restart is not None:
                events.append(
                    (
                        "restart",
                        f"trainer group restart {restart.n} in a row ({reason}); next pass in "
                        f"{restart.backoff_s:.1f} s",
                        {"restarts": restart.n, "backoff_s": restart.backoff_s},
                    )
                )
            if failed_why is not None:
                events.append(
                    (
                        "failure",
                        f"pass {pk} failed after {read.attempts} attempt(s): {failed_why}",
                        {"pass": pk, "attempts": read.attempts, "resume_from": ckpt or None},
                    )
                )
                return Requeue(failures, skipped, failed_why, restart, events)
            if skip:
                events.append(
                    (
                        "skip",
                        f"pass {pk}: bad split(s) {', '.join(skip)} skipped "
                        f"(data.on_bad_split: skip)",
                        {"pass": pk, "skipped_splits": skipped},
                    )
                )
            events.append(
                (
                    "requeue",
                    f"pass {pk}: {reason}; handing out again from "
                    f"{ckpt or 'the start'} ({index[pk] - cursor + 1} pass(es))",
                    {"pass": pk, "resume_from": ckpt or None, "rewound": read.rolled},
                )
            )
            return Requeue(failures, skipped, None, restart, events)

        out = self.passes.requeue(job_id, pk, plan, cursor, ckpt, reason, decide)
        self._last_probe.pop(job_id, None)
        if out.restart is not None:
            self.metrics.group_restarts.labels(job_id).inc()
        if out.failed_why is not None:
            self.repo.change_state(job_id, JobAction.FAIL, reason=f"pass {pk}: {out.failed_why}")
        else:
            self.metrics.passes_requeued.labels(job_id).inc()

    def _restart_budget(self, job: JobRecord) -> int:
        own = stored_spec(job.spec).resources.restart_budget
        return self.settings.restart_budget if own is None else own

    def _restart(self, job: JobRecord, n: int) -> Restart:
        """An infrastructure restart, ``n`` in a row, and the backoff before the next
        hand-out: ``restart_backoff_s * 2**(n-1)``, capped."""
        own = stored_spec(job.spec).resources.restart_backoff_s
        base = self.settings.restart_backoff_s if own is None else own
        return Restart(n, min(base * 2 ** (n - 1), self.settings.restart_backoff_max_s))
