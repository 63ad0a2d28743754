"""One trainer rank under torchrun (used by test_distributed.py): runs the job of the YAML
file, then writes its dense parameters to OUT/rank<r>.pt and a summary to OUT/rank<r>.json."""

import faulthandler
import json
import sys
from pathlib import Path

import torch
from streamrec.control.trainer_config import TrainerConfig
from streamrec.trainer.runner import OnlineTrainer

faulthandler.enable()  # a C++ abort (std::terminate) prints every thread's Python stack

config, out = TrainerConfig.from_yaml(sys.argv[1]), Path(sys.argv[2])
with OnlineTrainer(config) as t:
    t.run()
    torch.save(t.dense.state_dict(), out / f"rank{t.rank}.pt")
    (out / f"rank{t.rank}.json").write_text(
        json.dumps({"rank": t.rank, "world": t.world, "step": t.step, "last_pass": t.last_pass})
    )
