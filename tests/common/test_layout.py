import threading

import pytest
from streamrec import layout


def test_pass_formation_per_day():
    passes = list(layout.iter_passes("20190720", "20190721", split_interval=360, split_per_pass=3))
    # 4 splits a day (0000, 0600, 1200, 1800) -> passes of 3 and 1, pass ids from 1 each day
    assert [(p.day, p.pass_id, p.splits) for p in passes] == [
        ("20190720", 1, ("0000", "0600", "1200")),
        ("20190720", 2, ("1800",)),
        ("20190721", 1, ("0000", "0600", "1200")),
        ("20190721", 2, ("1800",)),
    ]
    assert passes[1].is_last_of_day(360, 3) and not passes[0].is_last_of_day(360, 3)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"start_day": "2019072", "end_day": "20190720"}, "YYYYMMDD"),
        ({"start_day": "20190721", "end_day": "20190720"}, "before"),
        ({"split_interval": 7}, "divide 1440"),
        ({"split_per_pass": 0}, "split_per_pass"),
    ],
)
def test_bad_layout_arguments(kwargs, match):
    args = {
        "start_day": "20190720",
        "end_day": "20190720",
        "split_interval": 60,
        "split_per_pass": 1,
    } | kwargs
    with pytest.raises(ValueError, match=match):
        list(layout.iter_passes(**args))
    with pytest.raises(ValueError, match=match):
        layout.count_passes(**args)


@pytest.mark.parametrize(
    "start,end,interval,per_pass",
    [
        ("20190720", "20190720", 1440, 1),
        ("20190720", "20190721", 360, 3),
        ("20190228", "20190301", 5, 7),  # 288 splits, 7 a pass: a short last pass
        ("20200228", "20200301", 1, 1440),  # a leap day in the span
        ("20191231", "20200101", 60, 25),  # more splits a pass than a day holds
    ],
)
def test_count_passes_is_the_length_of_iter_passes(start, end, interval, per_pass):
    listed = list(layout.iter_passes(start, end, interval, per_pass))
    assert layout.count_passes(start, end, interval, per_pass) == len(listed)
    assert layout.day_count(start, end) == len({p.day for p in listed})


def test_count_passes_of_two_centuries_is_computed_not_listed():
    # 73,049 days x 1,440 passes: listing them took ~50 s; computing is instant
    assert layout.count_passes("19000101", "20991231", 1, 1) == 73_049 * 1440


def test_donefile_readiness_and_wait(tmp_path):
    spec = next(layout.iter_passes("20190720", "20190720", 720, 2))
    assert not layout.pass_ready(tmp_path, spec, "done")
    for d in spec.split_dirs(tmp_path):
        d.mkdir(parents=True)
        (d / "part-0").write_text("x")
    assert not layout.pass_ready(tmp_path, spec, "done")  # data without donefile: not ready
    assert not layout.wait_for_pass(tmp_path, spec, "done", 0.01, timeout_s=0.05)
    timer = threading.Timer(0.1, lambda: [(d / "done").touch() for d in spec.split_dirs(tmp_path)])
    timer.start()
    assert layout.wait_for_pass(tmp_path, spec, "done", 0.02, timeout_s=5)
    assert [p.name for p in layout.pass_files(tmp_path, spec, "done")] == ["part-0", "part-0"]


def test_newest_complete_checkpoint_skips_half_written(tmp_path):
    for day, pid, complete in [
        ("20190720", 2, True),
        ("20190720", 10, True),
        ("20190721", 1, False),
    ]:
        d = layout.checkpoint_dir(tmp_path, day, pid)
        d.mkdir(parents=True)
        if complete:
            (d / layout.MANIFEST_NAME).write_text("{}")
    assert layout.newest_checkpoint(tmp_path)[:2] == ("20190720", 10)
