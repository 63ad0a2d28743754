"""Trust between the control plane and the trainers (RELIABILITY.md, "No door left open"): the
data-plane token goes to no address a job chose, and a trainer config rewritten in Redis is
refused by the trainer itself (real API, real redis-server, real agent process)."""

from __future__ import annotations

import json
import socket
import sys
import threading
from pathlib import Path

import pytest
from agent_helpers import SMALL_MODEL, agent_args, datagen
from api_helpers import job_body
from servers import free_port, wait_for
from streamrec.control import keys
from streamrec.process import spawn, stop_process


class Listener:
    """A TCP listener at a job-chosen address that records every byte it is sent."""

    def __init__(self) -> None:
        self.port = free_port()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.received = bytearray()
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.settimeout(0.5)
            try:
                while chunk := conn.recv(65536):
                    self.received += chunk
            except OSError:
                pass
            finally:
                conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def listener():
    lst = Listener()
    yield lst
    lst.close()


def run_guarded_agent(redis_url: str, job_id: str, roots: dict[str, Path], log: Path):
    """An agent with the trainer's own limits (the flags ``streamrec up`` passes)."""
    args = [
        sys.executable,
        "-m",
        "streamrec.trainer.agent",
        *agent_args(redis_url, job_id),
        "--model-root",
        str(roots["model"]),
        "--data-root",
        str(roots["data"]),
    ]
    return spawn(args, log=log, die_with_parent=True)


def rewrite_trainer_config(r, job_id: str, edit) -> None:
    """What someone who can write Redis (no password) does to a stored job."""
    cfg = json.loads(r.hget(keys.job(job_id), "trainer_config"))
    edit(cfg)
    r.hset(keys.job(job_id), "trainer_config", json.dumps(cfg))


def failed_with(client, job_id: str, agent, log: Path) -> str:
    job = wait_for(
        lambda: (
            (j := client.get(f"/v1/jobs/{job_id}").json())["state"] in ("failed", "succeeded") and j
        ),
        timeout=120,
        interval=0.2,
        what=f"job ended; agent log: {log}",
    )
    stop_process(agent)
    assert job["state"] == "failed", (job, log.read_text()[-2000:])
    return job["error"]


def test_a_job_naming_a_sampler_at_its_own_address_is_refused(client, roots, listener):
    body = job_body(roots, "capture")
    body["sampler"] = {"endpoint": listener.endpoint, "neg_num": 2}
    body["model"] = {"negative_sampling": {"table_path": str(roots["data"] / "items.parquet")}}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 422, resp.text
    err = resp.json()["detail"][0]
    assert err["loc"] == ["body", "sampler", "endpoint"] and err["type"] == "endpoint_refused"
    assert client.get("/v1/jobs").json()["count"] == 0
    assert listener.connections == 0 and not listener.received


@pytest.mark.timeout(180)
def test_a_sampler_rewritten_into_redis_gets_no_token(
    client, roots, redis_server, r, listener, tmp_path
):
    data, model = roots["data"] / "cap", roots["model"] / "cap"
    datagen(data, max_splits=1)
    body = job_body(roots, "cap", split_interval=720, data_donefile="to.hadoop.done")
    body["data"]["train_data_dir"], body["checkpoint"]["model_save_path"] = str(data), str(model)
    body["model"] = SMALL_MODEL
    job_id = client.post("/v1/jobs", json=body).json()["id"]

    def to_listener(cfg: dict) -> None:
        cfg["negative_sampling"] = {
            **cfg["negative_sampling"],
            "enabled": True,
            "endpoint": listener.endpoint,
            "table_path": str(data / "items.parquet"),
        }

    rewrite_trainer_config(r, job_id, to_listener)
    assert client.post(f"/v1/jobs/{job_id}/start").status_code == 200
    log = tmp_path / "agent.log"
    agent = run_guarded_agent(redis_server.url, job_id, roots, log)
    error = failed_with(client, job_id, agent, log)
    assert "negative_sampling.endpoint" in error and listener.endpoint in error
    assert listener.connections == 0 and not listener.received


@pytest.mark.timeout(180)
def test_a_model_path_rewritten_into_redis_is_refused_by_the_trainer(
    client, roots, redis_server, r, tmp_path
):
    data, model = roots["data"] / "rw", roots["model"] / "rw"
    datagen(data, max_splits=1)
    body = job_body(roots, "rw", split_interval=720, data_donefile="to.hadoop.done")
    body["data"]["train_data_dir"], body["checkpoint"]["model_save_path"] = str(data), str(model)
    body["model"] = SMALL_MODEL
    job_id = client.post("/v1/jobs", json=body).json()["id"]
    outside = tmp_path / "outside"
    kept = outside / "20190720" / "1" / "keep"  # a pass directory the trainer would replace
    kept.parent.mkdir(parents=True)
    kept.write_text("not the trainer's")

    def elsewhere(cfg: dict) -> None:
        cfg["runner"]["model_save_path"] = str(outside)

    rewrite_trainer_config(r, job_id, elsewhere)
    assert client.post(f"/v1/jobs/{job_id}/start").status_code == 200
    log = tmp_path / "agent.log"
    agent = run_guarded_agent(redis_server.url, job_id, roots, log)
    error = failed_with(client, job_id, agent, log)
    assert "runner.model_save_path" in error and "outside the allowed roots" in error
    assert "INSECURE: Redis without a password" in log.read_text()  # this test's Redis has none
    assert kept.read_text() == "not the trainer's"
    assert sorted(p.relative_to(outside) for p in outside.rglob("*")) == [
        Path("20190720"),
        Path("20190720/1"),
        Path("20190720/1/keep"),
    ]


def test_the_trainer_starts_no_sampler_at_an_address_a_job_chose(tmp_path):
    """Auto-start is for the node-local default only: a job's endpoint with no server is an
    error, and nothing is started there (it would outlive the group and serve whoever named
    it)."""
    from streamrec.control.trainer_config import NegativeSamplingConfig
    from streamrec.sampler.errors import SamplerUnavailable
    from streamrec.trainer.negsampling import NegativeSampler

    sock = tmp_path / "job-chosen.sock"
    cfg = NegativeSamplingConfig(
        enabled=True, reload=False, endpoint=f"ipc://{sock}", auto_start=True
    )
    with pytest.raises(SamplerUnavailable, match="auto_start=False"):
        NegativeSampler(cfg, num_slots=4)
    assert not sock.exists()
