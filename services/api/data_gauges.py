"""How a running job stands against its data: the wait for its next pass's data, and how far
training is behind the newest data that has landed.

Two gauges per running job (:class:`~streamrec.api.metrics.ApiMetrics`):

- ``data_wait_seconds``: 0 while the next pass is in flight or ready; else the time since
  the job's newest data landed (the newest donefile of the pass before it, by mtime), or
  since the job became running when it has none. "Data not arriving" is this growing past
  the data's usual interval.
- ``pass_lag_seconds``: data time of the newest pass whose data has landed minus that of the
  pass being trained (or next to train). 0 when none has landed; one pass interval or less
  when training keeps up; shrinking during a backfill of data that landed long ago; growing
  when the data arrives faster than the trainers train.

While no pass is in flight, :meth:`DataGauges.waiting_for` names the split the job waits
for (REST ``waiting_for``, a ``data_wait`` event once per split: ``job_gauges.py``).

Landing is probed on the job's data volume at most every ``probe_interval_s`` per job, with
O(log n) donefile checks (data lands in order, so "ready" is a prefix of the passes).
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable

from streamrec.api.lineage import job_plan
from streamrec.api.metrics import ApiMetrics
from streamrec.api.models import JobCreate, stored_spec
from streamrec.control.records import JobRecord
from streamrec.layout import PassSpec, pass_ready, split_ready


def data_time(p: PassSpec) -> float:
    """Unix time (UTC) at which the data of ``p``'s first split starts."""
    return float(calendar.timegm(time.strptime(p.day + p.splits[0], "%Y%m%d%H%M")))


def landed_at(spec: JobCreate, p: PassSpec) -> float | None:
    """When ``p``'s data landed: the newest mtime of its donefiles (split dirs without one)."""
    donefile = spec.data.data_donefile
    times = []
    for d in p.split_dirs(spec.data.train_data_dir):
        path = d / donefile if donefile else d
        try:
            times.append(path.stat().st_mtime)
        except OSError:
            return None
    return max(times) if times else None


def awaited_split(spec: JobCreate, p: PassSpec) -> str | None:
    """``YYYYMMDD/HHMM`` of the first split of ``p`` that has not landed; None: all have."""
    for split, d in zip(p.splits, p.split_dirs(spec.data.train_data_dir), strict=True):
        if not split_ready(d, spec.data.data_donefile):
            return f"{p.day}/{split}"
    return None


def newest_ready(spec: JobCreate, plan: list[PassSpec], start: int) -> int:
    """The last index >= ``start`` whose pass is ready, every one before it ready too; or
    ``start - 1`` when ``plan[start]`` is not. Gallops, then bisects: O(log n) checks."""
    root, donefile = spec.data.train_data_dir, spec.data.data_donefile

    def ready(i: int) -> bool:
        return pass_ready(root, plan[i], donefile)

    if start >= len(plan) or not ready(start):
        return start - 1
    good, step = start, 1
    while good + step < len(plan) and ready(good + step):
        good, step = good + step, step * 2
    bad = min(good + step, len(plan))  # not ready, or past the end
    while bad - good > 1:
        mid = (good + bad) // 2
        if ready(mid):
            good = mid
        else:
            bad = mid
    return good


class DataGauges:
    """Sets the data gauges of running jobs from their spec and cursor (the job's hash).

    Args:
        metrics: where the gauges live.
        probe_interval_s: the least time between two probes of one job's data volume.
        clock: wall clock (tests).
    """

    def __init__(
        self,
        metrics: ApiMetrics,
        probe_interval_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.metrics = metrics
        self.probe_interval_s = probe_interval_s
        self.clock = clock
        self._plans: dict[str, tuple[str, JobCreate, list[PassSpec]]] = {}
        self._probed: dict[str, float] = {}

    def observe(self, job_id: str, job: JobRecord) -> None:
        """Probes ``job_id``'s data (at most every ``probe_interval_s``) and sets its gauges."""
        now = self.clock()
        if now - self._probed.get(job_id, float("-inf")) < self.probe_interval_s:
            return
        self._probed[job_id] = now
        spec, plan = self._plan(job_id, job)
        cursor = job.cursor
        in_flight = job.in_flight is not None
        position = cursor - 1 if in_flight and cursor > 0 else cursor
        newest = newest_ready(spec, plan, position)
        lag = data_time(plan[newest]) - data_time(plan[position]) if newest >= position else 0.0
        wait = 0.0
        if not in_flight and position < len(plan) and newest < position:
            since = landed_at(spec, plan[position - 1]) if position > 0 else None
            if since is None:
                since = job.updated_at if job.updated_at is not None else now
            wait = max(now - since, 0.0)
        self.metrics.pass_lag.labels(job_id).set(max(lag, 0.0))
        self.metrics.data_wait.labels(job_id).set(wait)

    def _plan(self, job_id: str, job: JobRecord) -> tuple[JobCreate, list[PassSpec]]:
        """The job's spec and plan, cached per job while its spec is unchanged."""
        raw = job.spec
        cached = self._plans.get(job_id)
        if cached is None or cached[0] != raw:
            spec = stored_spec(raw)
            cached = (raw, spec, job_plan(spec))
            self._plans[job_id] = cached
        return cached[1], cached[2]

    def waiting_for(self, job_id: str, job: JobRecord) -> str | None:
        """``YYYYMMDD/HHMM``: the first split of the job's next pass whose donefile has not
        landed, while no pass is in flight; None when the next pass is ready, in flight, or
        there is none. At most ``split_per_pass`` stats, so it runs every tick."""
        if job.in_flight:
            return None
        spec, plan = self._plan(job_id, job)
        cursor = job.cursor
        return awaited_split(spec, plan[cursor]) if cursor < len(plan) else None

    def forget(self, job_id: str) -> None:
        """Drops what is cached for a job no longer running (its gauges: ``forget_running``)."""
        self._plans.pop(job_id, None)
        self._probed.pop(job_id, None)
