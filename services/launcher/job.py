"""The demo job ``streamrec up`` submits, the tables its store shards serve, and the record of
the run (``RUN/run.json``) that ``streamrec up --resume`` goes on from."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

from streamrec.launcher.serving import ServingRedis
from streamrec.layout import format_day, parse_day

#: Table options of the demo (written to the shards' tables file and given to the trainers,
#: so both sides agree): plain tables trained from the start with AdaGrad.
TABLE_PARAMETERS: dict[str, Any] = {
    "embedx_threshold": 0,
    "initializer": {"type": "uniform", "low": -0.05, "high": 0.05},
    "embed_sgd_param": {
        "name": "SparseAdaGradSGDRule",
        "learning_rate": 0.05,
        "initial_g2sum": 3.0,
    },
    "embedx_sgd_param": {
        "name": "SparseAdaGradSGDRule",
        "learning_rate": 0.05,
        "initial_g2sum": 3.0,
    },
}


def tables_config(slots: int, embedding_dim: int) -> dict[str, Any]:
    """The shards' tables file: one table ``slot_<i>`` per sparse feature."""
    return {
        "tables": [
            {"name": f"slot_{i}", "dim": embedding_dim, **TABLE_PARAMETERS} for i in range(slots)
        ]
    }


def job_spec(args: argparse.Namespace, run: Path, store_endpoints: list[str]) -> dict[str, Any]:
    """The body of ``POST /v1/jobs``: ``args.days`` days of the planted stream under
    ``run/data``, a checkpoint per pass and a base model at each day's end under
    ``run/models``."""
    end_day = format_day(parse_day(args.start_day) + dt.timedelta(days=args.days - 1))
    return {
        "name": "demo",
        "data": {
            "train_data_dir": str(run / "data"),
            "start_day": args.start_day,
            "end_day": end_day,
            "split_interval": args.split_interval,
            "split_per_pass": args.split_per_pass,
            "data_donefile": "to.hadoop.done",
            "data_sleep_second": 0.2,
            "data_format": "generated",
        },
        "checkpoint": {
            # a directory of its own under the model root: other jobs (the README's REST
            # example) get theirs beside it, not inside the demo's (one model path, one job)
            "model_save_path": str(run / "models" / "demo"),
            "checkpoint_per_pass": 1,
            "save_delta_frequency": 0,
            "save_base_at_day_end": True,
        },
        "model": {
            "runner": {"train_batch_size": args.batch_size},
            "hyper_parameters": {
                "sparse_inputs_slots": args.slots,
                "arch_sparse_feature_size": args.embedding_dim,
                "arch_mlp_bot": f"13-32-{args.embedding_dim}",
                "arch_mlp_top": "32-1",
                "optimizer": "adagrad",
                "learning_rate": 0.05,
            },
            "store": {"timeout_s": 120},
            "distributed": {"backend": "gloo", "timeout_s": 300},
        },
        # the demo's planted stream has no negative table: no negatives are sampled
        "sampler": {"neg_num": 0},
        "store": {
            "endpoints": store_endpoints,
            "tier": args.store_tier,  # the shards' (the trainers check it)
            "table_parameters": TABLE_PARAMETERS,
        },
        "resources": {"trainer_ranks": args.trainers, "device": "cpu"},
    }


#: The record of the run, kept after ``streamrec down``: the demo job's id, the store shards
#: it ran on, and the flags that shaped the job and its data (:data:`JOB_FLAGS`).
RUN_FILE = "run.json"

#: The ``streamrec up`` flags a job and its data are made of: ``--resume`` takes the run's.
JOB_FLAGS = (
    "start_day",
    "days",
    "split_interval",
    "split_per_pass",
    "samples_per_split",
    "slots",
    "embedding_dim",
    "batch_size",
    "seed",
    "trainers",
    "store_tier",
)


def write_run(
    run: Path,
    args: argparse.Namespace,
    job_id: str,
    store_endpoints: list[str],
    serving: ServingRedis,
) -> None:
    """Writes ``RUN/run.json`` (atomically): the job, its shards, its :data:`JOB_FLAGS` and
    the serving Redis it publishes to (the API wrote its URL into the job)."""
    record = {
        "job_id": job_id,
        "store_endpoints": list(store_endpoints),
        "flags": {f: getattr(args, f) for f in JOB_FLAGS},
        "online_redis_url": serving.url,
        "serving_port": serving.port,  # None: not the stack's own
    }
    tmp = run / (RUN_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(run / RUN_FILE)


def read_run(run: Path) -> dict[str, Any] | None:
    """``RUN/run.json``, None when there is none (or it cannot be read)."""
    try:
        record = json.loads((run / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(record, dict) and {"job_id", "store_endpoints", "flags"} <= set(record)
    return record if ok else None
