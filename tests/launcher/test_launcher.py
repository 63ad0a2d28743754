"""The launcher's parts without the stack: flag checks, the report rows, the job it submits,
the run state, and `streamrec down` on real processes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from streamrec.api.models import JobCreate
from streamrec.launcher.__main__ import build_parser, check_args
from streamrec.launcher.errors import StackError
from streamrec.launcher.job import TABLE_PARAMETERS, job_spec, tables_config
from streamrec.launcher.report import new_pass_rows, summary_lines, summary_row
from streamrec.launcher.stack import Stack
from streamrec.launcher.state import STATE_FILE, read_state, stack_down, write_state
from streamrec.pass_line import pass_row
from streamrec.process import pid_alive, spawn, stop_process

PASS = {
    "day": "20190720",
    "pass_id": 3,
    "samples": 1000,
    "predict_auc": 0.7,
    "train_auc": 0.72,
    "best_auc": 0.875,
    "logloss": 0.5,
    "seconds": 1.25,
}


@pytest.mark.parametrize(
    "flags,match",
    [
        (["--trainers", "0"], "--trainers"),
        (["--split-interval", "7"], "--split-interval"),
        (["--start-day", "2019-07-20"], "--start-day"),
        (["--api-port", "70000"], "--api-port"),
        (["--rate", "-1"], "--rate"),
    ],
)
def test_stack_flags_checked(flags: list[str], match: str) -> None:
    args = build_parser().parse_args(["up", *flags])
    with pytest.raises(StackError, match=match):
        check_args(args)
    check_args(build_parser().parse_args(["up"]))  # the defaults are valid


def test_stack_summary_rows() -> None:
    assert pass_row(PASS).split() == [
        "20190720",
        "3",
        "1000",
        "0.7000",
        "0.7200",
        "0.8750",
        "0.5000",
        "1.2",
    ]
    assert summary_row(PASS).split()[-1] == "0.800"
    assert summary_row(dict(PASS, predict_auc=None)).split()[-1] == "-"


def test_summary_compares_the_mean_and_the_first_and_last_pass() -> None:
    lines = summary_lines([PASS, dict(PASS, pass_id=4, predict_auc=0.8)])
    assert lines[0].startswith("summary:") and len(lines) == 6
    assert lines[4] == (
        "mean predict AUC 0.7500 vs best 0.8750: 0.857 of the best possible over 2 passes"
    )
    assert lines[5] == "first pass predict AUC 0.7000 -> last 0.8000"
    # nothing reported yet: the header and no means
    assert len(summary_lines([dict(PASS, predict_auc=None)])) == 3


def test_the_progress_counter_counts_each_pass_once_and_never_goes_back() -> None:
    """Two passes done between two polls get [1/4] and [2/4] (not the job's passes_done twice);
    a pass rolled back and trained again is neither shown again nor counted twice."""

    def polled(*states: str) -> list[dict]:
        return [dict(PASS, pass_id=k, state=s) for k, s in enumerate(states, 1)]

    shown: set[tuple[str, int]] = set()
    counters = []
    for passes in (
        polled("done", "done", "running", "queued"),
        polled("done", "rolled_back", "queued", "queued"),  # a rewind to pass 1's checkpoint
        polled("done", "done", "done", "running"),  # pass 2 trained again, then pass 3
        polled("done", "done", "done", "done"),
    ):
        counters += [row.split()[-1] for row in new_pass_rows(passes, shown, 4)]
    assert counters == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"]


def test_the_job_and_the_shards_agree_on_the_tables(tmp_path: Path) -> None:
    args = build_parser().parse_args(["up", "--days", "2", "--slots", "3", "--trainers", "4"])
    spec = job_spec(args, tmp_path, ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"])
    assert (spec["data"]["start_day"], spec["data"]["end_day"]) == ("20190720", "20190721")
    assert spec["store"]["table_parameters"] == TABLE_PARAMETERS
    assert spec["resources"]["trainer_ranks"] == 4
    JobCreate.model_validate(spec)  # what the api accepts: a 422 would end `streamrec up`
    tables = tables_config(3, 8)["tables"]
    assert [t["name"] for t in tables] == ["slot_0", "slot_1", "slot_2"]
    assert all(
        t["dim"] == 8 and t["embed_sgd_param"] == TABLE_PARAMETERS["embed_sgd_param"]
        for t in tables
    )


def test_stack_refuses_a_running_stack(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / STATE_FILE).write_text(json.dumps({"supervisor_pid": os.getpid()}))
    args = build_parser().parse_args(["up", "--run-dir", str(run)])
    with pytest.raises(StackError, match="already runs"):
        Stack(args).prepare()


def test_down_stops_the_recorded_children_and_never_a_reused_pid(tmp_path: Path) -> None:
    recorded = spawn(["sleep", "60"], die_with_parent=True)
    # a live pid whose command is not the recorded one: a pid reused by another program
    other = spawn(["sleep", "60"], die_with_parent=True)
    try:
        write_state(
            tmp_path,
            {
                "supervisor_pid": None,
                "children": {
                    "datagen": {"pid": recorded.pid, "cmd": "sleep"},
                    "api": {"pid": other.pid, "cmd": "streamrec-api"},
                },
            },
        )
        out = io.StringIO()
        assert stack_down(tmp_path, out) == 0
        assert recorded.wait(timeout=10) == -15  # SIGTERM
        assert other.poll() is None and pid_alive(other.pid)
        assert f"stopped datagen (pid {recorded.pid})" in out.getvalue()
        assert "api" not in out.getvalue() and "is down" in out.getvalue()
        assert read_state(tmp_path) is None
        out = io.StringIO()
        assert stack_down(tmp_path, out) == 0 and "no stack recorded" in out.getvalue()
    finally:
        for proc in (recorded, other):
            stop_process(proc)
    assert other.returncode is not None


def test_streamrec_down_without_a_stack(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(Path(sys.executable).parent / "streamrec"), "down", "--run-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "no stack recorded" in out.stdout, out.stderr


SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def fake_shard(group_pid: int) -> list[str]:
    """A shard that says whether the trainer group ``group_pid`` still ran when it started."""
    code = (
        "import os, time; "
        f"print('trainers', 'alive' if os.path.exists('/proc/{group_pid}') else 'gone'); "
        "print('READY', flush=True); time.sleep(60)"
    )
    return [sys.executable, "-c", code]


def test_a_dead_shard_comes_back_after_the_trainers_stop_and_they_start_again(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    out = io.StringIO()
    stack = Stack(build_parser().parse_args(["up", "--run-dir", str(run)]), out)
    stack.trainer_args = lambda group: SLEEPER  # type: ignore[method-assign]
    try:
        trainers = stack.add("trainers-0", SLEEPER, restartable=True)
        first_group = trainers.pid
        assert first_group is not None
        shard = stack.add("store-0", fake_shard(first_group), restartable=True)
        stack.wait_until("shard", lambda: "READY" in shard.output(), shard, 30)
        assert "trainers alive" in shard.output()
        assert shard.proc is not None
        shard.proc.kill()
        shard.proc.wait(timeout=10)
        stack.check_children()  # restarts the shard: the group stopped first, then again
        assert shard.restarts == 1 and shard.exited() is None
        assert "trainers gone" in shard.output()  # the restarted shard's own output only
        assert "alive" not in shard.output()
        assert trainers.pid != first_group and trainers.exited() is None
        assert trainers.restarts == 0  # not a failure of the group
        assert "restarted store-0 (restart 1)" in out.getvalue()
        assert read_state(run)["children"]["store-0"]["pid"] == shard.pid
    finally:
        stack.down()
