"""The control plane runs the trainers: `streamrec up --keep-running`, then REST calls only.

One stack for the module (two trainer groups of 2 ranks in the pool, two store shards, the
demo's planted day); each test drives its jobs over REST and reads back what REST, the events,
the store shards and ``passes.jsonl`` say. The README's REST example is run as written.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from doc_blocks import blocks_for
from servers import wait_for
from stack_helpers import STREAMREC, Output, child_pids, trainer_rank
from streamrec.embedding_store import EmbeddingStoreClient
from streamrec.process import spawn, stop_process

pytestmark = pytest.mark.slow

DAY = "20190720"
#: The demo's day: 12 splits of 120 minutes, 8 slots.
SPLITS = 12


class Stack:
    """A running `streamrec up --keep-running` in ``cwd`` and a REST client of its API."""

    def __init__(self, cwd: Path, proc: subprocess.Popen, out: Output) -> None:
        self.cwd = cwd
        self.run = cwd / ".run" / "streamrec"
        self.proc = proc
        self.out = out
        self.state = json.loads((self.run / "stack.json").read_text())
        token = (self.run / "api-token").read_text().strip()
        self.http = httpx.Client(
            base_url=self.state["api_url"],
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )

    def call(self, method: str, path: str, **kw: Any) -> Any:
        resp = self.http.request(method, f"/v1/jobs{path}", **kw)
        assert resp.status_code < 400, (method, path, resp.status_code, resp.text)
        return resp.json() if resp.content else None

    def create(self, name: str, **overrides: Any) -> str:
        body: dict[str, Any] = {
            "name": name,
            "data": {
                "train_data_dir": self.state["data_root"],
                "start_day": DAY,
                "end_day": DAY,
                "split_interval": 120,
                "split_per_pass": 1,
                "data_donefile": "to.hadoop.done",
                "data_sleep_second": 0.2,
            },
            "checkpoint": {
                "model_save_path": f"{self.state['model_root']}/{name}",
                "checkpoint_per_pass": 1,
            },
            "model": model(8),
            "store": {"endpoints": self.state["store_endpoints"]},
            "resources": {"trainer_ranks": 2},
        }
        for section, values in overrides.items():
            body[section] = {**body.get(section, {}), **values}
        return self.call("POST", "", json=body)["id"]

    def job(self, job_id: str) -> dict[str, Any]:
        return self.call("GET", f"/{job_id}")

    def passes(self, job_id: str) -> list[dict[str, Any]]:
        return self.call("GET", f"/{job_id}/passes", params={"limit": 1000})["data"]

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return self.call("GET", f"/{job_id}/events", params={"limit": 1000})["data"]

    def wait(self, what: str, check: Callable[[], Any], timeout: float = 240) -> Any:
        return wait_for(
            check, timeout, 0.2, what=what, detail=lambda: "\n".join(self.out.lines[-30:])
        )

    def wait_state(self, job_id: str, *states: str, timeout: float = 240) -> dict[str, Any]:
        return self.wait(
            f"job {job_id} in {states}",
            lambda: (j := self.job(job_id))["state"] in states and j,
            timeout,
        )

    def idle(self) -> None:
        """Until no job runs (every group back in the pool)."""
        self.wait(
            "every job ended",
            lambda: not self.call("GET", "", params={"state": "running"})["data"],
        )

    def group_pid(self, job_id: str) -> int:
        """The torchrun process of the group that runs ``job_id``."""
        group = self.wait(f"a group for {job_id}", lambda: self.job(job_id)["group"])
        return child_pids(self.run)[group]


def model(dim: int, batch: int = 256) -> dict[str, Any]:
    return {
        "runner": {"train_batch_size": batch},
        "hyper_parameters": {
            "sparse_inputs_slots": 8,
            "arch_sparse_feature_size": dim,
            "arch_mlp_bot": f"13-32-{dim}",
            "arch_mlp_top": "32-1",
            "optimizer": "adagrad",
            "learning_rate": 0.05,
        },
    }


def each_pass_once(stack: Stack, job_id: str) -> None:
    """REST and the trainer's passes.jsonl list every pass of the day once, done."""
    passes = stack.passes(job_id)
    assert Counter((p["day"], p["pass_id"]) for p in passes) == Counter(
        {(DAY, i): 1 for i in range(1, SPLITS + 1)}
    ), passes
    assert all(p["state"] == "done" for p in passes), [p["state"] for p in passes]
    name = stack.job(job_id)["name"]
    lines = (Path(stack.state["model_root"]) / name / "passes.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert not [r for r in records if r.get("rolled_back")]
    assert Counter((r["day"], r["pass_id"]) for r in records) == Counter(
        {(DAY, i): 1 for i in range(1, SPLITS + 1)}
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    cwd = tmp_path_factory.mktemp("pool")
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    run = cwd / ".run" / "streamrec"  # where `streamrec up` puts it when started in cwd
    proc = spawn(
        [
            STREAMREC,
            "up",
            "--keep-running",
            "--run-dir",
            str(run),
            "--days",
            "1",
            "--samples-per-split",
            "800",
        ],
        log=cwd / "up.stderr",
        die_with_parent=True,
        stdout_pipe=True,
        env=env,
    )
    out = Output(proc, cwd / "up.stderr")
    try:
        out.wait_for("services stay up", timeout=300)
        assert "succeeded" in out.text, out.text
        yield Stack(cwd, proc, out)
    finally:
        subprocess.run([STREAMREC, "down", "--run-dir", str(run)], capture_output=True, timeout=120)
        stop_process(proc, timeout_s=30)


def readme_rest_example() -> str:
    """README.md's "Start and stop a job over REST" block (tests/doc_blocks.py RUN_BY)."""
    (block,) = blocks_for(__file__)
    return block


def test_the_readme_rest_example_runs_as_written(stack: Stack) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", readme_rest_example()],
        cwd=stack.cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    job = json.loads(done.stdout.splitlines()[-2])
    assert job["state"] == "succeeded", job
    assert job["passes_done"] == job["passes_total"] == SPLITS // 2
    assert job["trainers"] == "assigned" or job["group"] is None  # released once it ended
    events = stack.events(job["id"])
    assert any(e["type"] == "pool" and "assigned to trainer group" in e["message"] for e in events)


def test_two_jobs_with_other_dims_run_at_once_on_their_own_rows(stack: Stack) -> None:
    stack.idle()
    a = stack.create("dim4", model=model(4))
    b = stack.create("dim12", model=model(12))
    stack.call("POST", f"/{a}/start")
    stack.call("POST", f"/{b}/start")

    def both_at_once() -> set[str] | None:
        """The two jobs' groups at one moment, when each has its own (a job whose group
        could not start it goes back to the pool and may show another group first)."""
        held = {stack.job(j)["group"] for j in (a, b)}
        return held if len(held) == 2 and "" not in held and None not in held else None

    groups = stack.wait("a group for each job at once", both_at_once, 60)
    assert groups == {"trainers-0", "trainers-1"}  # both at once, one group each
    for job_id, dim in ((a, 4), (b, 12)):
        assert stack.wait_state(job_id, "succeeded", "failed")["state"] == "succeeded"
        each_pass_once(stack, job_id)
        with EmbeddingStoreClient(
            stack.state["store_endpoints"],
            namespace=job_id,
            auth_token_file=stack.run / "peer-token",
        ) as store:
            tables = store.tables
            assert {t.dim for t in tables.values()} == {dim}
            assert sum(store.size(t) for t in tables) > 0
    # a new job never reads another's rows: each starts near chance on its first pass
    for job_id in (a, b):
        first = stack.passes(job_id)[0]
        assert abs(first["predict_auc"] - 0.5) < 0.1, first
    # deleting a job frees its rows on the shards (an idle group drops its namespace)
    stack.call("DELETE", f"/{a}")

    def gone() -> bool:
        with EmbeddingStoreClient(
            stack.state["store_endpoints"], auth_token_file=stack.run / "peer-token"
        ) as store:
            held = [s["namespaces"] for s in store.stats()["shards"]]
        return all(a not in h for h in held) and all(b in h for h in held)

    stack.wait("job a's rows freed", gone, 60)


def test_a_job_no_group_fits_waits_visibly(stack: Stack) -> None:
    job_id = stack.create("toobig", resources={"trainer_ranks": 3})
    stack.call("POST", f"/{job_id}/start")
    job = stack.wait(
        "waiting_for_trainers",
        lambda: (j := stack.job(job_id))["trainers"] == "waiting_for_trainers" and j,
        30,
    )
    assert job["state"] == "running" and job["group"] is None
    workers = stack.call("GET", f"/{job_id}/workers")
    assert workers["trainers"] == "waiting_for_trainers" and workers["alive"] is False
    assert any(
        e["type"] == "pool" and "waiting for trainers" in e["message"] for e in stack.events(job_id)
    )
    metrics = httpx.get(f"{stack.state['api_url']}/metrics", timeout=10).text
    assert re.search(r"^streamrec_api_jobs_waiting_for_trainers 1\.0$", metrics, re.M), metrics
    stack.call("POST", f"/{job_id}/stop")
    stack.wait_state(job_id, "stopped", timeout=30)
    stack.call("DELETE", f"/{job_id}")


def test_stop_then_start_goes_on_from_the_last_checkpoint(stack: Stack) -> None:
    stack.idle()
    job_id = stack.create("stopstart", checkpoint={"checkpoint_per_pass": 3})
    stack.call("POST", f"/{job_id}/start")
    stack.wait("4 passes done", lambda: stack.job(job_id)["passes_done"] >= 4)
    stack.call("POST", f"/{job_id}/stop")
    stopped = stack.wait_state(job_id, "stopped", timeout=60)
    ckpt = int(stopped["last_checkpoint"].split("/")[1])
    done = sorted(p["pass_id"] for p in stack.passes(job_id) if p["state"] == "done")
    assert ckpt % 3 == 0 and done and done[-1] > ckpt, (ckpt, done)
    stack.call("POST", f"/{job_id}/start")
    # the passes after the checkpoint are rolled back at once, then trained again
    rolled = [p["pass_id"] for p in stack.passes(job_id) if p["state"] == "rolled_back"]
    assert rolled == [p for p in done if p > ckpt], (rolled, done, ckpt)
    assert stack.job(job_id)["passes_done"] == ckpt
    assert stack.wait_state(job_id, "succeeded", "failed")["state"] == "succeeded"
    each_pass_once(stack, job_id)
    events = stack.events(job_id)
    rollback = [e for e in events if e["type"] == "rollback"]
    assert rollback and rollback[0]["data"]["rolled_back"] == [f"{DAY}/{p}" for p in rolled]


def kill_when_running(stack: Stack, job_id: str, pass_id: int, rank: int, sig: int) -> int:
    """Sends ``sig`` to rank ``rank`` of the job's group once pass ``pass_id`` runs there."""
    stack.wait(
        f"pass {pass_id} running",
        lambda: any(
            p["pass_id"] == pass_id and p["state"] == "running" for p in stack.passes(job_id)
        ),
        120,
    )
    pid = trainer_rank(stack.group_pid(job_id), rank)
    os.kill(pid, sig)
    return pid


def test_a_rank_killed_three_times_on_one_pass_does_not_fail_the_job(stack: Stack) -> None:
    stack.idle()
    # 3 passes of 4 splits, small batches: a pass lasts seconds, long enough to be seen running
    job_id = stack.create("killed", data={"split_per_pass": 4}, model=model(8, batch=4))
    stack.call("POST", f"/{job_id}/start")
    pids = set()
    for n in range(3):
        pids.add(kill_when_running(stack, job_id, 2, 1, signal.SIGKILL))
        stack.wait(f"restart {n + 1}", lambda n=n: stack.job(job_id)["restarts_total"] > n, 90)
    assert len(pids) == 3  # a new rank each time (torchrun restarted the group)
    job = stack.wait_state(job_id, "succeeded", "failed")
    assert job["state"] == "succeeded", job
    assert job["restarts_total"] == 3 and job["restarts"] == 0
    p2 = next(p for p in stack.passes(job_id) if p["pass_id"] == 2)
    assert p2["failures"] == 0 and p2["attempts"] == 4, p2
    restarts = [e for e in stack.events(job_id) if e["type"] == "restart"]
    assert len(restarts) == 3


def test_sigterm_of_a_rank_releases_its_pass(stack: Stack) -> None:
    stack.idle()
    job_id = stack.create("sigterm", data={"split_per_pass": 4}, model=model(8, batch=4))
    stack.call("POST", f"/{job_id}/start")
    kill_when_running(stack, job_id, 2, 0, signal.SIGTERM)
    job = stack.wait_state(job_id, "succeeded", "failed")
    assert job["state"] == "succeeded", job
    events = stack.events(job_id)
    assert any("released by a trainer group that was stopped" in e["message"] for e in events)
    p2 = next(p for p in stack.passes(job_id) if p["pass_id"] == 2)
    assert p2["failures"] == 0 and p2["state"] == "done"
    assert stack.job(job_id)["restarts_total"] == 1  # an infrastructure restart, not a failure


def test_a_shard_lost_before_the_first_checkpoint_replays_from_the_start(stack: Stack) -> None:
    stack.idle()
    job_id = stack.create("shardlost", checkpoint={"checkpoint_per_pass": 100})
    stack.call("POST", f"/{job_id}/start")
    stack.wait("3 passes done", lambda: stack.job(job_id)["passes_done"] >= 3)
    os.kill(child_pids(stack.run)["store-1"], signal.SIGKILL)
    stack.out.wait_for("restarted store-1", timeout=90)
    job = stack.wait_state(job_id, "succeeded", "failed", timeout=300)
    assert job["state"] == "succeeded", job
    each_pass_once(stack, job_id)
    # every shard and the dense model went back to the start together, and an event says
    # which passes were trained again
    rollback = [e for e in stack.events(job_id) if e["type"] == "rollback"]
    assert rollback and rollback[0]["data"]["resume_from"] is None
    assert f"{DAY}/1" in rollback[0]["data"]["rolled_back"]
