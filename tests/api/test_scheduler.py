"""Scheduling against a real API process and Redis: donefiles, reports, dead trainers, restart.

The trainer side is played by :class:`streamrec.control.channel.TrainerChannel` (what the agent
uses), in this process or in a child process that is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from api_helpers import job_body, land_split, make_api
from servers import wait_for
from streamrec.control import keys
from streamrec.control.channel import TrainerChannel
from streamrec.process import spawn

SPLITS = ["0000", "0600", "1200", "1800"]


def start_job(client, roots, name="s", resources: dict | None = None, **data) -> str:
    body = job_body(roots, name, **data)
    if resources:
        body["resources"] = resources
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 201, resp.text
    job_id = resp.json()["id"]
    assert client.post(f"/v1/jobs/{job_id}/start").json()["state"] == "running"
    return job_id


def finish(ch: TrainerChannel, item, auc: float = 0.7) -> None:
    """What rank 0 does after a pass: report the record, then acknowledge the work item."""
    record = {
        "predict_auc": auc - 0.05,
        "train_auc": auc,
        "logloss": 0.5,
        "predict_logloss": 0.625,
        "samples": 30,
        "malformed_lines": 1,
        "seconds": 0.2,
        "best_auc": 0.8,
    }
    ch.report(
        "pass_done",
        day=item.spec.day,
        pass_id=item.spec.pass_id,
        ranks=2,
        attempt=item.attempt,
        record=record,
    )
    ch.ack_pass(item)


def ticks(client) -> float:
    """Scheduler ticks the API has finished (its tick-duration histogram's count)."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("streamrec_api_scheduler_tick_seconds_count "):
            return float(line.split()[1])
    raise AssertionError("no streamrec_api_scheduler_tick_seconds_count in /metrics")


def nothing_handed_out(client, ch: TrainerChannel, n: int = 3) -> None:
    """After ``n`` more scheduler ticks (each one probes the data: data_sleep_second is
    shorter than a tick), the work stream still holds nothing for ``ch``."""
    seen = ticks(client)
    wait_for(lambda: ticks(client) >= seen + n, what=f"{n} more scheduler ticks")
    assert ch.take_pass(block_ms=1) is None


def test_passes_follow_donefiles_in_order(client, roots, redis_server):
    job_id = start_job(client, roots, "order")
    data_root = roots["data"] / "order"
    ch = TrainerChannel(redis_server.url, job_id, "g1", heartbeat_ttl_s=30)
    ch.heartbeat(ranks=2)
    # nothing is ready: nothing is handed out
    nothing_handed_out(client, ch)
    # a split without its donefile is not ready
    (data_root / "20190720" / "0000").mkdir(parents=True)
    (data_root / "20190720" / "0000" / "part-0").write_text("1\t2\n")
    nothing_handed_out(client, ch)
    # the second split landing first does not jump the queue
    land_split(data_root, "20190720", "0600")
    nothing_handed_out(client, ch)
    land_split(data_root, "20190720", "0000")
    got = []
    for i, split in enumerate(SPLITS):
        item = ch.take_pass(block_ms=5000)
        assert item is not None, f"pass {i + 1} not handed out"
        assert (item.spec.day, item.spec.pass_id, item.spec.splits) == ("20190720", i + 1, (split,))
        assert item.attempt == 1
        ch.report("claimed", day=item.spec.day, pass_id=item.spec.pass_id, ranks=2)
        # one pass in flight at a time: the next is not handed out before this one is done
        if i + 2 <= len(SPLITS):
            land_split(data_root, "20190720", SPLITS[min(i + 2, 3)])
        nothing_handed_out(client, ch)
        wait_for(
            lambda pid=i + 1: (
                client.get(f"/v1/jobs/{job_id}/passes/20190720/{pid}").json()["state"] == "running"
            ),
            what="running",
        )
        finish(ch, item, auc=0.6 + 0.05 * i)
        got.append(item.spec.pass_id)
    assert got == [1, 2, 3, 4]
    job = wait_for(
        lambda: (j := client.get(f"/v1/jobs/{job_id}").json())["state"] == "succeeded" and j,
        what="succeeded",
    )
    assert job["passes_done"] == 4 and job["in_flight"] is None
    passes = client.get(f"/v1/jobs/{job_id}/passes").json()
    assert passes["count"] == 4
    p2 = passes["data"][1]
    assert (p2["day"], p2["pass_id"], p2["splits"], p2["state"]) == (
        "20190720",
        2,
        ["0600"],
        "done",
    )
    assert p2["train_auc"] == pytest.approx(0.65) and p2["predict_auc"] == pytest.approx(0.6)
    assert p2["samples"] == 30 and p2["malformed_lines"] == 1 and p2["ranks"] == 2
    assert p2["finished_at"] >= p2["started_at"] >= p2["queued_at"]
    assert client.get(f"/v1/jobs/{job_id}/passes/20190720/3").json()["train_auc"] == pytest.approx(
        0.7
    )
    metrics = client.get("/metrics").text
    assert f'streamrec_api_passes_done_total{{job_id="{job_id}"}} 4.0' in metrics
    assert f'streamrec_api_pass_auc{{job_id="{job_id}",kind="train"}} 0.75' in metrics
    assert f'streamrec_api_pass_logloss{{job_id="{job_id}",kind="predict"}} 0.625' in metrics
    assert f'streamrec_api_pass_logloss{{job_id="{job_id}",kind="train"}} 0.5' in metrics
    ch.close()


def test_pause_holds_back_passes(client, roots, redis_server):
    job_id = start_job(client, roots, "pause")
    for s in SPLITS:
        land_split(roots["data"] / "pause", "20190720", s)
    ch = TrainerChannel(redis_server.url, job_id, "g1", heartbeat_ttl_s=30)
    ch.heartbeat()
    item = ch.take_pass(block_ms=5000)
    assert item is not None and item.spec.pass_id == 1
    assert client.post(f"/v1/jobs/{job_id}/pause").json()["state"] == "paused"
    finish(ch, item)
    wait_for(lambda: client.get(f"/v1/jobs/{job_id}").json()["passes_done"] == 1)
    nothing_handed_out(client, ch)  # paused: pass 2 is ready but held back
    assert client.get(f"/v1/jobs/{job_id}").json()["in_flight"] is None
    assert client.post(f"/v1/jobs/{job_id}/resume").json()["state"] == "running"
    item = ch.take_pass(block_ms=5000)
    assert item is not None and item.spec.pass_id == 2
    ch.close()


DEAD_TRAINER = textwrap.dedent("""
    import sys, time
    from streamrec.control.channel import TrainerChannel
    ch = TrainerChannel(sys.argv[1], sys.argv[2], "doomed", heartbeat_ttl_s=0.5)
    ch.heartbeat(ranks=2)
    item = ch.take_pass(block_ms=10000)
    ch.report("claimed", day=item.spec.day, pass_id=item.spec.pass_id, ranks=2)
    print(item.spec.pass_id, item.attempt, item.resume_from, flush=True)
    while True:                     # training... until SIGKILL
        ch.heartbeat(ranks=2)
        time.sleep(0.1)
""")


def run_doomed(redis_url: str, job_id: str, log: Path) -> subprocess.Popen:
    """A trainer group that takes a pass, says which on stdout, and heartbeats until killed
    (it also dies with the test)."""
    return spawn(
        [sys.executable, "-c", DEAD_TRAINER, redis_url, job_id],
        log=log,
        die_with_parent=True,
        stdout_pipe=True,
    )


def test_dead_group_pass_handed_out_again_once(client, roots, redis_server, r, tmp_path):
    """A group that dies is an infrastructure restart (not the pass's failure), counted
    against the job's restart budget (1 here): the second death in a row fails the job."""
    job_id = start_job(client, roots, "dead", {"restart_budget": 1, "restart_backoff_s": 0})
    for s in SPLITS:
        land_split(roots["data"] / "dead", "20190720", s)
    ch = TrainerChannel(redis_server.url, job_id, "g1", heartbeat_ttl_s=30)
    ch.heartbeat()
    item = ch.take_pass(block_ms=5000)
    assert item.spec.pass_id == 1
    finish(ch, item)
    ch.report("checkpoint", day="20190720", pass_id=1, path="/m/20190720/1")
    ch.clear_heartbeat()
    # a trainer group takes pass 2 and is killed mid-pass
    doomed = run_doomed(redis_server.url, job_id, tmp_path / "doomed1.log")
    assert doomed.stdout.readline().split() == ["2", "1", "None"]
    wait_for(
        lambda: client.get(f"/v1/jobs/{job_id}/passes/20190720/2").json()["state"] == "running",
        what="pass 2 running",
    )
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=10)
    # the heartbeat expires; pass 2 is handed out again from the checkpoint after pass 1,
    # and taken by a new group (which is killed too)
    doomed = run_doomed(redis_server.url, job_id, tmp_path / "doomed2.log")
    assert doomed.stdout.readline().split() == ["2", "2", "20190720/1"]
    events = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    requeues = [e for e in events if e["type"] == "requeue"]
    assert len(requeues) == 1 and "heartbeat expired" in requeues[0]["message"]
    assert requeues[0]["data"]["resume_from"] == "20190720/1"
    assert r.xpending(keys.work(job_id), keys.TRAINER_GROUP)["pending"] == 1  # the new one
    p2 = client.get(f"/v1/jobs/{job_id}/passes/20190720/2").json()
    assert p2["attempts"] == 2 and p2["resume_from"] == "20190720/1"
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=10)
    # the second group died as well: the restart budget is spent, the job fails
    job = wait_for(
        lambda: (j := client.get(f"/v1/jobs/{job_id}").json())["state"] == "failed" and j,
        what="failed",
    )
    assert "20190720/2" in job["error"] and "heartbeat expired" in job["error"]
    assert "restart budget spent" in job["error"] and job["restarts_total"] == 2
    assert client.get(f"/v1/jobs/{job_id}/passes/20190720/2").json()["state"] == "failed"
    assert client.get(f"/v1/jobs/{job_id}").json()["passes_done"] == 1
    # the operator starts it again: pass 2 is retried (a fresh count) from the checkpoint
    assert client.post(f"/v1/jobs/{job_id}/start").json()["state"] == "running"
    ch3 = TrainerChannel(redis_server.url, job_id, "g3", heartbeat_ttl_s=30)
    ch3.heartbeat()
    item = ch3.take_pass(block_ms=10000)
    assert (item.spec.pass_id, item.attempt) == (2, 1)
    finish(ch3, item)
    wait_for(lambda: client.get(f"/v1/jobs/{job_id}/passes/20190720/2").json()["state"] == "done")
    assert client.get(f"/v1/jobs/{job_id}").json()["error"] is None
    ch.close()
    ch3.close()


def test_rewind_to_last_checkpoint(client, roots, redis_server):
    """With a checkpoint every 2 passes, a group dying on pass 4 replays 3 and 4."""
    job_id = start_job(client, roots, "rewind")
    for s in SPLITS:
        land_split(roots["data"] / "rewind", "20190720", s)
    ch = TrainerChannel(redis_server.url, job_id, "g1", heartbeat_ttl_s=0.5)
    for pid in (1, 2, 3):
        ch.heartbeat()
        item = ch.take_pass(block_ms=5000)
        assert item.spec.pass_id == pid
        finish(ch, item)
        if pid == 2:
            ch.report("checkpoint", day="20190720", pass_id=2, path="/m/20190720/2")
    ch.heartbeat()
    item = ch.take_pass(block_ms=5000)
    assert item.spec.pass_id == 4
    wait_for(lambda: client.get(f"/v1/jobs/{job_id}").json()["passes_done"] == 3)
    # the group dies (its heartbeat is not renewed)
    ch2 = TrainerChannel(redis_server.url, job_id, "g2", heartbeat_ttl_s=30)
    ch2.heartbeat()
    again = [ch2.take_pass(block_ms=10000) for _ in range(1)]
    assert again[0].spec.pass_id == 3 and again[0].resume_from == "20190720/2"
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["passes_done"] == 2  # pass 3 is being trained again
    finish(ch, item)  # the old group's late report for pass 4 (attempt 1): ignored
    wait_for(
        lambda: any(
            e["type"] == "stale_report"
            for e in client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
        )
    )
    assert client.get(f"/v1/jobs/{job_id}/passes/20190720/4").json()["state"] == "queued"
    finish(ch2, again[0])
    item = ch2.take_pass(block_ms=5000)
    assert item.spec.pass_id == 4 and item.attempt == 2
    finish(ch2, item)
    wait_for(lambda: client.get(f"/v1/jobs/{job_id}").json()["state"] == "succeeded")
    assert client.get(f"/v1/jobs/{job_id}").json()["passes_done"] == 4
    ch.close()
    ch2.close()


def test_triggers_reach_trainers_and_report(client, roots, redis_server):
    job = client.post("/v1/jobs", json=job_body(roots, "trig")).json()
    job_id = job["id"]
    # no trainer group can be at work before start: 409 with the state
    resp = client.post(f"/v1/jobs/{job_id}/triggers", json={"kind": "checkpoint"})
    assert resp.status_code == 409 and resp.json()["state"] == "created"
    client.post(f"/v1/jobs/{job_id}/start")
    ch = TrainerChannel(redis_server.url, job_id, "g1", heartbeat_ttl_s=30)
    ch.heartbeat()
    made = []
    for body in (
        {"kind": "checkpoint"},
        {"kind": "export", "mode": "base"},
        {"kind": "export", "mode": "delta"},
        {"kind": "export", "mode": "batch"},
        {"kind": "shrink"},
    ):
        resp = client.post(f"/v1/jobs/{job_id}/triggers", json=body)
        assert resp.status_code == 202, resp.text
        assert resp.json()["state"] == "pending"
        made.append(resp.json())
    for bad in (
        {"kind": "export"},
        {"kind": "shrink", "mode": "base"},
        {"kind": "nuke"},
        {"kind": "export", "mode": "full"},
    ):
        assert client.post(f"/v1/jobs/{job_id}/triggers", json=bad).status_code == 422
    commands = ch.take_commands(block_ms=1000)
    assert [(c.type, c.mode, c.trigger_id) for c in commands] == [
        (t["kind"], t["mode"], t["id"]) for t in made
    ]
    assert ch.take_commands(block_ms=100) == []  # acknowledged on read
    ch.report("trigger_done", trigger_id=made[0]["id"], result={"path": "/m/20190720/1"})
    ch.report("trigger_failed", trigger_id=made[4]["id"], error="disk full")
    ch.report("trigger_done", trigger_id="nope", result={})  # bad report: an event, no crash
    done = wait_for(
        lambda: (
            (t := client.get(f"/v1/jobs/{job_id}/triggers/{made[0]['id']}").json())["state"]
            == "done"
            and t
        ),
        what="trigger done",
    )
    assert done["result"] == {"path": "/m/20190720/1"} and done["finished_at"] is not None
    failed = wait_for(
        lambda: (
            (t := client.get(f"/v1/jobs/{job_id}/triggers/{made[4]['id']}").json())["state"]
            == "failed"
            and t
        )
    )
    assert failed["error"] == "disk full"
    listing = client.get(f"/v1/jobs/{job_id}/triggers").json()
    assert listing["count"] == 5 and [t["id"] for t in listing["data"]] == [t["id"] for t in made]
    # the bad report came after the failed one: it may still be on its way
    wait_for(
        lambda: any(
            e["type"] == "bad_report" and "nope" in e["message"]
            for e in client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
        ),
        what="the bad report's event",
    )
    # stop reaches the trainers as a command; their "stopped" report ends the stop
    client.post(f"/v1/jobs/{job_id}/stop")
    assert [c.type for c in ch.take_commands(block_ms=1000)] == ["stop"]
    assert client.get(f"/v1/jobs/{job_id}").json()["state"] == "stopping"
    ch.report("stopped")
    wait_for(lambda: client.get(f"/v1/jobs/{job_id}").json()["state"] == "stopped")
    # a stop meant for an earlier run does not stop the next one
    client.post(f"/v1/jobs/{job_id}/start")
    assert ch.take_commands(block_ms=200) == []
    ch.close()


def test_api_restart_mid_job_loses_nothing(redis_server, roots, tmp_path):
    """SIGKILL the API mid-job: reports sent meanwhile are applied by the next API."""
    redis_server.client().flushall()
    api = make_api(redis_server.url, roots)
    api.start()
    try:
        with api.http() as c:
            job_id = start_job(c, roots, "restart")
        for s in SPLITS[:2]:
            land_split(roots["data"] / "restart", "20190720", s)
        ch = TrainerChannel(redis_server.url, job_id, "g1", heartbeat_ttl_s=30)
        ch.heartbeat()
        item = ch.take_pass(block_ms=5000)
        assert item.spec.pass_id == 1
        api.stop(signal.SIGKILL)
        # while no API runs: the trainers finish pass 1, checkpoint, and data keeps landing
        finish(ch, item, auc=0.71)
        ch.report("checkpoint", day="20190720", pass_id=1, path="/m/1")
        for s in SPLITS[2:]:
            land_split(roots["data"] / "restart", "20190720", s)
        api.start()
        with api.http() as c:
            got = []
            for _ in range(3):
                item = ch.take_pass(block_ms=10000)
                assert item is not None
                got.append(item.spec.pass_id)
                finish(ch, item)
            assert got == [2, 3, 4]
            job = wait_for(
                lambda: (j := c.get(f"/v1/jobs/{job_id}").json())["state"] == "succeeded" and j,
                what="succeeded",
            )
            assert job["passes_done"] == 4 and job["last_checkpoint"] == "20190720/1"
            p1 = c.get(f"/v1/jobs/{job_id}/passes/20190720/1").json()
            assert p1["state"] == "done" and p1["train_auc"] == pytest.approx(0.71)
        ch.close()
    finally:
        api.stop()


def test_redis_down_gives_503_not_a_hang(tmp_path, roots):
    from servers import RedisServer, free_port

    server = RedisServer(free_port(), tmp_path)
    server.start()
    env = {"STREAMREC_API_REDIS_TIMEOUT_S": "0.5", "STREAMREC_API_REDIS_OUTAGE_S": "1"}
    api = make_api(server.url, roots, env=env)
    api.start()
    try:
        with api.http() as c:
            assert c.get("/readyz").status_code == 200
            server.stop()
            resp = c.get("/readyz")
            assert resp.status_code == 503 and resp.json()["redis"] is False
            resp = c.get("/v1/jobs")
            assert resp.status_code == 503 and "unavailable" in resp.json()["detail"]
            assert resp.headers["retry-after"] == "2"  # a client knows to ask again
            resp = c.post("/v1/jobs", json=job_body(roots, "x"))
            assert resp.status_code == 503 and resp.headers["retry-after"] == "2"
            assert c.get("/healthz").status_code == 200
            server.start()
            wait_for(lambda: c.get("/readyz").status_code == 200, timeout=10)
            assert c.get("/v1/jobs").json()["count"] == 0
    finally:
        api.stop()
        server.stop()


def test_redis_restart_with_appendonly_loses_nothing(tmp_path, roots):
    """Redis (append-only file) restarted mid-job: jobs, passes, groups and pending work
    survive, and the job carries on."""
    from servers import RedisServer, free_port

    server = RedisServer(free_port(), tmp_path)
    server.start(appendonly=True)
    api = make_api(server.url, roots, env={"STREAMREC_API_REDIS_TIMEOUT_S": "0.5"})
    api.start()
    try:
        with api.http() as c:
            job_id = start_job(c, roots, "aof")
            for s in SPLITS:
                land_split(roots["data"] / "aof", "20190720", s)
            ch = TrainerChannel(server.url, job_id, "g1", heartbeat_ttl_s=60)
            ch.heartbeat()
            first = ch.take_pass(block_ms=5000)
            finish(ch, first)
            item = ch.take_pass(block_ms=5000)
            assert item.spec.pass_id == 2
            wait_for(lambda: c.get(f"/v1/jobs/{job_id}").json()["passes_done"] == 1)
            ch.close()
            server.stop()  # SIGTERM: the AOF is flushed
            assert c.get("/readyz").status_code == 503
            server.start(appendonly=True)
            wait_for(lambda: c.get("/readyz").status_code == 200, timeout=15)
            job = c.get(f"/v1/jobs/{job_id}").json()
            assert (job["state"], job["passes_done"], job["in_flight"]) == (
                "running",
                1,
                "20190720/2",
            )
            ch = TrainerChannel(server.url, job_id, "g1", heartbeat_ttl_s=60)
            ch.heartbeat()
            finish(ch, item)  # the pass taken before the restart is still pending: ack works
            for pid in (3, 4):
                nxt = ch.take_pass(block_ms=10000)
                assert nxt is not None and nxt.spec.pass_id == pid
                finish(ch, nxt)
            wait_for(lambda: c.get(f"/v1/jobs/{job_id}").json()["state"] == "succeeded", timeout=15)
            ch.close()
    finally:
        api.stop()
        server.stop()


def test_commands_survive_a_group_death(client, roots, redis_server):
    """A command read by a group that dies before carrying it out is not lost: the next
    group takes it over (its trigger does not stay pending forever); once acknowledged it is
    gone."""
    job_id = start_job(client, roots, "cmds")
    made = client.post(f"/v1/jobs/{job_id}/triggers", json={"kind": "checkpoint"}).json()
    first = TrainerChannel(redis_server.url, job_id, "g1", heartbeat_ttl_s=30)
    (cmd,) = first.take_commands()
    assert (cmd.type, cmd.trigger_id) == ("checkpoint", made["id"])
    first.close()  # dies with the command read, not carried out
    second = TrainerChannel(redis_server.url, job_id, "g2", heartbeat_ttl_s=30)
    (again,) = second.take_commands()
    assert (again.type, again.trigger_id) == ("checkpoint", made["id"])
    assert second.take_commands() == []  # not handed twice to the same group
    second.report("trigger_done", trigger_id=again.trigger_id, result={"path": "/m/x"})
    second.ack_command(again)
    second.close()
    wait_for(
        lambda: client.get(f"/v1/jobs/{job_id}/triggers/{made['id']}").json()["state"] == "done",
        what="trigger done",
    )
    third = TrainerChannel(redis_server.url, job_id, "g3", heartbeat_ttl_s=30)
    assert third.take_commands() == []
    third.close()


def test_a_rewound_pass_is_no_failed_attempt(client, roots, redis_server):
    """With a checkpoint every 2 passes, a group dying on pass 4 re-hands pass 3 (done
    before, now rolled back): deaths are infrastructure restarts, no pass's failure."""
    job_id = start_job(client, roots, "rewound")
    for s in SPLITS:
        land_split(roots["data"] / "rewound", "20190720", s)
    ch = TrainerChannel(redis_server.url, job_id, "g1", heartbeat_ttl_s=0.5)
    for pid in (1, 2, 3):
        ch.heartbeat()
        item = ch.take_pass(block_ms=5000)
        assert item.spec.pass_id == pid
        assert item.after == (f"20190720/{pid - 1}" if pid > 1 else None)
        finish(ch, item)
        if pid == 2:
            ch.report("checkpoint", day="20190720", pass_id=2, path="/m/20190720/2")
    ch.heartbeat()
    assert ch.take_pass(block_ms=5000).spec.pass_id == 4  # then g1 dies
    ch2 = TrainerChannel(redis_server.url, job_id, "g2", heartbeat_ttl_s=0.5)
    ch2.heartbeat()
    item = ch2.take_pass(block_ms=10000)
    assert (item.spec.pass_id, item.attempt, item.resume_from) == (3, 2, "20190720/2")
    assert item.after == "20190720/2"
    # g2 dies on pass 3 as well: a second restart, no failure, the job goes on
    ch3 = TrainerChannel(redis_server.url, job_id, "g3", heartbeat_ttl_s=30)
    ch3.heartbeat()
    item = ch3.take_pass(block_ms=10000)
    assert (item.spec.pass_id, item.attempt, item.resume_from) == (3, 3, "20190720/2")
    p3 = client.get(f"/v1/jobs/{job_id}/passes/20190720/3").json()
    assert (p3["attempts"], p3["failures"], p3["state"]) == (3, 0, "queued")
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert (job["state"], job["restarts"], job["restarts_total"]) == ("running", 2, 2)
    finish(ch3, item)
    item = ch3.take_pass(block_ms=5000)
    assert (item.spec.pass_id, item.attempt) == (4, 2)
    finish(ch3, item)
    wait_for(lambda: client.get(f"/v1/jobs/{job_id}").json()["state"] == "succeeded")
    p4 = client.get(f"/v1/jobs/{job_id}/passes/20190720/4").json()
    assert (p4["attempts"], p4["failures"]) == (2, 0)
    assert client.get(f"/v1/jobs/{job_id}").json()["restarts"] == 0  # a pass done resets it
    for c in (ch, ch2, ch3):
        c.close()


def test_a_stuck_group_is_seen_and_its_pass_handed_out_again(client, roots, redis_server):
    """A group that beats but makes no progress while it works (here: its heartbeat says
    its last progress was 10 minutes ago) is marked stuck and its pass requeued."""
    job_id = start_job(client, roots, "stuck")
    land_split(roots["data"] / "stuck", "20190720", "0000")
    ch = TrainerChannel(redis_server.url, job_id, "g1", heartbeat_ttl_s=30)
    ch.heartbeat(busy=False, progress_ts=time.time())
    assert ch.take_pass(block_ms=5000) is not None
    assert client.get(f"/v1/jobs/{job_id}/workers").json()["stuck"] is False
    ch.heartbeat(busy=True, step=7, progress_ts=time.time() - 600)
    requeue = wait_for(
        lambda: [
            e
            for e in client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
            if e["type"] == "requeue"
        ],
        what="requeue",
    )
    assert "stuck: no progress for 6" in requeue[0]["message"]
    workers = client.get(f"/v1/jobs/{job_id}/workers").json()
    assert workers["alive"] is True and workers["stuck"] is True
    assert client.get(f"/v1/jobs/{job_id}/passes/20190720/1").json()["failures"] == 0
    assert client.get(f"/v1/jobs/{job_id}").json()["restarts"] == 1  # infrastructure
    ch.close()


def group_restarts(client, job_id: str) -> float:
    """``streamrec_api_group_restarts_total`` of the job (0 before its first restart)."""
    prefix = f'streamrec_api_group_restarts_total{{job_id="{job_id}"}} '
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line.split()[1])
    return 0.0


def events_of(client, job_id: str, kind: str) -> list[dict]:
    events = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    return [e for e in events if e["type"] == kind]


def test_a_restart_seen_only_through_started_counts_in_the_metric_and_the_budget(
    client, roots, redis_server
):
    """A group killed after pass 2's ``pass_done`` (no checkpoint holds pass 2) with no pass
    in flight: its successor's ``started`` report (``resumed_from`` pass 1) is the only sign
    of the restart. Rolling pass 2 back, it is an infrastructure restart: counted in the
    crash-loop alert's metric and against the restart budget (1 here: one more death in a
    row fails the job)."""
    job_id = start_job(client, roots, "seen", {"restart_budget": 1, "restart_backoff_s": 0})
    for s in SPLITS[:2]:  # pass 3 is not ready: nothing is in flight after pass 2
        land_split(roots["data"] / "seen", "20190720", s)
    g1 = TrainerChannel(redis_server.url, job_id, "g1", heartbeat_ttl_s=30)
    g1.heartbeat()
    for pid in (1, 2):
        item = g1.take_pass(block_ms=5000)
        assert item.spec.pass_id == pid
        finish(g1, item)
        if pid == 1:
            g1.report("checkpoint", day="20190720", pass_id=1, path="/m/20190720/1")
    wait_for(lambda: client.get(f"/v1/jobs/{job_id}").json()["passes_done"] == 2)
    g1.clear_heartbeat()
    g1.close()  # killed; torchrun starts the group again, which loads checkpoint 1
    g2 = TrainerChannel(redis_server.url, job_id, "g2", heartbeat_ttl_s=30)
    g2.report("started", ranks=2, group="g1", resumed_from="20190720/1")
    wait_for(lambda: events_of(client, job_id, "rollback"), what="pass 2 rolled back")
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert (job["state"], job["restarts"], job["restarts_total"]) == ("running", 1, 1), job
    assert group_restarts(client, job_id) == 1
    assert len(events_of(client, job_id, "restart")) == 1
    # the restarted group takes pass 2 again and dies holding it: a second restart in a
    # row, past the budget
    g2.heartbeat()
    item = g2.take_pass(block_ms=5000)
    assert item.spec.pass_id == 2 and item.resume_from == "20190720/1"
    g3 = TrainerChannel(redis_server.url, job_id, "g3", heartbeat_ttl_s=30)
    g3.heartbeat()
    job = wait_for(
        lambda: (j := client.get(f"/v1/jobs/{job_id}").json())["state"] == "failed" and j,
        what="failed",
    )
    assert "restart budget spent" in job["error"] and job["restarts_total"] == 2, job
    assert group_restarts(client, job_id) == 2
    g2.close()
    g3.close()


def test_a_restart_seen_through_started_and_another_way_counts_once(client, roots, redis_server):
    """A group that dies holding pass 3 after pass 2's ``pass_done`` (checkpoint 1 only) is
    seen twice: by its successor's ``started`` (pass 2 rolled back) and by the successor's
    heartbeat (the pass's holder replaced). One restart, counted once, whichever comes
    first."""
    job_id = start_job(client, roots, "once", {"restart_backoff_s": 0})
    for s in SPLITS:
        land_split(roots["data"] / "once", "20190720", s)
    g1 = TrainerChannel(redis_server.url, job_id, "g1", heartbeat_ttl_s=30)
    g1.heartbeat()
    for pid in (1, 2):
        item = g1.take_pass(block_ms=5000)
        finish(g1, item)
        if pid == 1:
            g1.report("checkpoint", day="20190720", pass_id=1, path="/m/20190720/1")
    assert g1.take_pass(block_ms=5000).spec.pass_id == 3  # then g1 dies holding it
    wait_for(lambda: client.get(f"/v1/jobs/{job_id}").json()["passes_done"] == 2)
    # the started report first, then the heartbeat
    g2 = TrainerChannel(redis_server.url, job_id, "g2", heartbeat_ttl_s=30)
    g2.report("started", ranks=2, group="g1", resumed_from="20190720/1")
    wait_for(lambda: client.get(f"/v1/jobs/{job_id}").json()["passes_done"] == 1)
    g2.heartbeat()
    item = g2.take_pass(block_ms=5000)
    assert (item.spec.pass_id, item.resume_from) == (2, "20190720/1")
    seen = ticks(client)
    wait_for(lambda: ticks(client) >= seen + 2, what="2 more scheduler ticks")
    assert client.get(f"/v1/jobs/{job_id}").json()["restarts_total"] == 1
    assert group_restarts(client, job_id) == 1
    assert len(events_of(client, job_id, "restart")) == 1
    finish(g2, item)
    assert g2.take_pass(block_ms=5000).spec.pass_id == 3  # then g2 dies holding it
    # the heartbeat first (the pass in flight requeued), then the started report
    g3 = TrainerChannel(redis_server.url, job_id, "g3", heartbeat_ttl_s=30)
    g3.heartbeat()
    wait_for(lambda: len(events_of(client, job_id, "restart")) == 2, what="second restart")
    g3.report("started", ranks=2, group="g1", resumed_from="20190720/1")
    item = g3.take_pass(block_ms=5000)
    assert (item.spec.pass_id, item.resume_from) == (2, "20190720/1")
    seen = ticks(client)
    wait_for(lambda: ticks(client) >= seen + 2, what="2 more scheduler ticks")
    assert client.get(f"/v1/jobs/{job_id}").json()["restarts_total"] == 2
    assert group_restarts(client, job_id) == 2
    assert len(events_of(client, job_id, "restart")) == 2
    for c in (g1, g2, g3):
        c.close()


def test_a_restart_seen_only_through_started_past_the_budget_fails_the_job(
    client, roots, redis_server
):
    """With ``restart_budget`` 0, a restart seen only through ``started`` fails the job,
    saying the budget is spent."""
    job_id = start_job(client, roots, "spent", {"restart_budget": 0, "restart_backoff_s": 0})
    for s in SPLITS[:2]:
        land_split(roots["data"] / "spent", "20190720", s)
    g1 = TrainerChannel(redis_server.url, job_id, "g1", heartbeat_ttl_s=30)
    g1.heartbeat()
    for pid in (1, 2):
        finish(g1, g1.take_pass(block_ms=5000))
        if pid == 1:
            g1.report("checkpoint", day="20190720", pass_id=1, path="/m/20190720/1")
    wait_for(lambda: client.get(f"/v1/jobs/{job_id}").json()["passes_done"] == 2)
    g1.report("started", ranks=2, group="g1", resumed_from="20190720/1")
    job = wait_for(
        lambda: (j := client.get(f"/v1/jobs/{job_id}").json())["state"] == "failed" and j,
        what="failed",
    )
    assert "restart budget spent (1 restarts in a row" in job["error"], job
    assert job["restarts_total"] == 1 and group_restarts(client, job_id) == 1
    g1.close()
