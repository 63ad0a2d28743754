"""A trainer sampling negatives while its sampler is killed (SIGKILL) and started again, or
while the sampler refuses it or is not there: real sampler processes, real sockets."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from agent_helpers import SMALL_MODEL, datagen, run_agent, small_job, started_job
from api_helpers import TEST_SAMPLER_ENDPOINT
from item_tables import day_items, start_sampler_process, write_item_table
from prometheus_client import REGISTRY
from servers import wait_for
from streamrec.auth import write_token_file
from streamrec.process import stop_process
from streamrec.trainer.errors import PassFailed, error_class
from streamrec.trainer.runner import OnlineTrainer
from trainer_helpers import small_config


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = tempfile.mkdtemp(prefix="trn-", dir="/tmp")  # ipc socket paths are short
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def start_sampler(
    directory: Path, token_file: Path | None = None, sock: Path | None = None
) -> subprocess.Popen:
    """A sampler server on ``sock`` (default ``directory``/sampler.sock); returns once it
    answers."""
    sock = sock or directory / "sampler.sock"
    return start_sampler_process(f"ipc://{sock}", directory / "sampler.log", token_file)


def negatives_config(stream: Path, tmp_path: Path, endpoint: str, **runner: object):
    """The stream's first day, with 2 negatives per click from a table of the day's items
    (written to ``tmp_path``/items.parquet); also returns the clicks of each pass."""
    clicks = []
    items = []
    for split in ("0000", "1200"):
        ids, split_clicks = day_items(sorted((stream / "20190720" / split).glob("part-*")))
        clicks.append(split_clicks)
        items.append(ids)
    write_item_table(tmp_path / "items.parquet", np.unique(np.concatenate(items)))
    cfg = small_config(stream, tmp_path / "m", end_day="20190720", **runner)
    job = cfg.model_dump(mode="json")
    job["negative_sampling"] = {
        "enabled": True,
        "table_path": str(tmp_path / "items.parquet"),
        "item_slot": 0,
        "sample_size": 3,
        "endpoint": endpoint,
    }
    return type(cfg).parse(job), clicks


@pytest.mark.timeout(180)
def test_a_sampler_killed_mid_pass_is_ridden_out_every_pass_done_once(stream, tmp_path, short_dir):
    endpoint = f"ipc://{short_dir}/sampler.sock"
    cfg, clicks = negatives_config(
        stream, tmp_path, endpoint, train_batch_size=16, checkpoint_per_pass=1
    )
    first = start_sampler(short_dir)
    successor: list[subprocess.Popen] = []
    done = threading.Event()
    t = OnlineTrainer(cfg)
    killed_at: list[float] = []

    def operator() -> None:
        """Kills the sampler in the middle of the first pass's training, and starts it
        again half a second later (the launcher polls its children every 0.5 s)."""
        wait_for(lambda: t.step >= 5 or done.is_set(), 120, 0.01, what="step 5")
        if done.is_set():
            return
        os.kill(first.pid, signal.SIGKILL)
        killed_at.append(time.monotonic())
        first.wait(timeout=10)
        time.sleep(0.5)
        successor.append(start_sampler(short_dir))
        done.wait(120)  # the successor dies with the thread that started it

    thread = threading.Thread(target=operator)
    before = (
        REGISTRY.get_sample_value("streamrec_trainer_sampler_recoveries_total", {"rank": "0"})
        or 0.0
    )
    try:
        thread.start()
        records = [t.run_pass(spec) for spec in t.passes_todo()]
        assert killed_at, "the sampler was never killed"
        sampler = t.negatives.sampler if t.negatives is not None else None
        assert sampler is not None and sampler.recoveries == 1
        assert sampler.server_pid == successor[0].pid
        assert (
            REGISTRY.get_sample_value("streamrec_trainer_sampler_recoveries_total", {"rank": "0"})
            == before + 1
        )
        print(f"sampler recovery (found gone -> call sent again): {sampler.last_recovery_s:.2f}s")
    finally:
        done.set()
        thread.join(timeout=30)
        t.close()
        for proc in [first, *successor]:
            stop_process(proc)
    # every pass trained once, on every one of its clicks with 2 negatives each
    assert [r["samples"] for r in records] == [3 * c for c in clicks]
    lines = [json.loads(x) for x in (tmp_path / "m" / "passes.jsonl").read_text().splitlines()]
    assert [(x["day"], x["pass_id"]) for x in lines] == [("20190720", 1), ("20190720", 2)]
    assert all(x["actual_ctr"] == pytest.approx(1 / 3) for x in lines)


@pytest.mark.timeout(120)
def test_a_sampler_gone_longer_than_the_group_can_wait_fails_the_pass_naming_it_in_time(
    stream, tmp_path, short_dir
):
    """A rank waits for its sampler within the group's collective timeout (the other ranks
    wait for it in the step's all-reduce): a sampler still gone then fails the pass as an
    infrastructure failure naming the sampler, before a collective could time out and fail
    it as a lost peer."""
    endpoint = f"ipc://{short_dir}/sampler.sock"
    cfg, _ = negatives_config(stream, tmp_path, endpoint, train_batch_size=16)
    cfg = cfg.model_copy(
        update={"distributed": cfg.distributed.model_copy(update={"timeout_s": 5.0})}
    )
    server = start_sampler(short_dir)
    t = OnlineTrainer(cfg)
    killed_at: list[float] = []

    def operator() -> None:
        wait_for(lambda: t.step >= 5, 120, 0.01, what="step 5")
        os.kill(server.pid, signal.SIGKILL)
        killed_at.append(time.monotonic())

    thread = threading.Thread(target=operator, daemon=True)
    try:
        thread.start()
        with pytest.raises(PassFailed) as err:
            t.run_pass(t.passes_todo()[0])
        failed_after = time.monotonic() - killed_at[0]
        assert error_class(err.value) == "infra", err.value
        assert endpoint in str(err.value) and "reconnect_timeout_s=4s" in str(err.value)
        assert 3.5 < failed_after < cfg.distributed.timeout_s, failed_after
    finally:
        thread.join(timeout=30)
        t.close()
        stop_process(server)


@pytest.mark.timeout(120)
def test_a_sampler_refusing_the_token_fails_the_pass_as_infrastructure_naming_it(
    stream, tmp_path, short_dir
):
    endpoint = f"ipc://{short_dir}/sampler.sock"
    cfg, _ = negatives_config(stream, tmp_path, endpoint, checkpoint_per_pass=0)
    theirs = write_token_file(short_dir / "their-token")
    server = start_sampler(short_dir, theirs)
    t = OnlineTrainer(cfg)
    try:
        with pytest.raises(PassFailed) as err:
            t.run_pass(t.passes_todo()[0])
        assert error_class(err.value) == "infra"  # a restart with budget, not a failed pass
        text = str(err.value)
        assert "SamplerRefused" in text and endpoint in text and f"kill {server.pid}" in text
        assert t.negatives is None  # the next attempt reaches the sampler anew
    finally:
        t.close()
        stop_process(server)


@pytest.mark.timeout(120)
def test_no_sampler_at_the_jobs_endpoint_fails_the_pass_as_infrastructure(
    stream, tmp_path, short_dir
):
    endpoint = f"ipc://{short_dir}/sampler.sock"
    cfg, _ = negatives_config(stream, tmp_path, endpoint, checkpoint_per_pass=0)
    t = OnlineTrainer(cfg)
    try:
        with pytest.raises(PassFailed, match="no sampler server answers") as err:
            t.run_pass(t.passes_todo()[0])
        assert error_class(err.value) == "infra" and endpoint in str(err.value)
    finally:
        t.close()


def test_the_trainer_starts_no_sampler_at_the_deployments_address(short_dir, monkeypatch):
    """``$STREAMREC_SAMPLER_ENDPOINT`` (the stack's, the DaemonSet's) is its runner's to
    start: the trainer waits for it there, never starts one of its own."""
    from streamrec.control.trainer_config import NegativeSamplingConfig
    from streamrec.sampler.errors import SamplerUnavailable
    from streamrec.trainer.data.negsampling import NegativeSampler

    sock = short_dir / "deployment.sock"
    monkeypatch.setenv("STREAMREC_SAMPLER_ENDPOINT", f"ipc://{sock}")
    cfg = NegativeSamplingConfig(enabled=True, reload=False, auto_start=True)
    with pytest.raises(SamplerUnavailable, match=f"no sampler server answers at ipc://{sock}"):
        NegativeSampler(cfg, num_slots=4)
    assert not sock.exists()


@pytest.mark.timeout(240)
def test_a_refusing_sampler_spends_the_restart_budget_then_fails_the_job_naming_it(
    client, redis_server, roots, tmp_path, short_dir
):
    """Through REST and a real agent: each attempt's pass fails ``infra`` (a restart with
    backoff, an event), and the job fails when ``resources.restart_budget`` is spent, its
    error naming the sampler, the process holding it and how to stop it."""
    data, model = roots["data"] / "refused", roots["model"] / "refused"
    datagen(data, max_splits=1)
    write_item_table(data / "items.parquet", np.arange(100, dtype=np.int64))
    theirs = write_token_file(short_dir / "their-token")
    server = start_sampler(short_dir, theirs, Path(TEST_SAMPLER_ENDPOINT[len("ipc://") :]))
    body = small_job(
        "refused",
        data,
        model,
        sampler={"endpoint": TEST_SAMPLER_ENDPOINT, "neg_num": 2},
        resources={"restart_budget": 1, "restart_backoff_s": 0.2},
    )
    body["model"] = {
        **SMALL_MODEL,
        "negative_sampling": {"table_path": str(data / "items.parquet"), "item_slot": 0},
    }
    job_id = started_job(client, body)
    agent = run_agent(redis_server.url, job_id, tmp_path / "agent.log")
    try:
        job = wait_for(
            lambda: (j := client.get(f"/v1/jobs/{job_id}").json())["state"] == "failed" and j,
            180,
            0.2,
            what="the job failed",
            detail=lambda: (tmp_path / "agent.log").read_text(errors="replace")[-3000:],
        )
        error = job["error"]
        assert "restart budget spent" in error and "SamplerRefused" in error, error
        assert TEST_SAMPLER_ENDPOINT in error and f"kill {server.pid}" in error, error
        assert job["restarts_total"] == 2, job  # the budget's restart, then the one past it
        events = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 100}).json()["data"]
        assert [e["type"] for e in events].count("restart") == 2, events
        assert server.poll() is None  # nobody else's sampler was touched
    finally:
        stop_process(agent)
        stop_process(server)
