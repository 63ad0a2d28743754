"""The "your own data" walk-through of services/trainer/README.md, run as written: its shell
blocks, in order in one bash, in the directory of a `streamrec up --keep-running` stack (a
Parquet event log laid out by event time, then trained over REST with a ``data.schema``, as
Parquet and as slot text); then each job read back over REST."""

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


@pytest.mark.timeout(420)
def test_the_own_data_walkthrough_runs_as_written(tmp_path: Path) -> None:
    run = tmp_path / ".run" / "streamrec"  # where the README's RUN points, from tmp_path
    run.parent.mkdir()
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
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", walkthrough_script()],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
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
        http.close()
        # slot text's string ids are hashed as Parquet's: the same keys, the same model
        assert aucs[1] == pytest.approx(aucs[0], abs=0.01), aucs
    finally:
        subprocess.run([STREAMREC, "down", "--run-dir", str(run)], capture_output=True, timeout=120)
        stop_process(up, timeout_s=30)
