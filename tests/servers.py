"""Helpers shared by the test directories: a free local port, a real redis-server,
Prometheus's text format read from a live /metrics, and the one wait of the tests
(:func:`wait_for`: a condition with a deadline, never a fixed sleep)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
import redis
from streamrec.process import free_port, spawn, stop_process

T = TypeVar("T")


def wait_for(
    probe: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str = "condition",
    gone: Callable[[], str | None] | None = None,
    detail: Callable[[], str] | None = None,
) -> T:
    """Polls ``probe`` until it returns a truthy value, and returns that value.

    Args:
        probe: the condition; what it returns when true is handed back.
        timeout: seconds before the wait fails; interval: seconds between probes.
        what: what is waited for, named in the failure.
        gone: returns why the wait cannot succeed any more (e.g. the process it waits on
            exited), else None: checked after each probe, the wait fails at once.
        detail: what the failure adds (e.g. the end of a log), read only on failure.

    Raises:
        AssertionError: ``timeout`` passed, or ``gone`` said why.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        why = gone() if gone is not None else None
        if why is None and time.monotonic() > deadline:
            why = f"not within {timeout:g} s"
        if why is not None:
            more = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"gave up waiting for {what}: {why}{more}")
        time.sleep(interval)


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


@contextlib.contextmanager
def tmpfs(root: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at ``root`` (made here): a real filesystem that fills
    up (mounting needs root, as the test machines have)."""
    root.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(root)],
        capture_output=True,
        text=True,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (not root?): {mount.stderr.strip()}")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)
