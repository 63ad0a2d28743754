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

import redis
from streamrec.api.config import Settings
from streamrec.api.errors import ApiError
from streamrec.api.job_gauges import RunningJobGauges
from streamrec.api.lineage import done_after, job_plan, queue_rollback, resume_cursor
from streamrec.api.metrics import ApiMetrics
from streamrec.api.models import stored_spec
from streamrec.api.pool import PoolScheduler
from streamrec.api.repo import Repo, stuck_for
from streamrec.api.reports import ReportApplier
from streamrec.api.state import (
    ACTIVE_STATES,
    JobAction,
    JobState,
    PassState,
    append_event,
    change_state,
)
from streamrec.control import keys, redis_io
from streamrec.control.work import WorkItem
from streamrec.layout import PassSpec, pass_ready

log = logging.getLogger(__name__)

_LEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
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
        self.r = repo.r
        self.settings = settings
        self.metrics = metrics
        self.owner = f"{settings.api_id}-{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._redis_reachable = False  # whether the last tick reached Redis (none yet: no)
        self._plans: dict[str, tuple[str, list[PassSpec]]] = {}
        self._last_probe: dict[str, float] = {}
        self._lease = self.r.register_script(_LEASE)
        self._release = self.r.register_script(_RELEASE)
        self.gauges = RunningJobGauges(self.r, metrics)
        self.pool = PoolScheduler(self.r, metrics, gone_after_s=3 * settings.heartbeat_ttl_s)
        self.reports = ReportApplier(repo, metrics, self.requeue, self._ack_work)

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
                self._release(keys=[keys.SCHEDULER_LOCK], args=[self.owner])

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
        leader = bool(self._lease(keys=[keys.SCHEDULER_LOCK], args=[self.owner, lease_ms]))
        self.metrics.scheduler_leader.set(1 if leader else 0)
        if not leader:
            return False
        for state in sorted(ACTIVE_STATES):
            for job_id in sorted(redis_io.smembers(self.r, keys.jobs_in_state(state))):
                self.metrics.start_job(job_id)
                try:
                    self.step(job_id)
                except ApiError as exc:  # deleted or changed under us: next tick sees it
                    log.info("scheduler: job %s: %s", job_id, exc)
        for state in JobState:
            self.metrics.jobs.labels(state.value).set(self.r.scard(keys.jobs_in_state(state.value)))
        running = sorted(redis_io.smembers(self.r, keys.jobs_in_state(JobState.RUNNING.value)))
        self.pool.tick(running)
        self.gauges.observe(running)
        return True

    def step(self, job_id: str) -> None:
        """Reports, dead-group check, then hand-out, for one job."""
        self.reports.apply(job_id)
        f = self.repo.job_fields(job_id)
        if f["state"] in ACTIVE_STATES:
            self.check_dead(job_id, f)
            f = self.repo.job_fields(job_id)
        state = JobState(f["state"])
        if state == JobState.STOPPING and not self.r.exists(keys.heartbeat(job_id)):
            change_state(
                self.r, job_id, JobAction.TRAINERS_STOPPED, reason="no trainer group alive"
            )
        elif state == JobState.RUNNING:
            self.hand_out(job_id, f)

    def plan(self, job_id: str, spec_json: str) -> list[PassSpec]:
        """Every pass of the job in training order (cached per job spec)."""
        cached = self._plans.get(job_id)
        if cached is None or cached[0] != spec_json:
            cached = (spec_json, job_plan(stored_spec(spec_json)))
            self._plans[job_id] = cached
        return cached[1]

    # ---- hand-out ---------------------------------------------------------------------
    def hand_out(self, job_id: str, f: dict[str, str]) -> None:
        """Puts the next pass on the work stream when it is ready and none is in flight."""
        if f.get("in_flight"):
            return
        plan = self.plan(job_id, f["spec"])
        cursor = int(f["cursor"])
        if cursor >= len(plan):
            if int(f["passes_done"]) >= int(f["passes_total"]):
                end = f"{plan[-1].day}/{plan[-1].splits[-1]}" if plan else "-"
                change_state(
                    self.r,
                    job_id,
                    JobAction.SUCCEED,
                    reason=f"every pass done, through split {end}",
                )
            return
        if time.time() < float(f.get("not_before") or 0):
            return  # backing off after an infrastructure restart
        spec = stored_spec(f["spec"])
        now = time.monotonic()
        if now - self._last_probe.get(job_id, 0.0) < spec.data.data_sleep_second:
            return
        p = plan[cursor]
        if not pass_ready(spec.data.train_data_dir, p, spec.data.data_donefile):
            self._last_probe[job_id] = now
            return
        self._last_probe.pop(job_id, None)
        pk = keys.pass_key(p.day, p.pass_id)
        rec = keys.pass_record(job_id, p.day, p.pass_id)
        before = redis_io.hmget(self.r, rec, ["attempts", "state", "failures", "skipped_splits"])
        # a pass that failed the job starts its count afresh when the operator restarts it
        restarted = before[1] == PassState.FAILED.value
        attempts = 1 if restarted else int(before[0] or 0) + 1
        failures = 0 if restarted else int(before[2] or 0)
        skipped = before[3] or "[]"
        resume_from = f.get("last_checkpoint", "") if attempts > 1 else ""
        after = keys.pass_key(plan[cursor - 1].day, plan[cursor - 1].pass_id) if cursor else ""
        now_s = time.time()
        ts = f"{now_s:.3f}"
        item = WorkItem("", p, attempts, resume_from, after, tuple(json.loads(skipped)))
        with self.r.pipeline() as pipe:
            pipe.delete(rec)
            redis_io.hset(
                pipe,
                rec,
                {
                    "day": p.day,
                    "pass_id": str(p.pass_id),
                    "splits": json.dumps(list(p.splits)),
                    "state": PassState.QUEUED.value,
                    "attempts": str(attempts),
                    "failures": str(failures),
                    "skipped_splits": skipped,
                    "resume_from": resume_from,
                    "queued_at": ts,
                },
            )
            pipe.zadd(keys.passes(job_id), {pk: cursor})
            redis_io.xadd(pipe, keys.work(job_id), item.to_fields(now_s))
            redis_io.hset(pipe, keys.job(job_id), {"in_flight": pk, "cursor": str(cursor + 1)})
            append_event(
                pipe,
                job_id,
                "pass",
                f"pass {pk} handed out (attempt {attempts})",
                {"pass": pk, "attempt": attempts, "resume_from": resume_from or None},
            )
            pipe.execute()
        self.metrics.passes_handed_out.labels(job_id).inc()

    # ---- dead groups ------------------------------------------------------------------
    def check_dead(self, job_id: str, f: dict[str, str]) -> None:
        """Requeues the pass in flight when the trainer group that took it is gone.

        Gone: the job's heartbeat key has expired, or it is now renewed by another group (a
        restarted group heartbeats under a new consumer name while the dead one's pass is
        still pending).
        """
        if not f.get("in_flight"):
            return
        rows = self.r.xpending_range(
            keys.work(job_id), keys.TRAINER_GROUP, min="-", max="+", count=16
        )
        if not rows:
            return  # handed out but not taken yet: nobody died holding it
        holders = {row["consumer"] for row in rows}
        raw = redis_io.get(self.r, keys.heartbeat(job_id))
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
        self.requeue(job_id, f, reason, failure=False, infra=True)

    def requeue(
        self,
        job_id: str,
        f: dict[str, str],
        reason: str,
        failure: bool = True,
        fatal: bool = False,
        skip: list[str] | None = None,
        infra: bool = False,
    ) -> None:
        """Hands the pass in flight out again from the last checkpoint, or fails the job.

        The cursor goes back to the pass after the last reported checkpoint (the group loads
        it) and the passes trained since are rolled back (``lineage.py``), so no pass trained
        since then is lost or counted twice. ``failure``: the pass's own failure (a second
        one, or a ``fatal`` one, bad data under ``on_bad_split: fail``, fails the job);
        ``infra``: the group died, was killed or stuck: not the pass's fault, counted against
        the job's restart budget with exponential backoff instead (the job fails when the
        budget is spent); ``skip`` adds splits to the pass's ``skipped_splits``. The cursor
        is rewound either way, so an operator's ``start`` retries from the checkpoint.
        """
        pk = f["in_flight"]
        rec = keys.pass_record(job_id, *keys.parse_pass_key(pk))
        self._ack_work(job_id)
        plan = self.plan(job_id, f["spec"])
        index = {keys.pass_key(p.day, p.pass_id): i for i, p in enumerate(plan)}
        ckpt = f.get("last_checkpoint") or ""
        cursor = resume_cursor(plan, ckpt, limit=index[pk])
        failed_why = None

        def body(pipe: redis.client.Pipeline) -> None:
            nonlocal failed_why
            attempts_raw, failures_raw, skipped_raw = redis_io.hmget(
                pipe, rec, ["attempts", "failures", "skipped_splits"]
            )
            restarts = int(redis_io.hget(pipe, keys.job(job_id), "restarts") or 0)
            rolled = [n for n in done_after(self.r, job_id, plan, cursor) if n != pk]
            attempts = int(attempts_raw or 1)
            failures = int(failures_raw or 0) + (1 if failure else 0)
            skipped = json.loads(skipped_raw or "[]")
            skipped += [x for x in skip or [] if x not in skipped]
            budget = self._restart_budget(f)
            failed_why = (
                reason
                if fatal or failures >= MAX_ATTEMPTS
                else f"{reason}; restart budget spent ({restarts + 1} restarts in a row, "
                f"resources.restart_budget {budget})"
                if infra and restarts + 1 > budget
                else None
            )
            pipe.multi()
            self._queue_pass_outcome(pipe, rec, attempts, failures, skipped, reason, failed_why)
            redis_io.hset(pipe, keys.job(job_id), {"in_flight": "", "cursor": str(cursor)})
            queue_rollback(pipe, job_id, rolled, ckpt, reason)
            if infra:
                self._queue_restart(pipe, job_id, f, restarts + 1, reason)
            if failed_why is not None:
                pipe.hset(keys.job(job_id), "error", f"pass {pk}: {failed_why}")
                self._event(
                    pipe,
                    job_id,
                    "failure",
                    f"pass {pk} failed after {attempts} attempt(s): {failed_why}",
                    pass_=pk,
                    attempts=attempts,
                    resume_from=ckpt or None,
                )
                return
            if skip:
                self._event(
                    pipe,
                    job_id,
                    "skip",
                    f"pass {pk}: bad split(s) {', '.join(skip)} skipped (data.on_bad_split: skip)",
                    pass_=pk,
                    skipped_splits=skipped,
                )
            self._event(
                pipe,
                job_id,
                "requeue",
                f"pass {pk}: {reason}; handing out again from "
                f"{ckpt or 'the start'} ({index[pk] - cursor + 1} pass(es))",
                pass_=pk,
                resume_from=ckpt or None,
                rewound=rolled,
            )

        self.r.transaction(body, rec, keys.job(job_id))
        self._last_probe.pop(job_id, None)
        if failed_why is not None:
            change_state(self.r, job_id, JobAction.FAIL, reason=f"pass {pk}: {failed_why}")
        else:
            self.metrics.passes_requeued.labels(job_id).inc()

    @staticmethod
    def _queue_pass_outcome(
        pipe: redis.client.Pipeline,
        rec: str,
        attempts: int,
        failures: int,
        skipped: list[str],
        reason: str,
        failed_why: str | None,
    ) -> None:
        """The pass record after a requeue: queued again, or failed (it failed the job)."""
        fields = {"error": reason, "retired": str(attempts), "failures": str(failures)}
        if failed_why is not None:
            fields.update(state=PassState.FAILED.value, finished_at=f"{time.time():.3f}")
        else:
            fields.update(state=PassState.QUEUED.value, skipped_splits=json.dumps(skipped))
        redis_io.hset(pipe, rec, fields)

    def _restart_budget(self, f: dict[str, str]) -> int:
        own = stored_spec(f["spec"]).resources.restart_budget
        return self.settings.restart_budget if own is None else own

    def _queue_restart(
        self, pipe: redis.client.Pipeline, job_id: str, f: dict[str, str], n: int, reason: str
    ) -> None:
        """Counts an infrastructure restart (``n`` in a row) and sets the backoff before the
        next hand-out: ``restart_backoff_s * 2**(n-1)``, capped."""
        own = stored_spec(f["spec"]).resources.restart_backoff_s
        base = self.settings.restart_backoff_s if own is None else own
        wait = min(base * 2 ** (n - 1), self.settings.restart_backoff_max_s)
        redis_io.hset(
            pipe, keys.job(job_id), {"restarts": str(n), "not_before": f"{time.time() + wait:.3f}"}
        )
        pipe.hincrby(keys.job(job_id), "restarts_total", 1)
        self.metrics.group_restarts.labels(job_id).inc()
        self._event(
            pipe,
            job_id,
            "restart",
            f"trainer group restart {n} in a row ({reason}); next pass in {wait:.1f} s",
            restarts=n,
            backoff_s=wait,
        )

    @staticmethod
    def _event(
        pipe: redis.client.Pipeline, job_id: str, kind: str, message: str, **data: object
    ) -> None:
        data = {k.rstrip("_"): v for k, v in data.items()}
        append_event(pipe, job_id, kind, message, data)

    def _ack_work(self, job_id: str) -> None:
        """Acknowledges every pending entry of the work group (at most one pass in flight)."""
        rows = self.r.xpending_range(
            keys.work(job_id), keys.TRAINER_GROUP, min="-", max="+", count=1000
        )
        ids = [row["message_id"] for row in rows]
        if ids:
            self.r.xack(keys.work(job_id), keys.TRAINER_GROUP, *ids)
