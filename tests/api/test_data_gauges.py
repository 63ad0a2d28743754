"""The data gauges of a running job (pass lag, data wait) on a real data directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from api_helpers import land_split
from prometheus_client import CollectorRegistry
from streamrec.api.data_gauges import DataGauges, data_time, newest_ready
from streamrec.api.lineage import job_plan
from streamrec.api.metrics import ApiMetrics
from streamrec.api.models import JobCreate
from streamrec.control.records import JobRecord

SPLITS = ("0000", "0600", "1200", "1800")  # split_interval 360: four passes a day
HOURS_6 = 6 * 3600.0


def spec(root: Path, **data: object) -> JobCreate:
    return JobCreate.model_validate(
        {
            "name": "t",
            "data": {
                "train_data_dir": str(root),
                "start_day": "20190720",
                "end_day": "20190721",
                "split_interval": 360,
                "split_per_pass": 1,
                "data_donefile": "DONE",
                **data,
            },
            "checkpoint": {"model_save_path": str(root.parent / "models")},
        }
    )


def land(root: Path, n: int) -> None:
    """Lands the first ``n`` splits of the two days, in order."""
    for i in range(n):
        land_split(root, ("20190720", "20190721")[i // 4], SPLITS[i % 4])


def gauge(metrics: ApiMetrics, name: str, job: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"job_id": job})


@pytest.mark.parametrize("landed", [0, 1, 2, 5, 7, 8])
def test_newest_ready_finds_the_end_of_the_landed_prefix(tmp_path: Path, landed: int) -> None:
    land(tmp_path, landed)
    s = spec(tmp_path)
    plan = job_plan(s)
    assert len(plan) == 8
    assert newest_ready(s, plan, 0) == landed - 1
    assert newest_ready(s, plan, min(landed, 7)) == (landed - 1 if landed < 8 else 7)


def test_data_time_is_the_first_splits_start_utc(tmp_path: Path) -> None:
    (p,) = [p for p in job_plan(spec(tmp_path)) if p.day == "20190721" and p.pass_id == 2]
    assert data_time(p) == 1563667200 + HOURS_6  # 2019-07-21 06:00 UTC


def fields(s: JobCreate, cursor: int, in_flight: bool, updated_at: float = 0.0) -> JobRecord:
    """The job's record as the API reads it from the hash these fields are."""
    return JobRecord.from_fields(
        {
            "spec": json.dumps(s.model_dump(mode="json")),
            "cursor": str(cursor),
            "in_flight": "20190720-1" if in_flight else "",
            "updated_at": str(updated_at),
        }
    )


def test_lag_follows_the_landed_data_and_wait_the_newest_donefile(tmp_path: Path) -> None:
    now = [1_000_000.0]
    metrics = ApiMetrics(CollectorRegistry())
    metrics.scheduler_leader.set(1)  # the gauges are served by the leader only
    gauges = DataGauges(metrics, probe_interval_s=0.0, clock=lambda: now[0])
    s = spec(tmp_path)
    land(tmp_path, 6)
    # training pass 2 (cursor 2, in flight) while passes up to 6 have landed: 4 passes behind
    gauges.observe("j", fields(s, cursor=2, in_flight=True))
    assert gauge(metrics, "streamrec_api_pass_lag_seconds", "j") == 4 * HOURS_6
    assert gauge(metrics, "streamrec_api_data_wait_seconds", "j") == 0
    # caught up: pass 6 done, pass 7 not landed; the wait runs from pass 6's donefile
    done6 = tmp_path / "20190721" / "0600" / "DONE"
    os.utime(done6, (now[0] - 120, now[0] - 120))
    gauges.observe("j", fields(s, cursor=6, in_flight=False))
    assert gauge(metrics, "streamrec_api_pass_lag_seconds", "j") == 0
    assert gauge(metrics, "streamrec_api_data_wait_seconds", "j") == 120
    # nothing landed at all: the wait runs from when the job became running
    empty = tmp_path / "none"
    gauges.observe("k", fields(spec(empty), cursor=0, in_flight=False, updated_at=now[0] - 30))
    assert gauge(metrics, "streamrec_api_data_wait_seconds", "k") == 30


def test_probes_are_rate_limited_per_job(tmp_path: Path) -> None:
    now = [0.0]
    metrics = ApiMetrics(CollectorRegistry())
    metrics.scheduler_leader.set(1)  # the gauges are served by the leader only
    gauges = DataGauges(metrics, probe_interval_s=30.0, clock=lambda: now[0])
    s = spec(tmp_path)
    land(tmp_path, 3)
    gauges.observe("j", fields(s, cursor=0, in_flight=False))
    assert gauge(metrics, "streamrec_api_pass_lag_seconds", "j") == 2 * HOURS_6
    land(tmp_path, 5)
    now[0] = 10.0
    gauges.observe("j", fields(s, cursor=0, in_flight=False))
    assert gauge(metrics, "streamrec_api_pass_lag_seconds", "j") == 2 * HOURS_6  # not probed
    now[0] = 31.0
    gauges.observe("j", fields(s, cursor=0, in_flight=False))
    assert gauge(metrics, "streamrec_api_pass_lag_seconds", "j") == 4 * HOURS_6


def test_tick_gauges_are_served_only_by_the_scheduler_leader() -> None:
    """A replica that lost the lease serves none of its (stale) tick gauges; counters and the
    leader gauge itself are always served."""
    metrics = ApiMetrics(CollectorRegistry())
    metrics.start_job("j")
    metrics.work_queue_depth.labels("j").set(3)
    metrics.pass_lag.labels("j").set(60)
    metrics.jobs_waiting_for_trainers.set(1)
    metrics.scheduler_leader.set(0)
    names = {s.name for f in metrics.registry.collect() for s in f.samples}
    assert "streamrec_api_work_queue_depth" not in names
    assert "streamrec_api_pass_lag_seconds" not in names
    assert "streamrec_api_jobs_waiting_for_trainers" not in names
    assert {"streamrec_api_scheduler_leader", "streamrec_api_passes_done_total"} <= names
    metrics.scheduler_leader.set(1)
    assert gauge(metrics, "streamrec_api_work_queue_depth", "j") == 3
    assert metrics.registry.get_sample_value("streamrec_api_jobs_waiting_for_trainers") == 1
