"""``threads_per_rank: auto``: the rank's torch intra-op thread count, chosen by timing steps.

How many threads a CPU step should use depends on more than the machine: a big batch's
gemms (setup b: batch 2048) run 1.6x faster on 2 threads than on 1, while a small batch's
(setup a: batch 128) gain 10% and pay an OpenMP wake-up per op when the rank shares its
cores with a store shard or the pipeline's own threads. Measured end to end on 2 cores with a
store shard beside the trainer (BENCHMARKS.md): setup a 24,700 samples/s on 2 threads and
34,500 on 1; setup b 40,800 on 2 and 32,900 on 1. So the rank times both, once, on its own
training steps:

    steps 1..warmup           torch's default threads, not timed (allocations, caches)
    next 2 * ``window`` steps the default threads and 1 thread in turn, ``turn`` steps at a
                              time, each step's wall time recorded (taken in turns, a change
                              of the machine's load meanwhile, a neighbour's build, slows
                              both counts alike instead of deciding for one)
    then                      the faster (lower median step time) for the rest of the run

Nothing is tried when the default is already 1 thread. The wall time of a step is the time
between two consecutive step ends, so whatever the thread count costs the other threads
(parse, pull, push, a shard on the same cores) shows in it.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)


class ThreadTuner:
    """Call :meth:`step_done` after every training step; it sets the thread count.

    Args:
        warmup: steps run before timing starts.
        window: steps timed per candidate (a multiple of ``turn``).
        turn: steps a candidate runs before the other takes over.
        clock: seconds (monotonic); tests pass their own.
    """

    def __init__(
        self,
        warmup: int = 10,
        window: int = 20,
        turn: int = 5,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if turn < 1 or window % turn:
            raise ValueError(f"window {window} must be a multiple of turn {turn} >= 1")
        self.default = torch.get_num_threads()
        self.candidates = [self.default, 1] if self.default > 1 else []
        self.warmup, self.window, self.turn = warmup, window, turn
        self._clock = clock
        self._steps = 0
        self._last: float | None = None
        self._times: dict[int, list[float]] = {c: [] for c in self.candidates}
        #: the thread count kept, once decided (None while trying, or nothing to try)
        self.chosen: int | None = None

    @property
    def done(self) -> bool:
        return self.chosen is not None or not self.candidates

    def step_done(self) -> None:
        """Records the step that just ended; hands over to the next candidate at the end
        of each turn, and decides after the last."""
        if self.done:
            return
        now = self._clock()
        self._steps += 1
        timed = self._steps - self.warmup  # 1-based among the timed steps
        if timed >= 1 and self._last is not None:
            turn = (timed - 1) // self.turn
            self._times[self.candidates[turn % len(self.candidates)]].append(now - self._last)
            if timed % self.turn == 0:
                self._next(turn + 1)
        self._last = now

    def _next(self, turn: int) -> None:
        if turn < len(self.candidates) * (self.window // self.turn):
            torch.set_num_threads(self.candidates[turn % len(self.candidates)])
            return
        medians = {c: statistics.median(t) for c, t in self._times.items()}
        self.chosen = min(medians, key=lambda c: medians[c])
        torch.set_num_threads(self.chosen)
        log.info(
            "threads_per_rank auto: %d thread(s) (median step %s)",
            self.chosen,
            ", ".join(f"{c} thread(s) {m * 1e3:.2f} ms" for c, m in medians.items()),
        )
