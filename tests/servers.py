"""Helpers shared by the test directories: a free local port, a real redis-server, and
Prometheus's text format read from a live /metrics."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import redis
from streamrec.process import free_port, spawn, stop_process


def torchrun_command(nproc: int, *target: str) -> list[str]:
    """``nproc`` ranks of ``target`` (a script and its args, or ``-m module ...``) under
    torchrun on this machine, with a fresh rendezvous port."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        *target,
    ]


__all__ = ["RedisServer", "free_port", "torchrun_command"]


@dataclass
class RedisServer:
    """A redis-server on 127.0.0.1:``port`` keeping its files in ``dir``; it gets SIGTERM
    when the test run dies, so none is left behind."""

    port: int
    dir: Path
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, appendonly: bool = False) -> None:
        args = [
            "/usr/bin/redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            str(self.dir),
            "--daemonize",
            "no",
            "--appendonly",
            "yes" if appendonly else "no",
        ]
        self.proc = spawn(args, die_with_parent=True)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        """SIGTERM (Redis flushes its append-only file), SIGKILL after 10 s."""
        if self.proc is not None:
            stop_process(self.proc, timeout_s=10)
        self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=5)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format -> ``{'name{labels}': value}``."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def scrape_metrics(port: int) -> dict[str, float]:
    """The samples a live ``/metrics`` on 127.0.0.1:``port`` serves now."""
    return parse_metrics(
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    )
