"""Which passes a trainer run trains, and where it ends (``runner.end_day`` / ``end_split``).

A run ends at the end of end_day, at a given split of it (``end_split: "0025"``: the pass
holding it keeps only the splits up to it), or at the last split that has landed when the
run starts (``end_split: landed``: the splits in order from the first one to train, up to
the first one without its donefile, never past end_day). A bounded run then ends
``succeeded``, saying where it stopped, instead of waiting for splits that will not come.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from streamrec import layout
from streamrec.control.trainer_config import END_LANDED, RunnerConfig


@dataclass(frozen=True)
class RunPlan:
    """The passes left to train and where the run stops.

    Attributes:
        passes: in training order, after the pass the model is at (warm start).
        end: (day, HHMM) of the last split the run trains; None when nothing is left.
        bound: what set the end: "end_day", "end_split HHMM" or "landed".
    """

    passes: list[layout.PassSpec]
    end: tuple[str, str] | None
    bound: str

    def describe(self) -> str:
        """One line: where the run stops and why."""
        if self.end is None:
            return f"nothing to train ({self.bound}: no split left to train)"
        return f"trained through split {self.end[0]}/{self.end[1]} ({self.bound})"


def plan_run(runner: RunnerConfig, data_root: str | Path, after: tuple[str, int] | None) -> RunPlan:
    """The passes of ``runner``'s span after pass ``after`` (None: from the start), bounded
    as its ``end_split`` says; "landed" looks at ``data_root`` now, once."""
    r = runner
    fixed = None if r.end_split == END_LANDED else r.end_split
    specs = [
        s
        for s in layout.iter_passes(
            r.start_day, r.end_day, r.split_interval, r.split_per_pass, fixed
        )
        if after is None or (s.day, s.pass_id) > after
    ]
    if r.end_split == END_LANDED:
        end = layout.landed_end(data_root, specs, r.data_donefile)
        if end is None:
            return RunPlan([], None, "landed")
        specs = list(_cut(specs, end))
        return RunPlan(specs, end, "landed")
    if not specs:
        return RunPlan([], None, f"end_split {fixed}" if fixed else "end_day")
    last = specs[-1]
    return RunPlan(specs, (last.day, last.splits[-1]), f"end_split {fixed}" if fixed else "end_day")


def _cut(specs: list[layout.PassSpec], end: tuple[str, str]) -> list[layout.PassSpec]:
    """``specs`` up to the split ``end``; the pass holding it keeps the splits up to it."""
    out = []
    for s in specs:
        if s.day == end[0] and end[1] in s.splits:
            out.append(layout.PassSpec(s.day, s.pass_id, s.splits[: s.splits.index(end[1]) + 1]))
            return out
        out.append(s)
    return out
