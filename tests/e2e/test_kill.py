"""Kill -9 of each service mid-job on a real `streamrec up` stack, one after another in one
run: the sampler, the API, Redis, a trainer rank and a store shard. After each kill the test
waits for the first pass handed out after it to finish and prints the recovery time (kill
-> that pass done: a whole pass included; the data is all there, so no wait for it); at
the end the job has succeeded and every pass is recorded exactly once, in the REST pass list
and in ``passes.jsonl``.

What brings each one back (``streamrec.launcher.stack``): the launcher restarts the child at
the same address; Redis reloads its append-only file and its clients reconnect; a store
shard's death restarts the trainer group too, whose warm start reloads the last checkpoint
into every shard while the API hands the pass in flight out again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx
import pytest
from servers import wait_for
from stack_helpers import STREAMREC, Output, child_pids, start_stack, stderr_log, trainer_rank

pytestmark = pytest.mark.slow

DAY = "20190720"
SPLIT_INTERVAL = 30
PASSES = 1440 // SPLIT_INTERVAL
#: The order of the kills; each waits for a pass done after the previous one.
KILLS = ("sampler", "api", "redis", "trainer-rank", "store-1")


class Rest:
    """The job's REST view, riding out the API's own restart (errors are retried until the
    caller's deadline)."""

    def __init__(self, run: Path, out: Output) -> None:
        self.run = run
        self.out = out
        state = json.loads((run / "stack.json").read_text())
        self.base = state["api_url"]
        self.job_id = state["job_id"]
        token = (run / "api-token").read_text().strip()
        self.http = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=5)

    def get(self, path: str) -> dict | None:
        """``GET /v1/jobs/{id}{path}``; None while the API or Redis is down."""
        try:
            resp = self.http.get(f"{self.base}/v1/jobs/{self.job_id}{path}", params={"limit": 1000})
        except httpx.TransportError:
            return None
        return resp.json() if resp.status_code == 200 else None

    def wait(self, what: str, check: Callable[[], object], timeout: float) -> object:
        logs = self.run / "logs"
        return wait_for(
            check,
            timeout,
            0.2,
            what=what,
            detail=lambda: (
                "output:\n"
                + "\n".join(self.out.lines[-40:])
                + "\ntrainers' log:\n"
                + "\n".join(
                    (logs / "trainers-0.log").read_text(errors="replace").splitlines()[-30:]
                )
            ),
        )

    def passes(self) -> list[dict]:
        body = self.get("/passes")
        return body["data"] if body else []

    def done_after(self, t: float) -> float | None:
        """When the first pass handed out after ``t`` (wall clock) finished, None before. The
        API stamps ``queued_at`` as it hands a pass out (a rewound one anew), so that pass
        was trained after ``t``; the recovery time of a kill at ``t`` thus includes a whole
        pass, and the end of the one in flight at the kill."""
        ends = [
            p["finished_at"]
            for p in self.passes()
            if p["state"] == "done" and (p.get("queued_at") or 0) > t
        ]
        return min(ends) if ends else None


def victim(run: Path, name: str) -> int:
    pids = child_pids(run)
    return trainer_rank(pids["trainers-0"], 1) if name == "trainer-rank" else pids[name]


@pytest.mark.timeout(420)
def test_kill_each_service_mid_job_every_pass_exactly_once(tmp_path: Path) -> None:
    run = tmp_path / "run"
    up = start_stack(
        run,
        "--samples-per-split",
        "300",
        "--trainers",
        "2",
        "--trainer-groups",
        "1",  # the job's group is trainers-0
        "--store-shards",
        "2",
        "--max-restarts",
        "3",
        "--timeout-s",
        "330",
        "--keep-running",
        split_interval=SPLIT_INTERVAL,
        rate=0,
    )
    out = Output(up, stderr_log(run))
    recovery: dict[str, float] = {}
    kill_times: dict[str, tuple[float, int]] = {}
    try:
        out.wait_for("trainers         1 group(s) of 2 rank(s)", timeout=120)
        out.wait_for("  job  ", timeout=60)  # submitted after the pool: stack.json names it
        rest = Rest(run, out)
        rest.wait("a first pass done", lambda: rest.done_after(0), timeout=90)
        for name in KILLS:
            done = [p for p in rest.passes() if p["state"] == "done"]
            assert len(done) < PASSES - 1, f"the job ran out of passes before killing {name}"
            if name in ("trainer-rank", "store-1"):  # a pass in flight, when one comes soon
                rest.wait(
                    f"a pass in flight before killing {name}",
                    lambda: any(p["state"] in ("queued", "running") for p in rest.passes()),
                    timeout=30,
                )
            done = [p for p in rest.passes() if p["state"] == "done"]
            last_done = max((p["pass_id"] for p in done), default=0)
            pid = victim(run, name)
            t_kill = time.time()
            kill_times[name] = (t_kill, last_done)
            os.kill(pid, signal.SIGKILL)
            if name != "trainer-rank":  # a rank is restarted with its group by torchrun
                out.wait_for(f"! {name} exited with code", timeout=30)
            t_done = rest.wait(
                f"a pass done after killing {name}", partial(rest.done_after, t_kill), timeout=120
            )
            assert isinstance(t_done, float)
            recovery[name] = t_done - t_kill
            print(f"kill -9 {name} (pid {pid}): next pass done {recovery[name]:.1f}s later")
        out.wait_for(f"job {rest.job_id} ", timeout=240)
        out.wait_for("services stay up", timeout=60)
        assert f"job {rest.job_id} succeeded" in out.text, out.text
        for name in KILLS:
            if name != "trainer-rank":
                assert f"restarted {name} (restart 1)" in out.text, out.text
        assert "restarted the trainer groups after store-1" in out.text
        # every pass exactly once: the REST pass list ...
        job = rest.get("")
        assert job is not None and job["state"] == "succeeded" and job["passes_done"] == PASSES
        passes = rest.passes()
        keys = Counter((p["day"], p["pass_id"]) for p in passes)
        assert keys == Counter({(DAY, i): 1 for i in range(1, PASSES + 1)}), keys
        assert all(p["state"] == "done" for p in passes)
        # ... and the trainers' own record of the passes they finished
        lines = (run / "models" / "demo" / "passes.jsonl").read_text().splitlines()
        recorded = Counter((r["day"], r["pass_id"]) for r in map(json.loads, lines))
        assert recorded == Counter({(DAY, i): 1 for i in range(1, PASSES + 1)}), recorded
        for line in out.lines:
            if line.startswith(("! ", "  restarted")):
                print(line)
        events = (rest.get("/events") or {}).get("data", [])
        for e in events:
            if e["type"] in ("requeue", "failure"):
                print(f"event {e['type']}: {e['message']}")
        # the group started after the shard's death loaded a checkpoint into every shard (the
        # restarted one came up empty), one at least as new as the last pass seen done
        t_kill, last_done = kill_times["store-1"]
        up_after = [e for e in events if e["type"] == "trainer" and e["ts"] > t_kill]
        assert up_after, events
        resumed = up_after[0]["data"].get("resumed_from")
        assert resumed is not None and resumed.startswith(f"{DAY}/"), up_after[0]
        assert int(resumed.split("/")[1]) >= last_done, (resumed, last_done)
        print(
            "recovery (kill -> next pass done): "
            + ", ".join(f"{n} {s:.1f}s" for n, s in recovery.items())
        )
        down = subprocess.run(
            [STREAMREC, "down", "--run-dir", str(run)], capture_output=True, text=True, timeout=120
        )
        assert down.returncode == 0, down.stdout + down.stderr
        assert up.wait(timeout=60) == 0
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(timeout=60)
            except subprocess.TimeoutExpired:
                up.kill()
