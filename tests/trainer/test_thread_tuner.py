"""``threads_per_rank: auto``: the thread count follows the faster timed window."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from pydantic import ValidationError
from streamrec import layout
from streamrec.control.trainer_config import TrainerConfig
from streamrec.trainer.runner import OnlineTrainer
from streamrec.trainer.thread_tuner import ThreadTuner
from trainer_helpers import small_config, write_stream


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def run_steps(
    tuner: ThreadTuner,
    ms_per_thread_count: dict[int, float],
    steps: int,
    load: Callable[[int], float] = lambda step: 1.0,
) -> list[int]:
    """Steps whose duration depends on the current thread count (times ``load(step)``, the
    machine's other work); the threads each ran with."""
    now = [0.0]
    tuner._clock = lambda: now[0]
    used = []
    for step in range(steps):
        used.append(torch.get_num_threads())
        now[0] += ms_per_thread_count[torch.get_num_threads()] * load(step) / 1e3
        tuner.step_done()
    return used


@pytest.mark.parametrize(("fast", "expected"), [(1, 1), (2, 2)])
def test_the_faster_thread_count_is_kept(two_threads, fast, expected):
    tuner = ThreadTuner(warmup=3, window=4, turn=2)
    times = {1: 5.0, 2: 9.0} if fast == 1 else {1: 9.0, 2: 5.0}
    used = run_steps(tuner, times, 20)
    # 3 warm-up steps on the default, then 2 steps each in turn, twice, then the choice
    assert used == [2] * 3 + [2] * 2 + [1] * 2 + [2] * 2 + [1] * 2 + [expected] * 9
    assert tuner.done and tuner.chosen == expected
    assert torch.get_num_threads() == expected


def test_a_neighbour_starting_midway_does_not_decide(two_threads):
    """The machine is 3x slower during the first half of the trial (another process runs,
    then ends). Timed one window after the other, the default's window would be all slow
    and 1 thread would win (15 ms against 8); taken in turns, both see the slow half alike
    and the default's advantage shows (5 ms against 8)."""
    tuner = ThreadTuner(warmup=2, window=8, turn=2)
    busy = range(2, 2 + 8)  # the first 8 of the 16 timed steps
    run_steps(tuner, {1: 8.0, 2: 5.0}, 30, load=lambda step: 3.0 if step in busy else 1.0)
    assert tuner.chosen == 2


def test_turns_must_divide_the_window():
    with pytest.raises(ValueError, match="window 10 must be a multiple of turn 4"):
        ThreadTuner(window=10, turn=4)


def test_nothing_is_tried_on_one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tuner = ThreadTuner(warmup=1, window=2, turn=1)
        assert tuner.done and tuner.chosen is None
        assert run_steps(tuner, {1: 1.0}, 6) == [1] * 6
    finally:
        torch.set_num_threads(before)


def test_config_takes_auto_or_a_positive_count(tmp_path):
    base = small_config(tmp_path, tmp_path / "m").model_dump(mode="json")
    for good in ("auto", 3, None):
        cfg = TrainerConfig.parse({**base, "resources": {"threads_per_rank": good}})
        assert cfg.resources.threads_per_rank == good
    for bad in (0, "fast"):
        with pytest.raises((ValidationError, ValueError), match="threads_per_rank"):
            TrainerConfig.parse({**base, "resources": {"threads_per_rank": bad}})


def test_a_trainer_with_auto_threads_tunes_during_its_first_pass(tmp_path, two_threads):
    stream = write_stream(tmp_path / "data", days=1, samples=8000)
    cfg = small_config(stream, tmp_path / "m", checkpoint_per_pass=0)
    cfg = TrainerConfig.parse(
        {**cfg.model_dump(mode="json"), "resources": {"threads_per_rank": "auto"}}
    )
    spec = next(layout.iter_passes("20190720", "20190720", 720, 1))
    with OnlineTrainer(cfg) as t:
        assert t.thread_tuner is not None and not t.thread_tuner.done
        record = t.run_pass(spec)  # more steps than the 10 + 2 x 20 the tuner takes
        assert t.thread_tuner.done and t.thread_tuner.chosen in (1, 2)
        assert record["intra_op_threads"] == t.thread_tuner.chosen == torch.get_num_threads()
