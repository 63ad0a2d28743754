"""Test helpers: a real API process (uvicorn over HTTP) on a free port (redis: servers.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from servers import free_port, wait_for
from streamrec.control.channel import ReportKind, TrainerChannel
from streamrec.process import spawn, stop_process

TOKEN = "test-token-0123456789"
#: A store shard address tests start shards on (ipc: no port to race for); allowed below.
TEST_STORE_ENDPOINT = f"ipc://{tempfile.gettempdir()}/streamrec-test-{uuid.uuid4().hex[:12]}.sock"
#: The store endpoints the test API allows jobs to name (``--store-endpoint``).
STORE_ENDPOINTS = ["tcp://127.0.0.1:7701", TEST_STORE_ENDPOINT]
#: A sampler address tests start a sampler on; allowed below (``--sampler-endpoint``).
TEST_SAMPLER_ENDPOINT = f"ipc://{tempfile.gettempdir()}/streamrec-smp-{uuid.uuid4().hex[:12]}.sock"
SAMPLER_ENDPOINTS = ["tcp://127.0.0.1:7700", TEST_SAMPLER_ENDPOINT]


@dataclass
class ApiServer:
    """`streamrec-api serve` as a child process."""

    redis_url: str
    data_root: Path
    model_root: Path
    token_file: Path
    port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)
    store_endpoints: list[str] = field(default_factory=lambda: list(STORE_ENDPOINTS))
    sampler_endpoints: list[str] = field(default_factory=lambda: list(SAMPLER_ENDPOINTS))
    proc: subprocess.Popen | None = None
    log: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [
            sys.executable,
            "-m",
            "streamrec.api",
            "serve",
            "--port",
            str(self.port),
            "--redis-url",
            self.redis_url,
            "--token-file",
            str(self.token_file),
            "--data-root",
            str(self.data_root),
            "--model-root",
            str(self.model_root),
            "--scheduler-interval-s",
            "0.1",
            "--log-level",
            "warning",
            *(arg for e in self.store_endpoints for arg in ("--store-endpoint", e)),
            *(arg for e in self.sampler_endpoints for arg in ("--sampler-endpoint", e)),
            "--online-redis-url",  # the tests' serving Redis is the API's own
            self.redis_url,
            *self.extra,
        ]
        env = {"STREAMREC_API_LOCK_TTL_S": "0.5", **self.env}
        self.log = self.token_file.parent / f"api-{self.port}.log"
        self.proc = spawn(args, log=self.log, env=env, die_with_parent=True)
        proc, log = self.proc, self.log
        wait_for(
            lambda: healthy(self.url),
            30,
            0.1,
            what="the API's /healthz",
            gone=lambda: None if proc.poll() is None else f"it exited ({proc.returncode})",
            detail=lambda: log.read_text()[-2000:],
        )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM, SIGKILL after 15 s; another ``sig`` is sent first (SIGKILL: a crash)."""
        if self.proc is not None:
            if sig != signal.SIGTERM and self.proc.poll() is None:
                self.proc.send_signal(sig)
            stop_process(self.proc, timeout_s=15)
        self.proc = None

    def http(self, token: str | None = TOKEN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10)


def make_api(redis_url: str, roots: dict[str, Path], **kw) -> ApiServer:
    return ApiServer(redis_url, roots["data"], roots["model"], roots["secret"] / "token", **kw)


def job_body(roots: dict[str, Path], name: str = "t", **data_overrides) -> dict:
    """A small job named ``name`` over ``roots["data"] / name``; each body has a model path
    of its own (one model path, one job: the API refuses a second live job on one)."""
    data = {
        "train_data_dir": str(roots["data"] / name),
        "start_day": "20190720",
        "end_day": "20190720",
        "split_interval": 360,
        "split_per_pass": 1,
        "data_donefile": "DONE",
        "data_sleep_second": 0.05,
        **data_overrides,
    }
    return {
        "name": name,
        "data": data,
        "checkpoint": {"model_save_path": str(roots["model"] / f"{name}-{uuid.uuid4().hex[:8]}")},
    }


def land_split(
    data_root: Path, day: str, split: str, donefile: str = "DONE", lines: int = 3
) -> Path:
    """Writes a split directory with one data file, then its donefile (last, as producers do)."""
    d = data_root / day / split
    d.mkdir(parents=True, exist_ok=True)
    (d / "part-00000").write_text("".join(f"{i % 2}\t1\t2\n" for i in range(lines)))
    (d / donefile).write_text("")
    return d


def healthy(url: str) -> bool:
    """Whether the API at ``url`` answers /healthz with 200 now."""
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


#: A saturated model's pass record as the trainer writes it (runner.py's record and its
#: ``collapse_figures``): every row at 1.0, AUC 0.5.
SATURATED_PASS: dict[str, Any] = {
    "samples": 1500,
    "seconds": 0.5,
    "predict_auc": 0.5,
    "train_auc": 0.5,
    "logloss": 20.1,
    "predicted_ctr": 1.0,
    "actual_ctr": 0.26,
    "predict_top_share": 1.0,
    "predict_collapsed": True,
    "train_top_share": 1.0,
    "train_collapsed": True,
    "predictions_collapsed": True,
}


def report_pass(redis_url: str, job_id: str, record: dict[str, Any]) -> str:
    """As a trainer would: takes the pass handed out and reports it done with ``record``;
    returns its key (``day/pass_id``)."""
    ch = TrainerChannel(redis_url, job_id, "fake-trainer")
    try:
        item = wait_for(lambda: ch.take_pass(block_ms=200), what="pass handed out")
        ch.report(
            ReportKind.PASS_DONE,
            day=item.spec.day,
            pass_id=item.spec.pass_id,
            ranks=1,
            attempt=item.attempt,
            record=record,
        )
        ch.ack_pass(item)
        return f"{item.spec.day}/{item.spec.pass_id}"
    finally:
        ch.close()
