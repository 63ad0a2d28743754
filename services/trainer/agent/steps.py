"""What rank 0 shares with its group at each step of a job: one unit of work as two int64
tensors (a header and the split names as HHMM integers), never pickled.

    header: op, day, pass_id, attempt, n_splits, mode, load day, load pass, skip bit mask
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch
import torch.distributed as dist
from streamrec import layout
from streamrec.control.channel import Command, CommandType, WorkItem
from streamrec.control.trainer_config import OnlineMode
from streamrec.save_modes import SAVE_MODES
from streamrec.trainer import distributed as ddp


class Op(IntEnum):
    """A step's opcode, broadcast from rank 0 (header[0])."""

    #: nothing to do: wait for work
    IDLE = 0
    #: train the pass (``Step.spec``)
    PASS = 1
    CHECKPOINT = 2
    #: export the model (``Step.mode``)
    EXPORT = 3
    SHRINK = 4
    #: the job is stopping: leave it
    STOP = 5
    #: the group ends
    EXIT = 6


class SpecialLoad(IntEnum):
    """A ``Step.load`` that names no checkpoint; the value is its header[6] (load day)."""

    #: the job starts afresh (no checkpoint to go back to)
    FRESH = -1
    #: the model cannot go on to the pass: it lacks passes the job counts done and no
    #: checkpoint holds them (the group that trained them is gone, a shard with them
    #: restarted): the pass fails ``store_lost`` and the API takes the job back to its start
    LOST = -2


#: The step a command asks for.
COMMAND_OPS = {
    CommandType.CHECKPOINT: Op.CHECKPOINT,
    CommandType.EXPORT: Op.EXPORT,
    CommandType.SHRINK: Op.SHRINK,
    CommandType.STOP: Op.STOP,
}
#: Export mode <-> header[5]: 0 none, then 1 + its index in SAVE_MODES, then online.
MODES: dict[str | None, int] = {
    None: 0,
    **{m: i + 1 for i, m in enumerate((*SAVE_MODES, OnlineMode.ONLINE.value))},
}
MODE_NAMES = {v: k for k, v in MODES.items()}
#: op, day, pass_id, attempt, n_splits, mode, load day, load pass (0: none), skip bit mask
HEADER = 9


@dataclass
class Step:
    """One unit of work, the same on every rank once broadcast."""

    op: Op
    spec: layout.PassSpec | None = None
    attempt: int = 1
    mode: str | None = None
    #: The checkpoint (day, pass_id) to load before the pass, or a special load; None: go
    #: on in memory.
    load: tuple[str, int] | SpecialLoad | None = None
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
            step.load[1] if isinstance(step.load, tuple) else 0,
            skip,
        ],
        dtype=torch.int64,
    )
    return header, torch.tensor(splits, dtype=torch.int64)


def _load_day(load: tuple[str, int] | SpecialLoad | None) -> int:
    """header[6]: the checkpoint's day, a special load's value, 0 for none."""
    if isinstance(load, SpecialLoad):
        return int(load)
    return int(load[0]) if load else 0


def decode(header: torch.Tensor, splits: torch.Tensor) -> Step:
    op, day, pass_id, attempt, _n, mode, load_day, load_pass, skip = (
        int(v) for v in header.tolist()
    )
    spec = None
    skipped: tuple[str, ...] = ()
    if op == Op.PASS:
        spec = layout.PassSpec(f"{day:08d}", pass_id, tuple(f"{s:04d}" for s in splits.tolist()))
        skipped = tuple(s for i, s in enumerate(spec.splits) if skip >> i & 1)
    load: tuple[str, int] | SpecialLoad | None = None
    if load_day < 0:
        load = SpecialLoad(load_day)
    elif load_day:
        load = (f"{load_day:08d}", load_pass)
    return Step(Op(op), spec, attempt, MODE_NAMES[mode], load, skipped)


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
