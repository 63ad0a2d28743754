"""The running jobs' liveness gauges: heartbeat age, progress age and work queue depth, and
how each stands against its data (:mod:`~streamrec.api.data_gauges`).

Set each scheduler tick for every running job, dropped when a job stops running. The ages
keep growing once a group's heartbeat key has expired (the last heartbeat seen is kept), and
start from the moment the job became running when no group has beaten yet, so the alerts
on them (services/observability/alerts.py) fire for a group that never came up.

Each tick also drops the gauges of deleted jobs that outlive the job's run (the last pass's
collapse flag, which an alert pages on: :meth:`~streamrec.api.metrics.ApiMetrics.forget_job`).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from streamrec.api.data_gauges import DataGauges
from streamrec.api.metrics import ApiMetrics
from streamrec.api.models import stored_spec
from streamrec.api.pool_records import WAITING
from streamrec.api.repo import Repo
from streamrec.control.records import JobRecord


class RunningJobGauges:
    """The gauges of running jobs, from Redis.

    Args:
        repo: the API's repository.
        metrics: where the gauges live.
    """

    def __init__(self, repo: Repo, metrics: ApiMetrics) -> None:
        self.repo = repo
        self.metrics = metrics
        #: Per running job: (heartbeat ts, progress ts) of the last heartbeat seen.
        self._beats: dict[str, tuple[float, float]] = {}
        self.data = DataGauges(metrics)

    def observe(self, running: list[str]) -> None:
        """Sets the heartbeat and progress ages and the work queue depth of every running
        job; drops those gauges for jobs no longer running."""
        now = time.time()
        for job_id in running:
            # the Redis reads first, then the sets together: a scrape in between would see
            # only some of a job's gauges
            job = self.repo.job_record_or_none(job_id) or JobRecord()
            beat_ts, progress_ts = self._last_beat(job_id, job)
            depth = self.repo.work.depth(job_id)
            waiting = job.trainers == WAITING
            if waiting and not self.repo.has_heartbeat(job_id):
                # no group serves the job: that is jobs_waiting_for_trainers' alert, not a
                # dead or stalled group's; the ages start again when a group takes it
                self._beats[job_id] = (now, now)
                for gauge in (self.metrics.heartbeat_age, self.metrics.progress_age):
                    with contextlib.suppress(KeyError):  # never set
                        gauge.remove(job_id)
            else:
                self.metrics.heartbeat_age.labels(job_id).set(max(now - beat_ts, 0.0))
                self.metrics.progress_age.labels(job_id).set(max(now - progress_ts, 0.0))
            self.metrics.work_queue_depth.labels(job_id).set(depth)
            self.data.observe(job_id, job)
            self.note_wait(job_id, job)
        for job_id in set(self._beats) - set(running):
            del self._beats[job_id]
            self.data.forget(job_id)
            self.metrics.forget_running(job_id)
        self.forget_deleted()

    def forget_deleted(self) -> None:
        """Drops the last-pass gauges of the jobs that no longer exist (deleted)."""
        for job_id in self.metrics.collapse_gauged_jobs():
            if self.repo.job_state(job_id) is None:
                self.metrics.forget_job(job_id)

    def note_wait(self, job_id: str, job: JobRecord) -> None:
        """Keeps the job's ``waiting_for`` (the split its next pass waits for) in its hash,
        and writes a ``data_wait`` event the first time each split is waited for."""
        awaited = self.data.waiting_for(job_id, job) or ""
        if awaited == (job.waiting_for or ""):
            return
        event = None
        if awaited:
            spec = stored_spec(job.spec).data
            where = Path(spec.train_data_dir) / awaited
            what = f"{where}/{spec.data_donefile}" if spec.data_donefile else str(where)
            event = (
                f"waiting for split {awaited}: {what} is not there yet",
                {"split": awaited, "path": what},
            )
        self.repo.set_waiting_for(job_id, awaited, event)

    def _last_beat(self, job_id: str, job: JobRecord) -> tuple[float, float]:
        """(heartbeat ts, progress ts), wall clock: the live heartbeat's, else the last one
        seen, else when the job became running (the job's ``updated_at``: no group has
        beaten since)."""
        raw = self.repo.heartbeat(job_id)
        beat: Any = None
        if raw is not None:
            with contextlib.suppress(ValueError):
                beat = json.loads(raw)
        ts = beat.get("ts") if isinstance(beat, dict) else None
        if isinstance(ts, int | float):
            progress = beat.get("progress_ts")
            found = (float(ts), float(progress) if isinstance(progress, int | float) else float(ts))
            self._beats[job_id] = found
            return found
        if job_id not in self._beats:
            since = job.updated_at if job.updated_at is not None else time.time()
            self._beats[job_id] = (since, since)
        return self._beats[job_id]
