"""Helpers of the service tests: starting a server process, and functions run in separate
client processes (multiprocessing 'spawn'). A uniquely named module, importable from the
child processes and from the tests alike."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from servers import free_port, wait_for
from streamrec.process import spawn, stop_process
from streamrec.sampler import LocalRpcDataSampler
from streamrec.wire import RpcClient

TAGS = ("cat", "item", "w", "skey")


def small_table(n: int = 50) -> dict:
    """A negative table of ``n`` items (ids 0, 100, ...) in 5 categories, weight 1 each."""
    j = np.arange(n)
    return {
        "item": torch.from_numpy(j * 100),
        "cat": torch.from_numpy(j % 5),
        "w": torch.from_numpy(np.ones(n, np.float32)),
        "skey": [""] * n,
    }


def draw_counts(endpoint: str, batches: int, category: int, pos_id: int, n_items: int):
    """Samples ``batches`` x 500 positives x 20 negatives in ``category``; returns counts."""
    s = LocalRpcDataSampler(*TAGS, endpoint=endpoint, auto_start=False)
    counts = np.zeros(n_items, np.int64)
    cats = set()
    own = 0
    for _ in range(batches):
        ids = s.sample_ids(torch.full((500,), pos_id), 20, torch.full((500,), category))
        own += int((ids == pos_id).sum())
        cats.update(np.unique(ids.numpy() % 100).tolist())
        counts += np.bincount(ids.numpy() // 100, minlength=n_items)
    s.close()
    return counts, sorted(cats), own


def sample_until_stopped(endpoint: str, started, stop, results) -> None:
    """Samples continuously; reports per response whether all ids came from table A or B."""
    s = LocalRpcDataSampler(*TAGS, endpoint=endpoint, auto_start=False)
    pure_a = pure_b = mixed = 0
    j = torch.arange(64)
    cats = j % 5
    pos = j * 100 + cats  # table A's ids, so own-id avoidance is exercised
    started.set()
    while not stop.is_set():
        ids = s.sample_ids(pos, 50, cats).numpy()
        in_b = ids >= 1_000_000
        if in_b.all():
            pure_b += 1
        elif not in_b.any():
            pure_a += 1
        else:
            mixed += 1
    results.put((pure_a, pure_b, mixed))
    s.close()


def construct_client(endpoint: str, barrier) -> int:
    """Waits for the other racer, then creates an auto-starting client; returns server pid."""
    barrier.wait()
    s = LocalRpcDataSampler(*TAGS, endpoint=endpoint, auto_start=True, start_timeout_s=60)
    pid = s.server_pid
    s.close()
    return pid


class ServerProcess:
    def __init__(self, endpoint: str, metrics_port: int, proc: subprocess.Popen) -> None:
        self.endpoint = endpoint
        self.metrics_port = metrics_port
        self.proc = proc


def start_server(directory: str, *extra: str) -> ServerProcess:
    endpoint = f"ipc://{directory}/sampler.sock"
    port = free_port()
    log = Path(directory) / "server.log"
    proc = spawn(
        [
            sys.executable,
            "-m",
            "streamrec.sampler",
            "serve",
            "--endpoint",
            endpoint,
            "--metrics-port",
            str(port),
            "--seed",
            "1",
            *extra,
        ],
        log=log,
        die_with_parent=True,
    )
    with RpcClient(endpoint, timeout_s=1) as client:

        def answers() -> bool:
            if not os.path.exists(endpoint[6:]):
                return False
            try:
                client.call("ping", timeout_s=1)
                return True
            except Exception:
                return False

        try:
            wait_for(
                answers,
                60,
                what="the sampler server's ping",
                gone=lambda: None if proc.poll() is None else "the server exited",
                detail=lambda: log.read_text(errors="replace"),
            )
        except AssertionError:
            stop_process(proc)
            raise
    return ServerProcess(endpoint, port, proc)
