"""The cost of ``runner.sparse_push_order: rank`` (runs that repeat bit for bit) against the
default ``arrival``, on two trainer ranks (torchrun, gloo) over two embedding-store shard
processes (ZeroMQ ipc), the planted stream.

    baseline  ``arrival``: each rank pushes as soon as its step is done, on its sparse
              worker beside the next step, and pulls batch i+1 while batch i computes
    rank      rank 0 pushes, then rank 1, one step all-reduce a turn, and each rank pulls
              its next batch after both pushes (no pipelining)

Both run the same job on the same data in the same process setup, alternately,
``--repeats`` times each; the figure is training samples per second over both ranks (the
passes after the first, from ``passes.jsonl``), the median of the repeats, and ``rank``'s
ratio to ``arrival``.

    .venv/bin/python bench/push_order.py               # run alone: a busy core skews it
    .venv/bin/python bench/push_order.py --samples 40000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from streamrec.control.trainer_config import TrainerConfig
from streamrec.datagen.planted import StreamParams, generate
from streamrec.embedding_store import LocalShards
from streamrec.process import free_port
from streamrec.trainer.store_tables import build_table_options

SLOTS = 8
ORDERS = ("arrival", "rank")


def job_config(data: Path, model: Path, order: str, batch: int) -> TrainerConfig:
    """One day of 4 splits, a pass each; a small DLRM over ``SLOTS`` tables of dim 16."""
    return TrainerConfig.parse(
        {
            "runner": {
                "train_data_dir": str(data),
                "model_save_path": str(model),
                "split_interval": 360,
                "split_per_pass": 1,
                "start_day": "20190720",
                "end_day": "20190720",
                "checkpoint_per_pass": 0,
                "save_base_at_day_end": False,
                "train_batch_size": batch,
                "sparse_push_order": order,
            },
            "hyper_parameters": {
                "sparse_inputs_slots": SLOTS,
                "arch_sparse_feature_size": 16,
                "arch_mlp_bot": "13-64-16",
                "arch_mlp_top": "64-1",
                "optimizer": "adagrad",
                "learning_rate": 0.05,
            },
        }
    )


def run_once(root: Path, data: Path, order: str, batch: int, n: int) -> float:
    """Trains the job with two ranks in ``order``; returns samples per second of training."""
    out = root / f"{order}-{n}"
    out.mkdir()
    config = job_config(data, out / "model", order, batch)
    tables = out / "tables.json"
    tables.write_text(
        json.dumps({"tables": [t.model_dump(mode="json") for t in build_table_options(config)]})
    )
    with LocalShards(tables, 2) as shards:
        job = config.model_dump(mode="json")
        job["store"]["endpoints"] = shards.endpoints
        (out / "job.yaml").write_text(yaml.safe_dump(job))
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            "-m",
            "streamrec.trainer",
            "--config",
            str(out / "job.yaml"),
            "--quiet",
        ]
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"{order}: the trainer failed:\n{proc.stderr[-3000:]}")
    records = [json.loads(x) for x in (out / "model" / "passes.jsonl").read_text().splitlines()]
    timed = records[1:]  # the first pass warms up (threads, shard connections, row creation)
    return sum(r["samples"] for r in timed) / sum(r["train_seconds"] for r in timed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=20000, help="samples per split (a pass)")
    ap.add_argument("--batch", type=int, default=256, help="train_batch_size")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each order, alternating")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-push-order-") as tmp:
        root = Path(tmp)
        data = root / "data"
        generate(
            data,
            "20190720",
            1,
            360,
            args.samples,
            files_per_split=2,
            params=StreamParams(slots=SLOTS, vocab=5000, seed=3),
        )
        rates: dict[str, list[float]] = {o: [] for o in ORDERS}
        started = time.monotonic()
        for n in range(args.repeats):
            for order in ORDERS:
                rates[order].append(run_once(root, data, order, args.batch, n))
        base, ours = (statistics.median(rates[o]) for o in ORDERS)
    print(
        f"two ranks, two shards, batch {args.batch}, {args.samples} samples a pass, "
        f"{args.repeats} runs each ({time.monotonic() - started:.0f} s)"
    )
    for order in ORDERS:
        runs = ", ".join(f"{r:,.0f}" for r in rates[order])
        print(f"  {order:8s} {statistics.median(rates[order]):10,.0f} samples/s  (runs: {runs})")
    print(f"  rank / arrival: {ours / base:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
