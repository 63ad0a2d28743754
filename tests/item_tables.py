"""Negative-sampling fixtures shared by the trainer, agent and stack tests: the item table
of a generated day, and a sampler server process that answers before it is handed out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from servers import wait_for
from streamrec.process import spawn
from streamrec.trainer.data.batches import ParseStats
from streamrec.trainer.data.reader import iter_batches
from streamrec.wire import RpcClient


def write_item_table(path: Path, ids: np.ndarray) -> Path:
    """A sampler's negative table at ``path``: ``slot_0`` the item ids, one category, weight
    1, no sampling key (the trainer's default column names)."""
    ids = np.asarray(ids, np.int64)
    pq.write_table(
        pa.table(
            {
                "slot_0": pa.array(ids, pa.int64()),
                "category": pa.array(np.ones(len(ids), np.int64)),
                "weight": pa.array(np.ones(len(ids), np.float32)),
                "skey": pa.array([""] * len(ids)),
            }
        ),
        path,
    )
    return path


def day_items(files: list[Path], slots: int = 4) -> tuple[np.ndarray, int]:
    """The distinct item ids (slot 0) of generated ``files``, and their clicks."""
    batches = list(iter_batches(files, "generated", slots, 10**6, ParseStats()))
    ids = torch.unique(torch.cat([b.keys[:, 0] for b in batches])).numpy()
    return ids, sum(int(b.labels.sum()) for b in batches)


def start_sampler_process(
    endpoint: str, log: Path, token_file: Path | None = None, what: str = "the sampler"
) -> subprocess.Popen:
    """``streamrec.sampler serve`` at ``endpoint`` (as the launcher runs it), returned once it
    answers a ping; it dies with the thread that started it."""
    extra = [] if token_file is None else ["--auth-token-file", str(token_file)]
    proc = spawn(
        [sys.executable, "-m", "streamrec.sampler", "serve", "--endpoint", endpoint, *extra],
        log=log,
        die_with_parent=True,
    )
    token = None if token_file is None else token_file.read_text().strip()

    def answers() -> bool:
        try:
            with RpcClient(endpoint, timeout_s=1, token=token) as c:
                c.call("ping", timeout_s=1)
            return True
        except Exception:
            return False

    wait_for(
        answers,
        60,
        0.1,
        what=f"{what}'s ping",
        gone=lambda: None if proc.poll() is None else "it exited",
        detail=lambda: log.read_text(errors="replace") if log.exists() else "",
    )
    return proc
