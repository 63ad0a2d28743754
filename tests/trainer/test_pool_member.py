"""A real pooled trainer group (``streamrec-trainer-agent`` without ``--job-id``, one rank)
under the real API and Redis: the pool heals.

A job the group cannot run (shards of another tier) fails with the group's message and the
group is back in the pool at once; a job whose group could not start (a shard that refuses
the group's peer token), then stopped, frees the group too. Either way the next valid job runs
on that same group, the only one in the pool. Before the fix the group's registration kept
naming the ended job and the API counted it busy for ever: the next job waited for trainers.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from agent_helpers import alive, datagen, finished, small_job, started_job
from api_helpers import TEST_STORE_ENDPOINT
from servers import wait_for
from streamrec.control import keys
from streamrec.process import spawn, stop_process


class Group:
    """A pooled one-rank trainer group as a child process, and what Redis says of it."""

    def __init__(self, redis_url: str, log: Path) -> None:
        self.name = f"pool-{uuid.uuid4().hex[:8]}"
        self.log = log
        self.proc: subprocess.Popen = spawn(
            [
                sys.executable,
                "-m",
                "streamrec.trainer.agent",
                "--redis-url",
                redis_url,
                "--group-name",
                self.name,
                "--heartbeat-ttl-s",
                "3",
                "--poll-ms",
                "200",
            ],
            log=log,
            die_with_parent=True,
            env={"OMP_NUM_THREADS": "1"},
        )

    def registration(self, r: redis.Redis) -> dict | None:
        alive(self.proc, self.log)
        raw = r.get(keys.pool_group(self.name))
        return None if raw is None else json.loads(raw)

    def wait_idle(self, r: redis.Redis, timeout: float = 60) -> dict:
        """Until the group's registration names no job (it is back in the pool)."""
        return wait_for(
            lambda: (g := self.registration(r)) is not None and g["job_id"] is None and g,
            timeout=timeout,
            interval=0.1,
            what=f"group {self.name} idle in the pool",
            detail=lambda: f"{self.registration(r)}\n{self.log.read_text()[-3000:]}",
        )

    def wait_working(self, r: redis.Redis, job_id: str, timeout: float = 60) -> dict:
        return wait_for(
            lambda: (g := self.registration(r)) is not None and g["job_id"] == job_id and g,
            timeout=timeout,
            interval=0.1,
            what=f"group {self.name} working for {job_id}",
            detail=lambda: self.log.read_text()[-3000:],
        )


@pytest.fixture
def group(redis_server, r, tmp_path: Path) -> Iterator[Group]:
    g = Group(redis_server.url, tmp_path / "group.log")
    try:
        g.wait_idle(r)
        yield g
    finally:
        stop_process(g.proc)


@pytest.fixture(scope="module")
def day(roots) -> Path:
    """The planted day (2 passes) every valid job of this module trains."""
    data = roots["data"] / "pool-day"
    datagen(data)
    return data


def tables_file(path: Path) -> Path:
    from agent_helpers import SMALL_MODEL
    from streamrec.control.trainer_config import TrainerConfig
    from streamrec.trainer.store_tables import build_table_options

    tables = build_table_options(TrainerConfig.parse(SMALL_MODEL))
    path.write_text(json.dumps({"tables": [t.model_dump(mode="json") for t in tables]}))
    return path


def events(client: httpx.Client, job_id: str) -> list[dict]:
    return client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]


def runs_on(client, r, roots, day: Path, group: Group, name: str) -> dict:
    """A valid job (in-process store) started now runs on ``group`` and succeeds."""
    job_id = started_job(client, small_job(name, day, roots["model"] / name))
    job = wait_for(
        lambda: (j := client.get(f"/v1/jobs/{job_id}").json())["group"] and j,
        timeout=15,
        what=f"a group for {name}",
        detail=lambda: json.dumps([client.get(f"/v1/jobs/{job_id}").json(), group.registration(r)]),
    )
    assert job["group"] == group.name and job["trainers"] == "assigned", job
    done = finished(client, job_id, group.proc, group.log)
    assert done["state"] == "succeeded", done
    assert done["passes_done"] == done["passes_total"] == 2
    return done


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_job_the_group_cannot_run_fails_and_frees_the_group(
    client, roots, r, day, group, tmp_path
):
    from streamrec.embedding_store import LocalShards

    # host tier, at an endpoint the test API allows; the job asks for ssd
    with LocalShards(tables_file(tmp_path / "tables.json"), 1, endpoint=TEST_STORE_ENDPOINT) as sh:
        body = small_job(
            "pool-tier",
            roots["data"] / "pool-tier",
            roots["model"] / "pool-tier",
            store={"endpoints": sh.endpoints, "tier": "ssd"},
        )
        job_id = started_job(client, body)
        job = wait_for(
            lambda: (j := client.get(f"/v1/jobs/{job_id}").json())["state"] == "failed" and j,
            timeout=60,
            what="the job failed",
            detail=lambda: group.log.read_text()[-3000:],
        )
        # back in the pool at once (it used to keep naming the failed job for ever)
        group.wait_idle(r, timeout=3)
    assert job["error"] == (
        f"store.tier is 'ssd' but shard 0 ({sh.endpoints[0]}) serves tier 'host' "
        f"(shards own their tier: start them with --tier ssd, or change store.tier)"
    )
    assert any(
        f"assigned to trainer group {group.name}" in e["message"] for e in events(client, job_id)
    )
    wait_for(lambda: r.hget(keys.POOL_ASSIGNMENTS, group.name) is None, what="assignment cleared")
    # refused once, never tried again
    assert group.log.read_text().count(f"job {job_id} cannot run on group") == 1
    runs_on(client, r, roots, day, group, "pool-after-tier")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_stopped_job_whose_group_could_not_start_frees_the_group(
    client, roots, r, day, group, tmp_path
):
    from streamrec.embedding_store import LocalShards

    other = tmp_path / "other-token"
    other.write_text(secrets.token_hex(16))
    other.chmod(0o600)
    # a shard the group cannot talk to: it holds another peer token than the group's
    with LocalShards(None, 1, endpoint=TEST_STORE_ENDPOINT, auth_token_file=other) as sh:
        body = small_job(
            "pool-refused",
            roots["data"] / "pool-refused",
            roots["model"] / "pool-refused",
            store={"endpoints": sh.endpoints},
        )
        job_id = started_job(client, body)
        wait_for(
            lambda: any(
                "the trainer group could not start" in e["message"] for e in events(client, job_id)
            ),
            timeout=60,
            what="the group could not start",
            detail=lambda: group.log.read_text()[-3000:],
        )
        # backing off before the next try: free in its registration, the job still its own
        group.wait_idle(r, timeout=3)
        job = client.get(f"/v1/jobs/{job_id}").json()
        assert job["state"] == "running" and job["group"] == group.name, job
        assert client.post(f"/v1/jobs/{job_id}/stop").status_code == 200
        wait_for(
            lambda: client.get(f"/v1/jobs/{job_id}").json()["state"] == "stopped",
            timeout=30,
            what="the job stopped",
        )
        wait_for(
            lambda: r.hget(keys.POOL_ASSIGNMENTS, group.name) is None,
            what="assignment cleared",
        )
        group.wait_idle(r, timeout=3)
    runs_on(client, r, roots, day, group, "pool-after-stop")
