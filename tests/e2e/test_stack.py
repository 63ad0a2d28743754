"""`streamrec up` end to end (a short run): every service as a real process, a trainer group
killed mid-run and restarted, the REST API used live, then `streamrec down`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from servers import wait_for
from stack_helpers import STREAMREC, Output, start_stack, stderr_log
from streamrec.process import descendants, pid_alive

pytestmark = pytest.mark.slow
DEBUG = os.environ.get("E2E_DEBUG") == "1"


@pytest.mark.timeout(420)
def test_stack_up_restart_rest_down(tmp_path: Path) -> None:
    run = tmp_path / "run"
    up = start_stack(
        run,
        "--samples-per-split",
        "1500",
        "--trainers",
        "2",
        "--trainer-groups",
        "1",  # the job's group is trainers-0
        "--store-shards",
        "2",
        "--timeout-s",
        "240",
        "--keep-running",
    )
    out = Output(up, stderr_log(run))
    try:
        out.wait_for("trainers         1 group(s) of 2 rank(s)", timeout=120)
        state = json.loads((run / "stack.json").read_text())
        pids = {name: info["pid"] for name, info in state["children"].items()}
        want = {"redis", "store-0", "store-1", "sampler", "api", "datagen", "trainers-0"}
        assert set(pids) >= want
        # the first pass is done: kill the trainer launcher outright (its ranks, in sessions
        # of their own, notice they are orphaned and exit; the group is dead)
        out.wait_for("[1/6]", timeout=120)
        state = json.loads((run / "stack.json").read_text())  # now with the job's id
        ranks = [p for p in descendants(pids["trainers-0"])]
        assert len(ranks) >= 2
        os.killpg(pids["trainers-0"], signal.SIGKILL)
        out.wait_for("! trainers-0 exited with code", timeout=30)
        out.wait_for("restarted trainers-0 (restart 1)", timeout=30)
        out.wait_for("job ", timeout=240)
        out.wait_for("services stay up", timeout=60)
        text = out.text
        assert "succeeded" in text, text
        rows = [line for line in text.splitlines() if line.startswith("20190720 ")]
        summary = text.split("summary:")[1]
        assert len([r for r in summary.splitlines() if r.startswith("20190720 ")]) == 6
        assert "mean predict AUC" in summary and "of the best possible" in summary
        assert len(rows) == 12  # six live rows, six summary rows
        # the API is live while kept running: the README's REST calls work
        token = (run / "api-token").read_text().strip()
        api = state["api_url"]
        headers = {"Authorization": f"Bearer {token}"}
        job = httpx.get(f"{api}/v1/jobs/{state['job_id']}", headers=headers, timeout=10).json()
        assert job["state"] == "succeeded" and job["passes_done"] == 6
        passes = httpx.get(
            f"{api}/v1/jobs/{state['job_id']}/passes", headers=headers, timeout=10
        ).json()
        assert all(p["state"] == "done" for p in passes["data"]) and passes["count"] == 6
        auc = [p["predict_auc"] for p in passes["data"]]
        assert auc[-1] > auc[0] and all(0 < p["best_auc"] <= 1 for p in passes["data"])
        events = httpx.get(
            f"{api}/v1/jobs/{state['job_id']}/events",
            params={"limit": 1000},
            headers=headers,
            timeout=10,
        ).json()["data"]
        assert len([e for e in events if e["type"] == "trainer"]) == 2  # the restart
        resp = httpx.post(f"{api}/v1/jobs/{state['job_id']}/start", headers=headers, timeout=10)
        assert resp.status_code == 409 and resp.json()["state"] == "succeeded"
        assert httpx.post(f"{api}/v1/jobs/{state['job_id']}/stop", timeout=10).status_code == 401
        # models on disk: checkpoints, then base and batch after the day's last pass
        assert (run / "models" / "demo" / "20190720" / "6" / "MANIFEST.json").is_file()
        assert (run / "models" / "demo" / "20190720" / "base" / "MANIFEST.json").is_file()
        # redis persisted with an append-only file
        assert any((run / "redis").rglob("*.aof")) or (run / "redis" / "appendonlydir").is_dir()
        # streamrec down stops everything
        down = subprocess.run(
            [STREAMREC, "down", "--run-dir", str(run)], capture_output=True, text=True, timeout=120
        )
        assert down.returncode == 0 and "is down" in down.stdout, down.stdout + down.stderr
        assert up.wait(timeout=60) == 0
        wait_for(
            lambda: not [p for p in pids.values() if pid_alive(p)],
            20,
            0.2,
            what="every service process gone",
            detail=lambda: str([p for p in pids.values() if pid_alive(p)]),
        )
        assert not [p for p in ranks if pid_alive(p)]  # the orphaned ranks of the first group
        assert not (run / "stack.json").exists()
        if DEBUG:
            print(
                "\n".join(f"{t} {line}" for t, line in zip(out.times, out.lines, strict=False)),
                time.strftime("%T"),
            )
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(timeout=60)
            except subprocess.TimeoutExpired:
                up.kill()
