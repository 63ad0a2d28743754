"""What rank 0 shares with its group at each step of a job: one unit of work as two int64
tensors (a header and the split names as HHMM integers), never pickled.

    header: op, day, pass_id, attempt, n_splits, mode, load day, load pass, skip bit mask
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from streamrec import layout
from streamrec.control.channel import Command, CommandType, WorkItem
from streamrec.control.trainer_config import OnlineMode
from streamrec.save_modes import SAVE_MODES
from streamrec.trainer import distributed as ddp

# Step opcodes broadcast from rank 0 (header[0]).
IDLE, PASS, CHECKPOINT, EXPORT, SHRINK, STOP, EXIT = range(7)
#: The step a command asks for.
COMMAND_OPS = {
    CommandType.CHECKPOINT: CHECKPOINT,
    CommandType.EXPORT: EXPORT,
    CommandType.SHRINK: SHRINK,
    CommandType.STOP: STOP,
}
#: Export mode <-> header[5]: 0 none, then 1 + its index in SAVE_MODES, then online.
MODES: dict[str | None, int] = {
    None: 0,
    **{m: i + 1 for i, m in enumerate((*SAVE_MODES, OnlineMode.ONLINE.value))},
}
MODE_NAMES = {v: k for k, v in MODES.items()}
#: op, day, pass_id, attempt, n_splits, mode, load day, load pass (0: none), skip bit mask
HEADER = 9
#: ``Step.load`` of a step that starts the job afresh (no checkpoint to go back to).
FRESH = ("fresh", 0)
#: header[6] (load day) of FRESH.
FRESH_DAY = -1
#: ``Step.load`` of a pass the model cannot go on to: it lacks passes the job counts done
#: and no checkpoint holds them (the group that trained them is gone, a shard with them
#: restarted): the pass fails ``store_lost`` and the API takes the job back to its start.
LOST = ("lost", 0)
#: header[6] (load day) of LOST.
LOST_DAY = -2
#: The special loads by their header value.
_SPECIAL_LOADS = {FRESH_DAY: FRESH, LOST_DAY: LOST}


@dataclass
class Step:
    """One unit of work, the same on every rank once broadcast."""

    op: int
    spec: layout.PassSpec | None = None
    attempt: int = 1
    mode: str | None = None
    #: The checkpoint (day, pass_id) to load before the pass; None: go on in memory.
    load: tuple[str, int] | None = None
    #: Splits of ``spec`` left out (the job's on_bad_split: skip).
    skip: tuple[str, ...] = ()
    item: WorkItem | None = None  # rank 0 only: what to ack
    command: Command | None = None  # rank 0 only: which trigger to report and ack


def encode(step: Step) -> tuple[torch.Tensor, torch.Tensor]:
    """Header ``(9,) int64`` and splits ``(n,) int64`` (HHMM as integers)."""
    spec = step.spec
    splits = [int(s) for s in spec.splits] if spec else []
    skip = sum(1 << i for i, s in enumerate(spec.splits) if s in step.skip) if spec else 0
    header = torch.tensor(
        [
            step.op,
            int(spec.day) if spec else 0,
            spec.pass_id if spec else 0,
            step.attempt,
            len(splits),
            MODES[step.mode],
            _load_day(step.load),
            step.load[1] if step.load else 0,
            skip,
        ],
        dtype=torch.int64,
    )
    return header, torch.tensor(splits, dtype=torch.int64)


def _load_day(load: tuple[str, int] | None) -> int:
    """header[6]: the checkpoint's day, a special load's code, 0 for none."""
    codes = {v: k for k, v in _SPECIAL_LOADS.items()}
    return codes[load] if load in codes else int(load[0]) if load else 0


def decode(header: torch.Tensor, splits: torch.Tensor) -> Step:
    op, day, pass_id, attempt, _n, mode, load_day, load_pass, skip = (
        int(v) for v in header.tolist()
    )
    spec = None
    skipped: tuple[str, ...] = ()
    if op == PASS:
        spec = layout.PassSpec(f"{day:08d}", pass_id, tuple(f"{s:04d}" for s in splits.tolist()))
        skipped = tuple(s for i, s in enumerate(spec.splits) if skip >> i & 1)
    load = _SPECIAL_LOADS.get(load_day) or ((f"{load_day:08d}", load_pass) if load_day else None)
    return Step(op, spec, attempt, MODE_NAMES[mode], load, skipped)


def broadcast_step(step: Step | None, rank: int) -> Step:
    """Rank 0's step to every rank (tensors only); identity when not distributed."""
    if not ddp.active():
        assert step is not None
        return step
    if rank == 0:
        assert step is not None
        header, splits = encode(step)
    else:
        header = torch.zeros(HEADER, dtype=torch.int64)
    dist.broadcast(header, 0)
    if rank != 0:
        splits = torch.zeros(int(header[4]), dtype=torch.int64)
    if int(header[4]):
        dist.broadcast(splits, 0)
    return step if rank == 0 else decode(header, splits)  # type: ignore[return-value]
