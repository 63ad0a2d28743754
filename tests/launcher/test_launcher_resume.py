"""`streamrec up --resume`: a run stopped on two store shards goes on on three.

The slow test runs `streamrec up` (2 shards) as a real process, stops its job over REST
after its first pass (the launcher then ends), and runs `streamrec up --resume --store-shards 3`
in the same run directory: the job ends succeeded, its checkpoint resharded 2 -> 3 (the
trainer's event and the summary say so), every pass done once, and the lineage of
``passes.jsonl`` exact (each kept pass trained after the one before it). The others check
the refusals without a stack.
"""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stderr
from pathlib import Path

import httpx
import pytest
from servers import wait_for
from streamrec.launcher import commands
from streamrec.launcher.__main__ import build_parser, main
from streamrec.launcher.errors import StackError
from streamrec.launcher.job import read_run, write_run
from streamrec.launcher.resume import ResumedStack, missing_splits
from streamrec.launcher.serving import ServingRedis
from streamrec.launcher.state import stack_down
from streamrec.process import spawn, stop_process

STREAMREC = str(Path(sys.executable).parent / "streamrec")
DAY = "20190720"
#: one day of four splits, a pass each, small enough for two CPUs
SMALL = [
    "--days",
    "1",
    "--split-interval",
    "360",
    "--samples-per-split",
    "600",
    "--slots",
    "4",
    "--trainers",
    "1",
    "--trainer-groups",
    "1",
    "--timeout-s",
    "150",
]


def test_resume_without_an_earlier_run_is_refused_naming_the_flag(tmp_path: Path) -> None:
    err = io.StringIO()
    with redirect_stderr(err):
        rc = main(["up", "--resume", "--run-dir", str(tmp_path / "run")])
    assert rc == 2
    assert "--resume: no earlier run in" in err.getvalue(), err.getvalue()
    assert not (tmp_path / "run" / "redis").exists()  # nothing started, nothing written


def test_resume_keeps_the_runs_job_flags_and_refuses_another_value(tmp_path: Path) -> None:
    parser = build_parser()
    defaults = vars(parser.parse_args(["up"]))
    first = parser.parse_args(["up", "--run-dir", str(tmp_path), *SMALL, "--store-shards", "2"])
    tmp_path.mkdir(exist_ok=True)
    endpoints = commands.store_endpoints(tmp_path, 0, 2)
    serving = ServingRedis.of_run(tmp_path)
    write_run(tmp_path, first, "job-1", endpoints, serving)
    assert read_run(tmp_path)["flags"]["trainers"] == 1
    again = parser.parse_args(["up", "--run-dir", str(tmp_path), "--resume", "--store-shards", "3"])
    stack = ResumedStack(again, defaults, out=io.StringIO())
    assert (again.trainers, again.days, again.split_interval) == (1, 1, 360)  # the run's
    assert stack.store_endpoints[:2] == endpoints and stack.shards_before == 2
    assert stack.serving == serving  # the job names it: the same port again
    assert missing_splits(again, tmp_path / "data") == 4  # no data yet: datagen runs
    other = parser.parse_args(["up", "--run-dir", str(tmp_path), "--resume", "--days", "3"])
    with pytest.raises(StackError, match="--days 3: the run in .* was made with 1"):
        ResumedStack(other, defaults, out=io.StringIO())
    moved = parser.parse_args(["up", "--run-dir", str(tmp_path), "--resume", "--store-port", "7"])
    with pytest.raises(StackError, match="--store-port"):
        ResumedStack(moved, defaults, out=io.StringIO())
    url = ["--online-redis-url", "redis://elsewhere:6379/0"]
    online = parser.parse_args(["up", "--run-dir", str(tmp_path), "--resume", *url])
    with pytest.raises(StackError, match="--online-redis-url .* the run's job publishes to"):
        ResumedStack(online, defaults, out=io.StringIO())


def test_store_endpoints_depend_on_the_shard_number_only(tmp_path: Path) -> None:
    two, three = (commands.store_endpoints(tmp_path, 0, n) for n in (2, 3))
    assert three[:2] == two and three[2] == f"ipc://{tmp_path / 'store-2.sock'}"
    assert commands.store_endpoints(tmp_path, 7100, 2) == [
        "tcp://127.0.0.1:7100",
        "tcp://127.0.0.1:7101",
    ]


def rest(run: Path) -> tuple[httpx.Client, str]:
    """A REST client of the stack in ``run`` (its token) and the demo job's id."""
    state = json.loads((run / "stack.json").read_text())
    token = (run / "api-token").read_text().strip()
    client = httpx.Client(
        base_url=state["api_url"], headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    return client, state["job_id"]


def job_of(run: Path) -> dict | None:
    try:
        client, job_id = rest(run)
        if job_id is None:
            return None
        with client:
            return client.get(f"/v1/jobs/{job_id}").json()
    except (OSError, ValueError, KeyError, httpx.HTTPError):
        return None  # not up yet, or between two states of stack.json


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_run_stopped_on_2_shards_goes_on_on_3_with_up_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    log1, log2 = tmp_path / "up-1.log", tmp_path / "up-2.log"
    # a split every 10 s: the job is stopped with passes left
    first = spawn(
        [STREAMREC, "up", "--run-dir", str(run), *SMALL, "--store-shards", "2", "--rate", "0.1"],
        log=log1,
        die_with_parent=True,
    )
    try:
        wait_for(
            lambda: first.poll() is not None or ((j := job_of(run)) and j["passes_done"] >= 1),
            timeout=100,
            interval=0.2,
            what="the first pass on 2 shards",
            detail=lambda: log1.read_text(errors="replace")[-3000:],
        )
        assert first.poll() is None, log1.read_text()
        client, job_id = rest(run)
        with client:
            assert client.post(f"/v1/jobs/{job_id}/stop").status_code == 200
        assert first.wait(timeout=60) == 1  # the job stopped: `up` ends, the stack goes down
    finally:
        stop_process(first)
    text = log1.read_text()
    assert f"job {job_id} stopped" in text, text
    stopped_at = json.loads((run / "models" / "demo" / "passes.jsonl").read_text().splitlines()[-1])
    assert stopped_at["pass_id"] < 4, "the job ended before the stop: nothing to resume"
    assert sorted((run / "models" / "demo" / DAY / "1" / "sparse").glob("shard-*-of-2"))

    second = spawn(
        [STREAMREC, "up", "--run-dir", str(run), "--resume", "--store-shards", "3"]
        + ["--trainer-groups", "1", "--timeout-s", "150", "--keep-running"],
        log=log2,
        die_with_parent=True,
    )
    try:
        wait_for(
            lambda: second.poll() is not None or "services stay up" in log2.read_text(),
            timeout=170,
            interval=0.3,
            what="the resumed job's end",
            detail=lambda: log2.read_text(errors="replace")[-3000:],
        )
        out = log2.read_text()
        assert second.poll() is None, out
        assert f"job {job_id} succeeded" in out, out
        resumed = next(line for line in out.splitlines() if line.startswith("  job "))
        assert "goes on from checkpoint" in resumed, resumed
        assert resumed.endswith("resharded 2 -> 3"), resumed
        said = next(line for line in out.splitlines() if line.startswith("resharded 2 -> 3: "))
        assert f"checkpoint {DAY}/" in said and "resharded 2 -> 3 shards" in said, said
        client, same = rest(run)
        with client:
            assert same == job_id
            job = client.get(f"/v1/jobs/{job_id}").json()
            passes = client.get(f"/v1/jobs/{job_id}/passes").json()["data"]
            events = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()
        assert (job["state"], job["passes_done"]) == ("succeeded", 4), job
        assert [(p["pass_id"], p["state"]) for p in passes] == [(k, "done") for k in (1, 2, 3, 4)]
        resharded = [e for e in events["data"] if (e.get("data") or {}).get("resharded")]
        assert [e["data"]["resharded"] for e in resharded] == ["2 -> 3"], resharded
        # the lineage: each kept pass trained once, after the one before it
        lines = (run / "models" / "demo" / "passes.jsonl").read_text().splitlines()
        kept = [r for r in map(json.loads, lines) if not r.get("rolled_back")]
        names = [f"{DAY}/{k}" for k in (1, 2, 3, 4)]
        assert [f"{r['day']}/{r['pass_id']}" for r in kept] == names, lines
        assert [r["after"] for r in kept] == [None, *names[:-1]], kept
        last = run / "models" / "demo" / DAY / "4" / "sparse"
        assert len(sorted(last.glob("shard-*-of-3"))) == 3, sorted(last.iterdir())
    finally:
        stack_down(run, out=io.StringIO())
        stop_process(second)
