"""A job's lineage: which passes the model it goes on from contains.

A pass is ``done`` only while the model the job goes on from contains it. The job goes on
from its last checkpoint after any rewind (a start after stop or failure, a group that died,
a shard lost before a checkpoint), so the passes trained after that checkpoint are marked
``rolled_back`` (their record keeps its figures, ``passes_done`` no longer counts them) and
are handed out again, in order, from the checkpoint; an event names them. The trainer
marks the same passes in ``passes.jsonl`` when it loads the checkpoint, so REST, the file and
the events agree after every fault.

Here the plan and where the job goes on from in it; the records are written by
:class:`~streamrec.api.pass_records.PassRecords` (``rewind_for_start``, ``rewind_to_group``,
``requeue``).
"""

from __future__ import annotations

from streamrec.api.models import JobCreate
from streamrec.control import keys
from streamrec.layout import PassSpec, iter_passes


def job_plan(spec: JobCreate) -> list[PassSpec]:
    """Every pass of the job, in training order."""
    d = spec.data
    return list(
        iter_passes(d.start_day, d.end_day, d.split_interval, d.split_per_pass, d.end_split)
    )


def resume_cursor(plan: list[PassSpec], checkpoint: str | None, limit: int | None = None) -> int:
    """The plan index the job goes on from after ``checkpoint`` (0 with none), at most
    ``limit``."""
    index = {keys.pass_key(p.day, p.pass_id): i for i, p in enumerate(plan)}
    cursor = index[checkpoint] + 1 if checkpoint and checkpoint in index else 0
    return cursor if limit is None else min(cursor, limit)
