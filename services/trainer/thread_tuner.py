"""``threads_per_rank: auto``: the rank's torch intra-op thread count, chosen by timing steps.

How many threads a CPU step should use depends on more than the machine: a big batch's
gemms (setup b: batch 2048) run 1.6x faster on 2 threads than on 1, while a small batch's
(setup a: batch 128) gain 10% and pay an OpenMP wake-up per op when the rank shares its
cores with a store shard or the pipeline's own threads. Measured end to end on 2 cores with a
store shard beside the trainer (BENCHMARKS.md): setup a 24,700 samples/s on 2 threads and
34,500 on 1; setup b 40,800 on 2 and 32,900 on 1. So the rank times both, once, on its own
training steps:

    steps 1..warmup           torch's default threads, not timed (allocations, caches)
    next ``window`` steps     the default threads, each step's wall time recorded
    next ``window`` steps     1 thread
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
        window: steps timed per candidate.
        clock: seconds (monotonic); tests pass their own.
    """

    def __init__(
        self, warmup: int = 10, window: int = 20, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.default = torch.get_num_threads()
        self.candidates = [self.default, 1] if self.default > 1 else []
        self.warmup, self.window = warmup, window
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
        """Records the step that just ended; switches candidates at window boundaries."""
        if self.done:
            return
        now = self._clock()
        self._steps += 1
        if self._steps > self.warmup and self._last is not None:
            trial = (self._steps - self.warmup - 1) // self.window
            if trial < len(self.candidates):
                self._times[self.candidates[trial]].append(now - self._last)
            if self._steps - self.warmup == (trial + 1) * self.window:
                self._next(trial + 1)
        self._last = now

    def _next(self, trial: int) -> None:
        if trial < len(self.candidates):
            torch.set_num_threads(self.candidates[trial])
            return
        medians = {c: statistics.median(t) for c, t in self._times.items()}
        self.chosen = min(medians, key=lambda c: medians[c])
        torch.set_num_threads(self.chosen)
        log.info(
            "threads_per_rank auto: %d thread(s) (median step %s)",
            self.chosen,
            ", ".join(f"{c} thread(s) {m * 1e3:.2f} ms" for c, m in medians.items()),
        )
