"""A disk that fills in the middle of a job and frees again: the job rides it out.

A real tmpfs is the job's model directory. After the second pass a file fills it to the last
byte, so the next checkpoint fails with ENOSPC; 12 s later the file is removed. A full disk is
the disk's state, not the pass's: the pass is handed out again from the last checkpoint as
an infrastructure restart (backoff and budget, no failed attempt), as often as the disk
stays full, and the job goes on once space is back. Nothing half written stays behind.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from agent_helpers import alive, finished, land_day, run_agent, small_job, started_job
from servers import tmpfs, wait_for
from streamrec.process import stop_process

DAY = "20190720"
PASSES = 6
#: How long the disk stays full.
FULL_S = 12.0


def fill(root: Path) -> Path:
    """A file taking every free byte of ``root``'s filesystem; returns it."""
    filler = root / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for size in (1 << 20, 4096, 1):  # MiB blocks, then the last bytes
            block = b"\0" * size
            try:
                while os.write(fd, block) == size:
                    pass
            except OSError:
                continue
    finally:
        os.close(fd)
    return filler


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_disk_full_for_seconds_mid_job_is_ridden_out(client, roots, redis_server, tmp_path):
    data = roots["data"] / "fulldisk"
    land_day(data)
    with tmpfs(roots["model"] / "fulldisk", 64 << 20) as model:
        body = small_job("fulldisk", data, model)
        body["data"]["split_interval"] = 240
        job_id = started_job(client, body)
        log = tmp_path / "agent.log"
        agent = run_agent(redis_server.url, job_id, log)
        freed: list[float] = []
        try:
            wait_for(
                lambda: (
                    alive(agent, log) or client.get(f"/v1/jobs/{job_id}").json()["passes_done"] >= 2
                ),
                120,
                0.05,
                what="2 passes done",
            )
            filler = fill(model)
            full_at = time.monotonic()

            def free() -> None:
                time.sleep(FULL_S)
                filler.unlink()
                freed.append(time.monotonic() - full_at)

            thread = threading.Thread(target=free, daemon=True)
            thread.start()
            job = finished(client, job_id, agent, log, timeout=200)
            thread.join(timeout=FULL_S + 5)
        finally:
            stop_process(agent)
        assert job["state"] == "succeeded", job
        assert freed, "the disk was never freed"
        events = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
        restarts = [e for e in events if e["type"] == "restart"]
        assert restarts, "the full disk restarted nothing"
        assert all("[Errno 28]" in e["message"] or "no_space" in e["message"] for e in restarts)
        passes = client.get(f"/v1/jobs/{job_id}/passes", params={"limit": 100}).json()["data"]
        assert [p["state"] for p in passes] == ["done"] * PASSES
        assert all(p["failures"] == 0 for p in passes), passes
        # every pass recorded once, nothing half written: no staging, every checkpoint whole
        lines = [json.loads(x) for x in (model / "passes.jsonl").read_text().splitlines()]
        kept = [x["pass_id"] for x in lines if not x.get("rolled_back")]
        assert kept == list(range(1, PASSES + 1)), lines
        leftovers = [p for p in model.rglob("*") if ".tmp-" in p.name or p.name.endswith(".part")]
        assert not leftovers, leftovers
        for checkpoint in (model / DAY).iterdir():
            if checkpoint.name.isdigit():
                assert (checkpoint / "MANIFEST.json").is_file(), checkpoint
        print(
            f"disk full for {freed[0]:.1f} s: {len(restarts)} restart(s), job "
            f"{job['passes_done']}/{PASSES} passes"
        )
