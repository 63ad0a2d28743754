"""Trust between the control plane and the trainers (RELIABILITY.md, "No door left open"): the
data-plane token goes to no address a job chose (a sampler, store shards, a deleted job's
shards), and a trainer config rewritten in Redis is refused by the trainer itself (real API,
real redis-server, real agent process, a real ZeroMQ socket recording what it is sent)."""

from __future__ import annotations

import json
import socket
import sys
import threading
from pathlib import Path

import pytest
from agent_helpers import SMALL_MODEL, agent_args, datagen
from api_helpers import TEST_STORE_ENDPOINT, job_body
from servers import free_port, wait_for
from streamrec.control import keys
from streamrec.control.pool import NamespaceDrop
from streamrec.errors import StreamRecError
from streamrec.process import spawn, stop_process
from unauthenticated import PlainTrap

#: The data-plane token the agents of these tests hold ($STREAMREC_AUTH_TOKEN_FILE).
PEER_TOKEN = "trust-test-peer-token-0123"


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


@pytest.fixture
def trap():
    t = PlainTrap()
    yield t
    t.close()


@pytest.fixture
def peer_token_file(tmp_path: Path) -> Path:
    f = tmp_path / "peer-token"
    f.write_text(PEER_TOKEN + "\n")
    f.chmod(0o600)
    return f


def run_guarded_agent(
    redis_url: str,
    job_id: str | None,
    roots: dict[str, Path],
    log: Path,
    extra: list[str] | None = None,
    env: dict[str, str] | None = None,
):
    """An agent with the trainer's own limits (the flags ``streamrec up`` passes); ``job_id``
    None: a pooled group (``trust-pool``) waiting for an assignment."""
    pinned = agent_args(redis_url, job_id) if job_id is not None else []
    pooled = ["--redis-url", redis_url, "--group-name", "trust-pool", "--poll-ms", "200"]
    args = [
        sys.executable,
        "-m",
        "streamrec.trainer.agent",
        *(pinned or pooled),
        "--model-root",
        str(roots["model"]),
        "--data-root",
        str(roots["data"]),
        *(extra or []),
    ]
    return spawn(args, log=log, env=env, die_with_parent=True)


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
    from streamrec.trainer.data.negsampling import NegativeSampler

    sock = tmp_path / "job-chosen.sock"
    cfg = NegativeSamplingConfig(
        enabled=True, reload=False, endpoint=f"ipc://{sock}", auto_start=True
    )
    with pytest.raises(SamplerUnavailable, match="auto_start=False"):
        NegativeSampler(cfg, num_slots=4)
    assert not sock.exists()


def test_the_trap_records_the_token_a_store_client_sends(trap, peer_token_file):
    """The control of the two tests below: the store client the trainer uses hands the trap
    its token in the handshake, so a trap left empty means the token was never sent."""
    from streamrec.embedding_store import EmbeddingStoreClient

    with pytest.raises(StreamRecError, match="unauthorized"):
        EmbeddingStoreClient([trap.endpoint], auth_token_file=peer_token_file, timeout_s=5)
    assert (b"streamrec", PEER_TOKEN.encode()) in trap.credentials


@pytest.mark.timeout(180)
def test_store_endpoints_rewritten_into_redis_get_no_token(
    client, roots, redis_server, r, trap, peer_token_file, tmp_path
):
    body = job_body(roots, "store", split_interval=720, data_donefile="to.hadoop.done")
    body["model"] = SMALL_MODEL
    job_id = client.post("/v1/jobs", json=body).json()["id"]

    def to_trap(cfg: dict) -> None:  # an allowed shard first: the error names the second
        cfg["store"] = {**cfg.get("store", {}), "endpoints": [TEST_STORE_ENDPOINT, trap.endpoint]}

    rewrite_trainer_config(r, job_id, to_trap)
    assert client.post(f"/v1/jobs/{job_id}/start").status_code == 200
    log = tmp_path / "agent.log"
    agent = run_guarded_agent(
        redis_server.url,
        job_id,
        roots,
        log,
        extra=["--store-endpoint", TEST_STORE_ENDPOINT],
        env={"STREAMREC_AUTH_TOKEN_FILE": str(peer_token_file)},
    )
    error = failed_with(client, job_id, agent, log)
    assert "store.endpoints[1]" in error and trap.endpoint in error, error
    assert "not a store shard this trainer trusts" in error
    assert not trap.received(), (trap.accepted, trap.credentials)


@pytest.mark.timeout(180)
def test_a_deleted_jobs_drop_rewritten_into_redis_gets_no_token(
    api, roots, redis_server, r, trap, peer_token_file, tmp_path
):
    """An idle pooled group frees deleted jobs' rows on the shards a drop names: a drop
    pushed into Redis naming another address is refused, and nothing is sent there."""
    r.rpush(keys.POOL_DROPS, NamespaceDrop("gone", (trap.endpoint,)).encode())
    log = tmp_path / "pool.log"
    agent = run_guarded_agent(
        redis_server.url,
        None,
        roots,
        log,
        extra=["--store-endpoint", TEST_STORE_ENDPOINT],
        env={"STREAMREC_AUTH_TOKEN_FILE": str(peer_token_file)},
    )
    try:
        wait_for(
            lambda: "not dropped" in log.read_text(),
            timeout=120,
            interval=0.2,
            what="the pooled group to take the drop",
            gone=lambda: None if agent.poll() is None else f"it exited ({agent.returncode})",
            detail=lambda: log.read_text()[-2000:],
        )
    finally:
        stop_process(agent)
    text = log.read_text()
    assert "drop.endpoints[0]" in text and trap.endpoint in text, text[-2000:]
    assert r.llen(keys.POOL_DROPS) == 0
    assert not trap.received(), (trap.accepted, trap.credentials)
