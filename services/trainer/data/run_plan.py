"""Which passes a trainer run trains, and where it ends (``runner.end_day`` / ``end_split``).

A run ends at the end of end_day, at a given split of it (``end_split: "0025"``: the pass
holding it keeps only the splits up to it), or at the last split that has landed when the
run starts (``end_split: landed``: the splits in order from the first one to train, up to
the first one without its donefile, never past end_day). A bounded run then ends
``succeeded``, saying where it stopped, instead of waiting for splits that will not come.

A run that waits for a pass's donefiles longer than ``data_wait_timeout_second`` fails that
pass as bad data (:func:`data_wait_failed`: a :class:`BadSplits` naming the pass, the splits
still missing and the donefile); :class:`DataWait` keeps that time for a trainer that waits
poll by poll (the control plane's agent, idle while the API waits for the pass to land).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from streamrec import layout
from streamrec.control.reports import ErrorClass
from streamrec.control.trainer_config import END_LANDED, RunnerConfig
from streamrec.trainer.errors import BadSplits


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


def data_wait_failed(
    runner: RunnerConfig, data_root: str | Path, spec: layout.PassSpec, waited_s: float
) -> BadSplits:
    """The error of a pass whose donefiles did not all land within
    ``data_wait_timeout_second``: a data error (``bad_splits``: the splits missing) naming the
    pass, those splits and the donefile."""
    missing = layout.missing_splits(data_root, spec, runner.data_donefile) or list(spec.splits)
    done = runner.data_donefile
    what = f"no donefile {done!r}" if done else "no split directory (data_donefile: null)"
    return BadSplits(
        f"pass {spec.day}/{spec.pass_id}: split(s) "
        f"{', '.join(f'{spec.day}/{s}' for s in missing)} have {what} under {data_root} after "
        f"{waited_s:.1f} s of waiting (data_wait_timeout_second="
        f"{runner.data_wait_timeout_second:g}); the run does not train past a split that has "
        f"not landed (land it, then start again; or set runner.end_split: landed)",
        ErrorClass.DATA,
        bad_splits=tuple(missing),
    )


class DataWait:
    """How long a trainer has waited for its next pass's donefiles, poll by poll.

    :meth:`check` is called at each poll while the trainer waits for work: it raises the
    :func:`data_wait_failed` error once the same pass has not been ready for longer than
    ``data_wait_timeout_second`` (None: never). The time counts from the first poll that
    found that pass not ready; a pass found ready, another pass, or ``None`` (not waiting:
    the job paused) starts it afresh.

    Args:
        runner: the job's runner section (span, donefile, timeout).
        data_root: where its splits land.
        clock: seconds, monotonic (a test's own).
    """

    def __init__(
        self,
        runner: RunnerConfig,
        data_root: str | Path,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runner = runner
        self.data_root = Path(data_root)
        self.clock = clock
        self._next: tuple[tuple[str, int] | None, layout.PassSpec | None] | None = None
        #: (the pass waited for, since when)
        self.since: tuple[layout.PassSpec, float] | None = None

    def next_pass(self, after: tuple[str, int] | None) -> layout.PassSpec | None:
        """The pass after pass ``after`` (None: the first) in the run's span; None: none left."""
        if self._next is None or self._next[0] != after:
            passes = plan_run(self.runner, self.data_root, after).passes
            self._next = (after, passes[0] if passes else None)
        return self._next[1]

    def check(self, after: tuple[str, int] | None, waiting: bool = True) -> None:
        """One poll while waiting for the pass after ``after``; ``waiting`` False: the trainer
        does not wait for data now (the clock starts afresh).

        Raises:
            BadSplits: that pass has not been ready for longer than the timeout.
        """
        timeout = self.runner.data_wait_timeout_second
        spec = self.next_pass(after) if waiting and timeout is not None else None
        if spec is None or layout.pass_ready(self.data_root, spec, self.runner.data_donefile):
            self.since = None
            return
        now = self.clock()
        if self.since is None or self.since[0] != spec:
            self.since = (spec, now)
        waited = now - self.since[1]
        if timeout is not None and waited > timeout:
            self.since = None  # once a timeout: the next poll starts afresh
            raise data_wait_failed(self.runner, self.data_root, spec, waited)
