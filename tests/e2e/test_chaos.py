"""Chaos on a real `streamrec up --keep-running` stack: a job over REST with
``checkpoint_per_pass`` 3 and, in a seeded random order at random moments, kill -9 of every
kind of service (a trainer rank, the whole torchrun group, a store shard, Redis, the API, the
sampler), one at least the instant a ``pass_done`` report of a pass no checkpoint holds lands
in Redis (freezes and a double fault: ``test_chaos_freeze.py``). Each next fault once a pass
handed out after the last one is done. Then a no-fault job over the same data, and the
verdict of :mod:`chaos_checks`: the job succeeded and REST, ``passes.jsonl`` and the
checkpoints agree pass by pass, the model holding exactly the passes REST calls done, each
trained on the model after the pass before it; and, both jobs pushing in rank order
(``runner.sparse_push_order: rank``), the chaos job's model equal to the no-fault job's at
every checkpoint, bit for bit.

The seed is printed; ``STREAMREC_CHAOS_SEED`` runs another (``tools/chaos.py``: the same for
as long as asked).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from chaos_harness import KINDS, Schedule, run_and_judge

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("STREAMREC_CHAOS_SEED", "30"))
#: 48 passes of 300 samples (about a second each here): time for a kill of each kind.
SPLIT_INTERVAL = 30


@pytest.mark.timeout(290)
def test_chaos_every_kind_killed_rest_passes_jsonl_and_checkpoints_agree(tmp_path: Path) -> None:
    print(f"chaos seed {SEED} (STREAMREC_CHAOS_SEED)")
    schedule = Schedule(SEED, interval=(0.5, 3.0), wait_recovery=True)
    faults = run_and_judge(tmp_path, schedule, len(KINDS), SPLIT_INTERVAL)
    killed = {f.kind for f in faults if f.how == "kill"}
    assert killed == set(KINDS), f"the job ended before a kill of {set(KINDS) - killed}"
