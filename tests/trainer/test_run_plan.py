"""Bounded runs: where a run ends (end_day, end_split HHMM, "landed") and what it trains."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamrec import layout
from streamrec.control.trainer_config import RunnerConfig, TrainerConfig
from streamrec.datagen.split_files import mark_split_done
from streamrec.errors import BadRequest
from streamrec.trainer.data.run_plan import plan_run


def runner(**kw) -> RunnerConfig:
    base = {"split_interval": 360, "split_per_pass": 3, "start_day": "20190720"}
    return RunnerConfig.model_validate({**base, **kw})


def land(root: Path, day: str, *splits: str) -> None:
    for s in splits:
        d = root / day / s
        d.mkdir(parents=True)
        (d / "part-00000").write_text("")
        mark_split_done(d, "to.hadoop.done")


def test_end_split_cuts_the_last_pass_of_end_day():
    # 4 splits a day (0000 0600 1200 1800), 3 a pass: passes (0000 0600 1200), (1800)
    passes = list(layout.iter_passes("20190720", "20190721", 360, 3, "0600"))
    assert [(p.day, p.pass_id, p.splits) for p in passes] == [
        ("20190720", 1, ("0000", "0600", "1200")),
        ("20190720", 2, ("1800",)),
        ("20190721", 1, ("0000", "0600")),  # partial: the splits up to end_split
    ]
    assert layout.count_passes("20190720", "20190721", 360, 3, "0600") == 3
    for end in ("0000", "0600", "1200", "1800", None):
        for per in (1, 2, 3, 4, 5):
            listed = list(layout.iter_passes("20190720", "20190722", 360, per, end))
            assert layout.count_passes("20190720", "20190722", 360, per, end) == len(listed)
            assert listed[-1].splits[-1] == (end or "1800")


def test_end_split_not_a_split_is_refused_by_name():
    with pytest.raises(ValueError, match="end_split must be a split of the day"):
        list(layout.iter_passes("20190720", "20190720", 360, 1, "0005"))
    with pytest.raises(BadRequest, match="end_split '0005' is not a split of the day"):
        TrainerConfig.parse({"runner": {"split_interval": 360, "end_split": "0005"}})
    # YAML reads 0025 unquoted as the octal number 21: a number is refused, not guessed
    with pytest.raises(BadRequest, match="quoted HHMM string.*21"):
        TrainerConfig.parse({"runner": {"end_split": 21}})
    with pytest.raises(BadRequest, match="end_split must be HHMM"):
        TrainerConfig.parse({"runner": {"end_split": "last"}})


def test_plan_ends_at_end_day_or_end_split_after_the_warm_start():
    plan = plan_run(runner(end_day="20190721"), "/nonexistent", None)
    assert len(plan.passes) == 4 and plan.end == ("20190721", "1800")
    assert plan.describe() == "trained through split 20190721/1800 (end_day)"
    plan = plan_run(runner(end_day="20190721", end_split="1200"), "/x", ("20190720", 2))
    assert [(p.day, p.pass_id) for p in plan.passes] == [("20190721", 1)]
    assert plan.end == ("20190721", "1200") and plan.bound == "end_split 1200"
    done = plan_run(runner(end_day="20190721", end_split="1200"), "/x", ("20190721", 1))
    assert done.passes == [] and done.end is None and "nothing to train" in done.describe()


def test_landed_ends_at_the_last_split_before_the_first_missing_one(tmp_path):
    land(tmp_path, "20190720", "0000", "0600", "1200", "1800")
    land(tmp_path, "20190721", "0000")
    land(tmp_path, "20190721", "1200")  # after a gap: not reachable in order
    plan = plan_run(runner(end_day="20190725", end_split="landed"), tmp_path, None)
    assert plan.end == ("20190721", "0000") and plan.bound == "landed"
    assert [(p.day, p.pass_id, p.splits) for p in plan.passes] == [
        ("20190720", 1, ("0000", "0600", "1200")),
        ("20190720", 2, ("1800",)),
        ("20190721", 1, ("0000",)),
    ]
    # never past end_day
    plan = plan_run(runner(end_day="20190720", end_split="landed"), tmp_path, None)
    assert plan.end == ("20190720", "1800")
    # after a warm start at the last landed pass: nothing left
    plan = plan_run(runner(end_day="20190725", end_split="landed"), tmp_path, ("20190721", 1))
    assert plan.passes == [] and plan.end is None


def test_landed_with_nothing_landed_trains_nothing(tmp_path):
    plan = plan_run(runner(end_day="20190725", end_split="landed"), tmp_path, None)
    assert plan.passes == [] and plan.end is None and plan.bound == "landed"
