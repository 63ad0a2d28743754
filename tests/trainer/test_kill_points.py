"""Lineage exact at every instant a process can die: kill -9 at a named point of a pass.

A job of 6 passes checkpointed every 2 runs on the real API and real trainer processes. A
rank pauses at a kill point (``STREAMREC_FAULT=pause_*``, :mod:`streamrec.trainer.faults`):
inside pass 4's checkpoint save, just after pass 3's ``passes.jsonl`` line, or just after
pass 3's ``pass_done`` report reached Redis (pass 3: no checkpoint holds it). The test then
kills -9 a rank (torchrun restarts the group), the whole group (the test starts another) or
the store shard (restarted empty at the same endpoint; the group goes on). Whatever the point
and the victim, the job ends with REST, ``passes.jsonl`` and the checkpoints agreeing: each
pass done once; every kept line of ``passes.jsonl`` trained on the model after the line
before it (its ``after``), so no pass REST calls done is missing from the model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from agent_helpers import SMALL_MODEL, agent_args, land_day, small_job, started_job
from api_helpers import TEST_STORE_ENDPOINT
from servers import wait_for
from streamrec.process import spawn, stop_process

pytestmark = pytest.mark.slow

DAY = "20190720"
PASSES = 6
#: (kill point, the occurrence it fires at): pass 3 has no checkpoint; pass 4's is the 2nd save
POINTS = {
    "pause_after_pass_done": 3,
    "pause_after_pass_log": 3,
    "pause_in_save": 2,
}


def group_command(redis_url: str, job_id: str, ranks: int) -> list[str]:
    """The job's trainer group: ``ranks`` agents under torchrun, which restarts them all
    when one dies (as ``streamrec up`` runs them); one rank: the agent alone."""
    if ranks == 1:
        return [sys.executable, "-m", "streamrec.trainer.agent", *agent_args(redis_url, job_id)]
    return [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
        *("--nproc-per-node", str(ranks), "--max-restarts", "3"),
        *("-m", "streamrec.trainer.agent", *agent_args(redis_url, job_id)),
    ]


def start_group(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    return spawn(
        cmd,
        log=log,
        die_with_parent=True,
        # each restart's ranks meet in a fresh store (as the launcher runs them): the
        # shared one hands out the dead ranks' gloo addresses
        env={
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            **env,
        },
    )  # in a new session: killpg reaches torchrun and its ranks


def rank_pids(group: subprocess.Popen) -> list[int]:
    """The agent processes under torchrun (its children)."""
    out = subprocess.run(
        ["pgrep", "-P", str(group.pid)], capture_output=True, text=True, check=False
    ).stdout
    return [int(p) for p in out.split()]


def kill_group(group: subprocess.Popen) -> None:
    """kill -9 of torchrun and every rank (its session), as a node's death would."""
    os.killpg(group.pid, signal.SIGKILL)
    group.wait(timeout=30)


def rest_passes(client, job_id: str) -> list[dict]:
    return client.get(f"/v1/jobs/{job_id}/passes", params={"limit": 1000}).json()["data"]


def events(client, job_id: str, kind: str) -> list[dict]:
    body = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()
    return [e for e in body["data"] if e["type"] == kind]


def check_lineage(client, job_id: str, model: Path) -> list[dict]:
    """REST, passes.jsonl and the checkpoints agree pass by pass; returns the REST passes."""
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["state"] == "succeeded", job
    names = [f"{DAY}/{p}" for p in range(1, PASSES + 1)]
    rest = {f"{p['day']}/{p['pass_id']}": p for p in rest_passes(client, job_id)}
    assert sorted(rest, key=lambda n: int(n.split("/")[1])) == names
    assert all(rest[n]["state"] == "done" for n in names), rest
    assert job["passes_done"] == PASSES, job
    lines = [json.loads(x) for x in (model / "passes.jsonl").read_text().splitlines()]
    kept = [x for x in lines if not x.get("rolled_back")]
    assert [f"{x['day']}/{x['pass_id']}" for x in kept] == names, lines
    # each pass trained on the model after the one before it: none missing, none twice
    assert [x["after"] for x in kept] == [None, *names[:-1]], kept
    assert job["last_checkpoint"] == names[-1]
    for n in names[1::2]:  # checkpoint_per_pass 2: complete checkpoints of passes 2, 4, 6
        assert (model / n / "MANIFEST.json").is_file(), sorted(model.rglob("*"))
    return list(rest.values())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("point", list(POINTS))
@pytest.mark.parametrize("victim", ["rank", "group", "shard"])
def test_a_kill_at_any_point_leaves_rest_and_the_model_agreeing(
    client, roots, redis_server, tmp_path, point, victim
):
    from streamrec.control.trainer_config import TrainerConfig
    from streamrec.embedding_store import LocalShards
    from streamrec.trainer.store_tables import build_table_options

    data = roots["data"] / f"kill-{point}-{victim}"
    model = roots["model"] / f"kill-{point}-{victim}"
    land_day(data)
    tables = build_table_options(TrainerConfig.parse(SMALL_MODEL))
    (tmp_path / "tables.json").write_text(
        json.dumps({"tables": [t.model_dump(mode="json") for t in tables]})
    )
    ranks = 2 if victim == "rank" else 1
    faults = tmp_path / "faults"
    faults.mkdir()
    env = {"STREAMREC_FAULT": f"{point}@0#{POINTS[point]}", "STREAMREC_FAULT_DIR": str(faults)}
    marker = faults / f"{point}.0"
    with LocalShards(tmp_path / "tables.json", 1, endpoint=TEST_STORE_ENDPOINT) as shards:
        body = small_job(
            f"kill-{point}-{victim}",
            data,
            model,
            store={"endpoints": shards.endpoints},
            resources={"trainer_ranks": ranks, "restart_backoff_s": 0.1},
        )
        body["data"]["split_interval"] = 240
        body["checkpoint"]["checkpoint_per_pass"] = 2
        job_id = started_job(client, body)
        cmd = group_command(redis_server.url, job_id, ranks)
        log = tmp_path / "group.log"
        group = start_group(cmd, log, env)
        second = None
        try:
            wait_for(marker.exists, 150, 0.05, what=f"{point} reached", detail=log.read_text)
            if victim == "rank":  # rank 1 dies: torchrun restarts the whole group
                pids = rank_pids(group)
                paused = int(marker.read_text())
                (other,) = [p for p in pids if p != paused]
                os.kill(other, signal.SIGKILL)
            elif victim == "group":
                kill_group(group)
                second = start_group(cmd, tmp_path / "group-2.log", env)
            else:  # the shard: killed, restarted empty at its address; the group goes on
                shards.kill(0)
                shards.start_shard(0)
                marker.unlink()
            running = second or group
            job = wait_for(
                lambda: (
                    (j := client.get(f"/v1/jobs/{job_id}").json())["state"]
                    in ("succeeded", "failed")
                    and j
                ),
                timeout=200,
                interval=0.2,
                what="job finished",
                detail=lambda: log.read_text()[-4000:],
            )
            assert job["state"] == "succeeded", (job, log.read_text()[-4000:])
        finally:
            for g in (group, second):
                if g is not None:
                    stop_process(g)
        assert running is not None
    rest = check_lineage(client, job_id, model)
    rolled = {n for e in events(client, job_id, "rollback") for n in e["data"]["rolled_back"]}
    if point == "pause_after_pass_done" and victim != "shard":
        # pass 3 was done when its group died: the new one came back at checkpoint 2
        assert f"{DAY}/3" in rolled, events(client, job_id, "rollback")
        p3 = next(p for p in rest if p["pass_id"] == 3)
        assert p3["attempts"] >= 2, p3
    lines = [json.loads(x) for x in (model / "passes.jsonl").read_text().splitlines()]
    marked = {f"{x['day']}/{x['pass_id']}" for x in lines if x.get("rolled_back")}
    assert marked <= rolled, (marked, rolled)
