"""The "your own data" walk-through of services/trainer/README.md, run as written: its shell
blocks, in order in one bash, beside a `streamrec up --keep-running` stack (a Parquet event
log laid out by event time, then trained over REST with a ``data.schema``, as Parquet and as
slot text); then each job read back over REST; then the walk-through pasted a second time,
which stops at once naming why instead of waiting for ever.

As a user runs it: from a directory holding ``.venv`` (the walk-through activates it; the
test's PATH does not have it) with ``RUN`` naming the stack's run directory (not the
default one: the walk-through does not assume it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from doc_blocks import blocks_for
from stack_helpers import STREAMREC, Output, start_stack, stderr_log
from streamrec.process import stop_process

pytestmark = pytest.mark.slow

#: A job's line printed by the walk-through's ``train``: its id and its state.
JOB_LINE = re.compile(r"^([0-9a-f]{16}) (\w+)\b(.*)$")


def walkthrough_script() -> str:
    """The section's ```sh blocks, joined in order: what a user pastes into one shell
    (tests/doc_blocks.py RUN_BY)."""
    blocks = blocks_for(__file__)
    assert len(blocks) == 4, "the walk-through's blocks: stack, event log, parquet job, slot job"
    return "\n".join(blocks)


@pytest.mark.timeout(600)
def test_the_own_data_walkthrough_runs_as_written(tmp_path: Path) -> None:
    run = tmp_path / "stack"  # not the default .run/streamrec: the walk-through reads $RUN
    (tmp_path / ".venv").symlink_to(sys.prefix)  # the checkout's venv, as the README has it
    up = start_stack(
        run,
        "--samples-per-split",
        "200",
        "--trainer-groups",
        "1",
        "--keep-running",
        split_interval=720,  # the demo job: 2 short passes before the stack stays up
        rate=0,
    )
    out = Output(up, stderr_log(run))
    try:
        out.wait_for("services stay up", timeout=240)
        venv_bin = str(Path(sys.prefix) / "bin")
        path = ":".join(p for p in os.environ["PATH"].split(":") if p != venv_bin)
        env = {**os.environ, "PATH": path, "RUN": str(run)}
        env.pop("VIRTUAL_ENV", None)

        def paste(timeout: float) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["bash", "-euo", "pipefail", "-c", walkthrough_script()],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )

        done = paste(240)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        lines = done.stdout.splitlines()
        laid = [json.loads(line) for line in lines if line.startswith('{"events"')]
        jobs = [m.groups() for line in lines if (m := JOB_LINE.match(line))]
        assert len(laid) == 2 and len(jobs) == 2, done.stdout
        assert all(counts["events"] == 4000 and counts["late"] == 0 for counts in laid)
        printed = [line for line in lines if " predict AUC " in line]
        assert len(printed) == sum(counts["splits"] for counts in laid), done.stdout

        state = json.loads((run / "stack.json").read_text())
        http = httpx.Client(
            base_url=state["api_url"],
            headers={"Authorization": f"Bearer {(run / 'api-token').read_text().strip()}"},
            timeout=10,
        )
        aucs = []
        for (job_id, job_state, error), counts, fmt in zip(
            jobs, laid, ("parquet", "slot"), strict=True
        ):
            assert job_state == "succeeded", (job_id, job_state, error)
            job = http.get(f"/v1/jobs/{job_id}").json()
            assert job["state"] == "succeeded" and job["spec"]["data"]["data_format"] == fmt
            assert job["spec"]["data"]["schema"]["sparse"][3]["table"] == "genres"
            assert job["passes_done"] == job["passes_total"] == counts["splits"] == 8
            passes = http.get(f"/v1/jobs/{job_id}/passes", params={"limit": 1000}).json()["data"]
            assert len(passes) == counts["splits"], passes
            assert all(p["state"] == "done" and p["samples"] > 0 for p in passes), passes
            for kind in ("predict_auc", "train_auc"):
                assert all(isinstance(p[kind], float) and 0 <= p[kind] <= 1 for p in passes)
            assert sum(p["samples"] for p in passes) == 4000  # no line malformed
            assert passes[-1]["predict_auc"] > 0.5, passes  # the planted click is learnt
            aucs.append([p["predict_auc"] for p in passes])
        # slot text's string ids are hashed as Parquet's: the same keys, the same model
        assert aucs[1] == pytest.approx(aucs[0], abs=0.01), aucs

        # pasted again: the events are late, the job's model path is the first job's (409):
        # the walk-through stops there, naming it, and creates nothing
        again = paste(60)  # a wait on an empty job id would run into the timeout
        assert again.returncode != 0, again.stdout
        assert "4000 events dropped as late" in again.stderr, again.stderr
        assert "train events: no job created:" in again.stderr, again.stderr
        assert "model_path_taken" in again.stderr and jobs[0][0] in again.stderr, again.stderr
        names = [job["name"] for job in http.get("/v1/jobs", params={"limit": 500}).json()["data"]]
        assert names.count("events") == names.count("events-slot") == 1, names
        http.close()
    finally:
        subprocess.run([STREAMREC, "down", "--run-dir", str(run)], capture_output=True, timeout=120)
        stop_process(up, timeout_s=30)
