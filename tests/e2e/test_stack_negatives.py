"""Negatives on a `streamrec up` stack, through REST only: a job with ``sampler.neg_num`` and
no ``sampler.endpoint`` trains against the stack's sampler (not the per-user socket, where a
foreign sampler with another token waits), and a kill -9 of that sampler mid-job is ridden
out: the job succeeds, every pass done once, no restart of the trainer group counted."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from item_tables import day_items, start_sampler_process, write_item_table
from servers import wait_for
from stack_helpers import STREAMREC, Output, child_pids
from streamrec.auth import write_token_file
from streamrec.process import spawn, stop_process

pytestmark = pytest.mark.slow

DAY = "20190720"
SPLITS = 6  # split_interval 240


def foreign_sampler(xdg: Path) -> subprocess.Popen:
    """A sampler at the per-user default socket of ``xdg``, with a token nobody else has
    (the issue's: auto-started by an earlier client, still running)."""
    runtime = xdg / "streamrec"
    runtime.mkdir(mode=0o700)
    token = write_token_file(runtime / "their-token")
    endpoint = f"ipc://{runtime / 'sampler.sock'}"
    return start_sampler_process(
        endpoint, runtime / "foreign.log", token, what="the foreign sampler"
    )


def negative_table(data: Path) -> tuple[Path, int]:
    """items.parquet of every item id (slot 0) of the day, under the data root; and the day's
    clicks."""
    ids, clicks = day_items(sorted(data.glob(f"{DAY}/*/part-*")))
    return write_item_table(data / "items.parquet", ids), clicks


@pytest.mark.timeout(600)
def test_a_negatives_job_uses_the_stacks_sampler_and_survives_its_kill(tmp_path: Path) -> None:
    xdg = Path(tempfile.mkdtemp(prefix="xdg-", dir="/tmp"))  # ipc paths are short
    run = tmp_path / "run"
    foreign = foreign_sampler(xdg)
    env = {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "XDG_RUNTIME_DIR": str(xdg),  # the per-user socket the trainers must not use
    }
    up = spawn(
        [STREAMREC, "up", "--keep-running", "--run-dir", str(run), "--days", "1"]
        + ["--split-interval", "240", "--samples-per-split", "1500", "--slots", "4"]
        + ["--trainers", "2", "--trainer-groups", "1", "--store-shards", "1"]
        + ["--rate", "0", "--max-restarts", "3"],
        log=tmp_path / "up.stderr",
        die_with_parent=True,
        stdout_pipe=True,
        env=env,
    )
    out = Output(up, tmp_path / "up.stderr")
    try:
        out.wait_for("services stay up", timeout=300)  # the demo job ran first
        state = json.loads((run / "stack.json").read_text())
        token = (run / "api-token").read_text().strip()
        http = httpx.Client(
            base_url=state["api_url"], headers={"Authorization": f"Bearer {token}"}, timeout=10
        )
        table, clicks = negative_table(Path(state["data_root"]))
        body = {
            "name": "negatives",
            "data": {
                "train_data_dir": state["data_root"],
                "start_day": DAY,
                "end_day": DAY,
                "split_interval": 240,
                "split_per_pass": 1,
                "data_donefile": "to.hadoop.done",
                "data_sleep_second": 0.2,
            },
            "checkpoint": {
                "model_save_path": f"{state['model_root']}/negatives",
                "checkpoint_per_pass": 1,
            },
            "model": {
                "runner": {"train_batch_size": 64},
                "hyper_parameters": {
                    "sparse_inputs_slots": 4,
                    "arch_sparse_feature_size": 8,
                    "arch_mlp_bot": "13-32-8",
                    "arch_mlp_top": "32-1",
                    "optimizer": "adagrad",
                    "learning_rate": 0.05,
                },
                "negative_sampling": {"table_path": str(table), "item_slot": 0},
            },
            "sampler": {"neg_num": 2},  # no endpoint: the stack's sampler
            "store": {"endpoints": state["store_endpoints"]},
            "resources": {"trainer_ranks": 2},
        }
        resp = http.post("/v1/jobs", json=body)
        assert resp.status_code < 400, resp.text
        job_id = resp.json()["id"]
        assert http.post(f"/v1/jobs/{job_id}/start").status_code < 400

        def passes() -> list[dict]:
            return http.get(f"/v1/jobs/{job_id}/passes", params={"limit": 100}).json()["data"]

        def detail() -> str:
            logs = run / "logs"
            return "\n".join(out.lines[-20:]) + "\n" + (logs / "trainers-0.log").read_text()[-3000:]

        wait_for(
            lambda: any(p["state"] == "done" for p in passes()),
            240,
            0.2,
            what="a first pass done",
            detail=detail,
        )
        sampler_pid = child_pids(run)["sampler"]
        os.kill(sampler_pid, signal.SIGKILL)
        killed = time.time()
        job = wait_for(
            lambda: (
                (j := http.get(f"/v1/jobs/{job_id}").json())["state"] in ("succeeded", "failed")
                and j
            ),
            300,
            0.5,
            what="the job's end",
            detail=detail,
        )
        assert job["state"] == "succeeded", (job, detail())
        done = passes()
        assert Counter((p["day"], p["pass_id"]) for p in done) == Counter(
            {(DAY, i): 1 for i in range(1, SPLITS + 1)}
        ), done
        assert all(p["state"] == "done" for p in done)
        assert sum(p["samples"] for p in done) == 3 * clicks  # each click + 2 negatives
        assert job["restarts_total"] == 0, job  # ridden out: no infrastructure restart
        assert child_pids(run)["sampler"] != sampler_pid  # the launcher started it again
        log = (run / "logs" / "trainers-0.log").read_text(errors="replace")
        assert "unauthorized" not in log and "SamplerRefused" not in log  # never the foreign one
        back = [
            float(s) for s in re.findall(r"back on the sampler at \S+ \(pid \d+\) in (\S+)s", log)
        ]
        after = [p["finished_at"] for p in done if p["finished_at"] > killed]
        assert after and back, log[-3000:]  # passes after the kill, each rank came back
        print(
            f"sampler kill -9: ridden out by {len(back)} rank(s) in {back} s; "
            f"{len(after)} pass(es) done after the kill"
        )
        assert foreign.poll() is None  # untouched, and never talked to
    finally:
        subprocess.run([STREAMREC, "down", "--run-dir", str(run)], capture_output=True, timeout=120)
        stop_process(up, timeout_s=30)
        stop_process(foreign)
        shutil.rmtree(xdg, ignore_errors=True)
