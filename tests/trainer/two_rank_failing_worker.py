"""One trainer rank under torchrun (used by test_distributed.py) whose job is expected to
fail: runs it and writes OUT/rank<r>.json with what it raised and how long it took.

It leaves with os._exit(0) after closing the trainer (process group destroyed): about one
run in ten, interpreter finalization after a failed pass aborted in a C++ destructor
("terminate called without an active exception", no Python frame), after both ranks had
written their outcome; that teardown is not what this worker measures (docs/design-notes.md,
"A failure in one rank").
"""

import faulthandler
import json
import os
import sys
import time
from pathlib import Path

from streamrec.control.trainer_config import TrainerConfig
from streamrec.trainer.errors import PassFailed
from streamrec.trainer.runner import OnlineTrainer

faulthandler.enable()  # a C++ abort (std::terminate) prints every thread's Python stack

config, out = TrainerConfig.from_yaml(sys.argv[1]), Path(sys.argv[2])
with OnlineTrainer(config) as t:
    started = time.monotonic()
    try:
        t.run()
        result = {"raised": None}
    except PassFailed as exc:
        result = {
            "raised": type(exc).__name__,
            "kind": exc.kind,
            "bad_splits": list(exc.bad_splits),
            "message": str(exc),
        }
    result |= {"seconds": time.monotonic() - started, "clean": t.clean, "rank": t.rank}
    (out / f"rank{t.rank}.json").write_text(json.dumps(result))
os._exit(0)
