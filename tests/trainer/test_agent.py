"""The real trainer agent (streamrec.trainer.agent, one rank) driven by the real API.

A small planted stream; the job is started, trained pass by pass, sent triggers, stopped,
started again (the new agent warm-starts from the checkpoint) and finished.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from agent_helpers import (
    SMALL_MODEL,
    agent_args,
    datagen,
    finished,
    pass_done,
    run_agent,
    small_job,
    started_job,
)
from api_helpers import TEST_SAMPLER_ENDPOINT, TEST_STORE_ENDPOINT
from servers import wait_for
from streamrec.process import spawn, stop_process


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_agent_trains_obeys_triggers_stops_and_resumes(client, roots, redis_server, tmp_path):
    data = roots["data"] / "agent"
    model = roots["model"] / "agent"
    datagen(data, max_splits=1)  # only pass 1 of 2 has landed
    body = small_job("agent", data, model)
    job = client.post("/v1/jobs", json=body)
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    assert client.post(f"/v1/jobs/{job_id}/start").status_code == 200
    agent = run_agent(redis_server.url, job_id, tmp_path / "agent1.log")
    try:
        p1 = pass_done(client, job_id, 1, agent, tmp_path / "agent1.log")
        assert p1["samples"] == 1500 and p1["ranks"] == 1 and p1["malformed_lines"] == 0
        assert 0.5 < p1["train_auc"] <= 1 and 0 < p1["best_auc"] <= 1
        assert p1["logloss"] > 0 and p1["seconds"] > 0
        job = wait_for(
            lambda: (j := client.get(f"/v1/jobs/{job_id}").json())["last_checkpoint"] and j,
            timeout=30,
            what="checkpoint reported",
        )
        assert job["last_checkpoint"] == "20190720/1"
        assert (model / "20190720" / "1" / "MANIFEST.json").is_file()
        # the heartbeat (renewed every ttl/3) carries progress: the API tells stuck from alive
        workers = wait_for(
            lambda: (
                (w := client.get(f"/v1/jobs/{job_id}/workers").json())["heartbeat"]["last_pass"]
                == "20190720/1"
                and not w["heartbeat"]["busy"]
                and w
            ),
            what="heartbeat after pass 1",
        )
        assert workers["alive"] is True and workers["stuck"] is False
        beat = workers["heartbeat"]
        assert beat["step"] == -(-p1["samples"] // 128) and beat["progress_ts"] <= time.time()
        # triggers while the agent idles waiting for pass 2
        made = [
            client.post(f"/v1/jobs/{job_id}/triggers", json=b).json()
            for b in (
                {"kind": "checkpoint"},
                {"kind": "export", "mode": "delta"},
                {"kind": "shrink"},
            )
        ]
        done = [
            wait_for(
                lambda t=t: (
                    (g := client.get(f"/v1/jobs/{job_id}/triggers/{t['id']}").json())["state"]
                    != "pending"
                    and g
                ),
                timeout=60,
                what=f"trigger {t['kind']}",
            )
            for t in made
        ]
        assert [t["state"] for t in done] == ["done", "done", "done"], done
        assert Path(done[0]["result"]["path"]) == model / "20190720" / "1"
        assert Path(done[1]["result"]["path"]) == model / "20190720" / "delta_1"
        assert (model / "20190720" / "delta_1" / "MANIFEST.json").is_file()
        assert isinstance(done[2]["result"]["deleted"], dict)
        # stop: the agent obeys, reports, and leaves
        assert client.post(f"/v1/jobs/{job_id}/stop").json()["state"] == "stopping"
        assert agent.wait(timeout=60) == 0
        wait_for(
            lambda: client.get(f"/v1/jobs/{job_id}").json()["state"] == "stopped", what="stopped"
        )
        assert client.get(f"/v1/jobs/{job_id}/workers").json()["alive"] is False
    finally:
        stop_process(agent)
    # the rest of the day lands; start again: a new agent warm-starts from 20190720/1, the
    # checkpoint the API names, not from a newer complete one on disk it never reported
    shutil.copytree(model / "20190720" / "1", model / "20190720" / "2")
    datagen(data)
    assert client.post(f"/v1/jobs/{job_id}/start").json()["state"] == "running"
    agent = run_agent(redis_server.url, job_id, tmp_path / "agent2.log")
    try:
        job = wait_for(
            lambda: (
                (j := client.get(f"/v1/jobs/{job_id}").json())["state"] in ("succeeded", "failed")
                and j
            ),
            timeout=150,
            interval=0.2,
            what="job finished",
        )
        assert job["state"] == "succeeded", job
        assert agent.wait(timeout=60) == 0
    finally:
        stop_process(agent)
    passes = client.get(f"/v1/jobs/{job_id}/passes").json()["data"]
    assert [(p["pass_id"], p["state"], p["attempts"]) for p in passes] == [
        (1, "done", 1),
        (2, "done", 1),
    ]
    assert passes[1]["predict_auc"] is not None and passes[1]["train_auc"] > 0.5
    assert job["passes_done"] == 2 and job["last_checkpoint"] == "20190720/2"
    events = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    started = [e for e in events if e["type"] == "trainer"]
    assert len(started) == 2 and started[1]["data"]["resumed_from"] == "20190720/1"
    # the day's end: base and batch models after the last pass (trainer policy)
    assert (model / "20190720" / "base" / "MANIFEST.json").is_file()


def fails_at_start(client, redis_server, body: dict, log: Path) -> dict:
    """Runs an agent on a job it cannot take: it reports why and exits 2; the job fails."""
    job_id = started_job(client, body)
    agent = run_agent(redis_server.url, job_id, log)
    try:
        assert agent.wait(timeout=120) == 2, log.read_text()[-3000:]
    finally:
        stop_process(agent)
    return wait_for(
        lambda: (j := client.get(f"/v1/jobs/{job_id}").json())["state"] == "failed" and j,
        what="job failed",
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_group_of_another_size_fails_the_job(client, roots, redis_server, tmp_path):
    body = small_job(
        "ranks", roots["data"] / "ranks", roots["model"] / "ranks", resources={"trainer_ranks": 2}
    )
    job = fails_at_start(client, redis_server, body, tmp_path / "agent.log")
    assert job["error"] == (
        "resources.trainer_ranks is 2 but this trainer group has 1 rank(s) (WORLD_SIZE): "
        "start it with 2 ranks, or change resources.trainer_ranks"
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_shards_of_another_tier_fail_the_job(client, roots, redis_server, tmp_path):
    from streamrec.control.trainer_config import TrainerConfig
    from streamrec.embedding_store import LocalShards
    from streamrec.trainer.store_tables import build_table_options

    tables = build_table_options(TrainerConfig.parse(SMALL_MODEL))
    (tmp_path / "tables.json").write_text(
        json.dumps({"tables": [t.model_dump(mode="json") for t in tables]})
    )
    # host tier, at an endpoint the test API allows
    with LocalShards(tmp_path / "tables.json", 1, endpoint=TEST_STORE_ENDPOINT) as shards:
        body = small_job(
            "tier",
            roots["data"] / "tier",
            roots["model"] / "tier",
            store={"endpoints": shards.endpoints, "tier": "ssd"},
        )
        job = fails_at_start(client, redis_server, body, tmp_path / "agent.log")
    assert job["error"] == (
        f"store.tier is 'ssd' but shard 0 ({shards.endpoints[0]}) serves tier 'host' "
        f"(shards own their tier: start them with --tier ssd, or change store.tier)"
    )


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_negatives_and_threads_reach_the_trainer_group(client, roots, redis_server, tmp_path):
    """sampler.neg_num negatives per click from sampler.endpoint; threads_per_rank threads."""
    from item_tables import day_items, write_item_table
    from streamrec.sampler import LocalRpcDataSampler
    from streamrec.sampler.client import stop_server

    data, model = roots["data"] / "negatives", roots["model"] / "negatives"
    datagen(data, max_splits=1)
    files = sorted((data / "20190720" / "0000").glob("part-*"))
    items, clicks = day_items(files)
    write_item_table(data / "items.parquet", items)  # under the API's data root, as a job's
    endpoint = TEST_SAMPLER_ENDPOINT  # one the API allows (--sampler-endpoint)
    sampler = LocalRpcDataSampler("category", "slot_0", "weight", "skey", endpoint=endpoint)
    body = small_job(
        "negatives",
        data,
        model,
        sampler={"endpoint": endpoint, "neg_num": 2},
        resources={"threads_per_rank": 2},
    )
    body["model"] = {
        **SMALL_MODEL,
        "negative_sampling": {"table_path": str(data / "items.parquet"), "item_slot": 0},
    }
    job_id = started_job(client, body)
    agent = run_agent(redis_server.url, job_id, tmp_path / "agent.log")
    try:
        p1 = pass_done(client, job_id, 1, agent, tmp_path / "agent.log")
        assert 0 < clicks < 1500 and p1["samples"] == 3 * clicks  # each click + 2 negatives
        assert client.post(f"/v1/jobs/{job_id}/stop").json()["state"] == "stopping"
        assert agent.wait(timeout=60) == 0
    finally:
        stop_process(agent)
        pid = sampler.server_pid
        sampler.close()
        if pid:
            stop_server(pid)
    events = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    started = [e["data"] for e in events if e["type"] == "trainer"]
    assert [(s["ranks"], s["threads"]) for s in started] == [(1, 2)]


def garble(split_dir: Path) -> None:
    """Replaces the split's data file with binary garbage (every line malformed)."""
    (part,) = sorted(split_dir.glob("part-*"))
    part.write_bytes(random.Random(3).randbytes(1 << 15))


def events_of(client, job_id: str, kind: str) -> list[dict]:
    events = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    return [e for e in events if e["type"] == kind]


def pass_lines(model: Path) -> list[tuple[int, list[str]]]:
    lines = (model / "passes.jsonl").read_text().splitlines()
    return [(r["pass_id"], r["skipped_splits"]) for r in map(json.loads, lines)]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_bad_split_fails_the_job_at_once(client, roots, redis_server, tmp_path):
    """on_bad_split: fail (the default): a DataError is not retried (it cannot pass)."""
    data, model = roots["data"] / "badfail", roots["model"] / "badfail"
    datagen(data)
    garble(data / "20190720" / "1200")
    job_id = started_job(client, small_job("badfail", data, model))
    agent = run_agent(redis_server.url, job_id, tmp_path / "agent.log")
    try:
        job = finished(client, job_id, agent, tmp_path / "agent.log")
        assert job["state"] == "failed", job
        assert "bad data (on_bad_split: fail)" in job["error"] and "DataError" in job["error"]
        assert agent.wait(timeout=60) == 0
    finally:
        stop_process(agent)
    p2 = client.get(f"/v1/jobs/{job_id}/passes/20190720/2").json()
    assert (p2["state"], p2["attempts"], p2["failures"]) == ("failed", 1, 1)
    assert events_of(client, job_id, "requeue") == []
    assert pass_lines(model) == [(1, [])]  # pass 2 never recorded


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_bad_split_is_skipped_and_listed(client, roots, redis_server, tmp_path):
    """on_bad_split: skip: the pass is trained again from the last checkpoint without the bad
    split, which the pass record (REST and passes.jsonl) and an event list."""
    data, model = roots["data"] / "badskip", roots["model"] / "badskip"
    datagen(data)
    garble(data / "20190720" / "1200")
    body = small_job("badskip", data, model)
    body["data"] |= {"split_per_pass": 2, "on_bad_split": "skip"}  # one pass: 0000 + 1200
    job_id = started_job(client, body)
    agent = run_agent(redis_server.url, job_id, tmp_path / "agent.log")
    try:
        job = finished(client, job_id, agent, tmp_path / "agent.log")
        assert job["state"] == "succeeded", job
    finally:
        stop_process(agent)
    p1 = client.get(f"/v1/jobs/{job_id}/passes/20190720/1").json()
    assert p1["skipped_splits"] == ["1200"] and p1["samples"] == 1500  # the good split's
    assert (p1["state"], p1["attempts"], p1["failures"]) == ("done", 2, 0)
    (skip,) = events_of(client, job_id, "skip")
    assert skip["data"]["skipped_splits"] == ["1200"]
    assert pass_lines(model) == [(1, ["1200"])]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_full_disk_is_retried_from_the_checkpoint_and_recorded_once(
    client, roots, redis_server, tmp_path
):
    """ENOSPC while saving pass 2 (its base model, after shrink): the disk's state, not the
    pass's, so an infrastructure restart (backoff, budget) and no failed attempt; pass 2 is
    handed out again from checkpoint 1, which the group loads, and recorded once."""
    data, model = roots["data"] / "enospc", roots["model"] / "enospc"
    datagen(data)
    job_id = started_job(client, small_job("enospc", data, model))
    # model writes: pass 1's checkpoint (#1), then pass 2's base (#2): it fails
    log = tmp_path / "agent.log"
    agent = run_agent(redis_server.url, job_id, log, env={"STREAMREC_FAULT": "checkpoint_enospc#2"})
    try:
        job = finished(client, job_id, agent, log)
        assert job["state"] == "succeeded", job
    finally:
        stop_process(agent)
    p2 = client.get(f"/v1/jobs/{job_id}/passes/20190720/2").json()
    assert (p2["state"], p2["attempts"], p2["failures"]) == ("done", 2, 0)
    assert p2["resume_from"] == "20190720/1"
    (restart,) = events_of(client, job_id, "restart")
    assert "[Errno 28]" in restart["message"] and restart["data"]["restarts"] == 1
    (requeue,) = events_of(client, job_id, "requeue")
    assert "[Errno 28]" in requeue["message"] and requeue["data"]["resume_from"] == "20190720/1"
    assert pass_lines(model) == [(1, []), (2, [])]
    assert job["passes_done"] == 2 and job["last_checkpoint"] == "20190720/2"
    assert f"warm start from {model / '20190720' / '1'} " in log.read_text()


def run_group(redis_url: str, job_id: str, log: Path, **env: str) -> subprocess.Popen:
    """Two agent ranks under torchrun (gloo on 127.0.0.1)."""
    from servers import torchrun_command

    return spawn(
        [
            *torchrun_command(2, "-m", "streamrec.trainer.agent"),
            *agent_args(redis_url, job_id),
        ],
        log=log,
        die_with_parent=True,
        env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", **env},
    )


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", ["garbage_on_rank1", "enospc_on_rank0"])
def test_a_failure_in_one_rank_moves_the_two_rank_job_on_fast(
    client, roots, redis_server, tmp_path, fault
):
    """The hang of docs/design-notes.md ("A failure in one rank"), with two agent ranks:
    rank 1's split of binary garbage (DataError), or rank 0's full disk while saving pass 2
    (ENOSPC). Both ranks learn it at once: the job fails (bad data, on_bad_split: fail) or
    pass 2 is retried from checkpoint 1 and the job succeeds, each pass recorded once, well
    within the time rank 0 used to wait in a gloo collective (600 s)."""
    from streamrec.control.trainer_config import TrainerConfig
    from streamrec.datagen.planted import StreamParams, generate
    from streamrec.embedding_store import LocalShards
    from streamrec.trainer.store_tables import build_table_options

    data, model = roots["data"] / fault, roots["model"] / fault
    # two files a split: rank r reads part-0000r
    generate(data, "20190720", 1, 720, 1500, files_per_split=2, params=StreamParams(4, 300, seed=5))
    env = {}
    if fault == "garbage_on_rank1":
        (data / "20190720" / "0000" / "part-00001").write_bytes(random.Random(3).randbytes(1 << 15))
    else:
        env["STREAMREC_FAULT"] = "checkpoint_enospc#2"  # pass 1's checkpoint, then pass 2's base
    tables = build_table_options(TrainerConfig.parse(SMALL_MODEL))
    (tmp_path / "tables.json").write_text(
        json.dumps({"tables": [t.model_dump(mode="json") for t in tables]})
    )
    with LocalShards(tmp_path / "tables.json", 1, endpoint=TEST_STORE_ENDPOINT) as shards:
        store = {"endpoints": shards.endpoints}
        body = small_job(fault, data, model, store=store, resources={"trainer_ranks": 2})
        job_id = started_job(client, body)
        log = tmp_path / "group.log"
        started = time.monotonic()
        group = run_group(redis_server.url, job_id, log, **env)
        try:
            job = finished(client, job_id, group, log, timeout=150)
            took = time.monotonic() - started
            assert group.wait(timeout=60) == 0, log.read_text()[-3000:]  # both ranks left
        finally:
            stop_process(group)
    assert took < 90, took
    if fault == "garbage_on_rank1":
        assert job["state"] == "failed", job
        assert "rank 1: DataError" in job["error"] and "part-00001" in job["error"]
        p1 = client.get(f"/v1/jobs/{job_id}/passes/20190720/1").json()
        assert (p1["state"], p1["attempts"]) == ("failed", 1)
        assert not (model / "passes.jsonl").exists()
    else:
        assert job["state"] == "succeeded", job
        p2 = client.get(f"/v1/jobs/{job_id}/passes/20190720/2").json()
        assert (p2["state"], p2["attempts"], p2["failures"], p2["ranks"]) == ("done", 2, 0, 2)
        (requeue,) = events_of(client, job_id, "requeue")
        assert "rank 0: OSError: [Errno 28]" in requeue["message"]
        assert pass_lines(model) == [(1, []), (2, [])]
        assert job["last_checkpoint"] == "20190720/2"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_group_that_left_without_a_checkpoint_sends_the_job_back_to_its_start(
    client, roots, redis_server, tmp_path
):
    """Pass 1 trained (no checkpoint: checkpoint_per_pass 100), then its group told to end
    (SIGTERM: it leaves cleanly) while pass 2's split has not landed. A new group has a model
    without pass 1 and no checkpoint holding it: pass 2 fails ``store_lost``, the API takes
    the job back to its start, and the new group trains pass 1 again, then pass 2; it does
    not train pass 2 on a fresh model (a job "succeeded" without pass 1 in its model)."""
    data, model = roots["data"] / "leftfresh", roots["model"] / "leftfresh"
    datagen(data, max_splits=1)
    body = small_job("leftfresh", data, model)
    body["checkpoint"]["checkpoint_per_pass"] = 100
    job_id = started_job(client, body)
    log_a, log_b = tmp_path / "agent-a.log", tmp_path / "agent-b.log"
    first = run_agent(redis_server.url, job_id, log_a)
    try:
        pass_done(client, job_id, 1, first, log_a)
    finally:
        stop_process(first)  # SIGTERM: the group ends, releasing nothing (no pass in hand)
    datagen(data)  # pass 2's split lands
    second = run_agent(redis_server.url, job_id, log_b)
    try:
        job = finished(client, job_id, second, log_b)
    finally:
        stop_process(second)
    assert job["state"] == "succeeded", job
    p1 = client.get(f"/v1/jobs/{job_id}/passes/20190720/1").json()
    assert (p1["state"], p1["attempts"]) == ("done", 2), p1  # trained again by the new group
    assert pass_lines(model) == [(1, []), (2, [])]
    records = [json.loads(line) for line in (model / "passes.jsonl").read_text().splitlines()]
    assert not [r for r in records if r.get("rolled_back")]
    # Who sees the loss first is a race, and either rewinds the job to its start: the API, on
    # the new group's ``started`` report (a fresh model while pass 1 counts done), or the
    # group, when it takes pass 2 before the API has read that report.
    restarts = [e["message"] for e in events_of(client, job_id, "restart")]
    by_api = any("a trainer group started from a fresh model" in m for m in restarts)
    by_group = "no checkpoint holds 20190720/1: the job goes back to its start" in log_b.read_text()
    assert by_api or by_group, (restarts, log_b.read_text()[-3000:])
