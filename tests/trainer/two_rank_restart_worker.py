"""One trainer rank under torchrun (used by test_runner_shard_restart.py): trains pass 1 (which
writes a checkpoint), writes OUT/rank<r>.ready, waits for OUT/restarted (the test restarts
the store shard empty meanwhile), then pass 2 (must fail), the checkpoint's load and pass 2
again; writes what happened to OUT/rank<r>.json."""

import faulthandler
import json
import sys
import time
from pathlib import Path

from streamrec.control.trainer_config import TrainerConfig
from streamrec.trainer.errors import PassFailed
from streamrec.trainer.runner import OnlineTrainer

faulthandler.enable()  # a C++ abort (std::terminate) prints every thread's Python stack
config, out = TrainerConfig.from_yaml(sys.argv[1]), Path(sys.argv[2])
with OnlineTrainer(config) as t:
    first, second = t.passes_todo()
    t.run_pass(first)
    (out / f"rank{t.rank}.ready").touch()
    deadline = time.monotonic() + 60
    while not (out / "restarted").exists():
        if time.monotonic() > deadline:
            sys.exit("the test did not restart the shard within 60 s")
        time.sleep(0.05)
    failed = None
    try:
        t.run_pass(second)
    except PassFailed as exc:
        failed = {"kind": exc.kind, "message": str(exc)}
    t.load_checkpoint(first.day, first.pass_id)  # rank 0 loads; every rank takes the shards
    record = t.run_pass(second)
    (out / f"rank{t.rank}.json").write_text(
        json.dumps({"failed": failed, "samples": record["samples"]})
    )
