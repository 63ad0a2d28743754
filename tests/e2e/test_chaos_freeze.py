"""Gray failures on a real `streamrec up --keep-running` stack: a job over REST with
``checkpoint_per_pass`` 3 while every kind of service (a trainer rank, the whole torchrun
group, a store shard, Redis, the API, the sampler) is frozen in turn, in a seeded random
order: SIGSTOP for longer than the API's heartbeat TTL (10 s), then SIGCONT. No socket closes
and no process exits: the silent peer must be noticed or waited for, and nothing it does
when it wakes may break the lineage or change the model (the model must equal the no-fault
job's bit for bit). Then a double fault (two kinds within a second). Each
next fault once a pass handed out after the last thaw is done; then the verdict of
:mod:`chaos_checks`, as in ``test_chaos.py`` (its own file: the two run side by side).

The seed is printed; ``STREAMREC_CHAOS_SEED`` runs another (``tools/chaos.py
--freeze-share --double-share``: the same for as long as asked).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from chaos_harness import KINDS, Schedule, run_and_judge

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("STREAMREC_CHAOS_SEED", "30"))
#: 60 passes: the freezes stall most of them (a frozen API hands nothing out).
SPLIT_INTERVAL = 24


@pytest.mark.timeout(290)
def test_chaos_every_kind_frozen_and_a_double_fault_rest_passes_jsonl_and_checkpoints_agree(
    tmp_path: Path,
) -> None:
    print(f"chaos seed {SEED} (STREAMREC_CHAOS_SEED)")
    schedule = Schedule(
        SEED,
        interval=(0.5, 2.0),
        wait_recovery=True,
        freeze_s=(10.5, 11.5),
        first=("freeze",),
        doubles_first=1,
    )
    faults = run_and_judge(tmp_path, schedule, len(KINDS) + 1, SPLIT_INTERVAL)
    frozen = {f.kind for f in faults if f.how == "freeze"}
    assert frozen == set(KINDS), f"the job ended before a freeze of {set(KINDS) - frozen}"
    pairs = [(a, b) for a, b in zip(faults, faults[1:], strict=False) if b.at - a.at < 1.0]
    assert any(a.kind != b.kind for a, b in pairs), "no double fault was made"
