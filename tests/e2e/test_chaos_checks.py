"""The chaos verdict (:mod:`chaos_checks`) on a model directory written here: it passes a job
whose sources agree and fails each disagreement a chaos run can leave, the soak's first (a
group restarted from an older checkpoint while REST kept the passes after it ``done``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from chaos_checks import agreement, same_model
from streamrec.trainer.model.checkpoint_dirs import write_manifest

DAY = "20190720"
#: 6 passes a day (240-minute splits), a checkpoint every 3.
SPEC = {
    "data": {"start_day": DAY, "end_day": DAY, "split_interval": 240, "split_per_pass": 1},
    "checkpoint": {"checkpoint_per_pass": 3},
}


def record(pass_id: int, after: int | None, step: int, **more: Any) -> dict[str, Any]:
    return {
        "day": DAY,
        "pass_id": pass_id,
        "after": f"{DAY}/{after}" if after else None,
        "step": step,
        **more,
    }


def write_job(model: Path, records: list[dict[str, Any]], checkpoints: dict[int, int]) -> None:
    """``passes.jsonl`` and a complete checkpoint per ``pass_id -> step``."""
    model.mkdir(parents=True, exist_ok=True)
    (model / "passes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for pass_id, step in checkpoints.items():
        directory = model / DAY / str(pass_id)
        directory.mkdir(parents=True)
        (directory / "dense.pt").write_bytes(b"dense")
        write_manifest(directory, {"day": DAY, "pass_id": pass_id, "step": step})


def rest(states: dict[int, str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The REST job and pass list: pass ``i`` in ``states[i]``."""
    passes = [
        {"day": DAY, "pass_id": i, "state": s, "attempts": 1, "predict_auc": 0.7}
        for i, s in states.items()
    ]
    job = {
        "id": "j",
        "state": "succeeded",
        "spec": SPEC,
        "passes_done": sum(s == "done" for s in states.values()),
        "last_checkpoint": f"{DAY}/6",
    }
    return job, passes


def problems(tmp_path: Path, records: list[dict[str, Any]], events: list | None = None) -> str:
    write_job(tmp_path, records, {3: 3, 6: 6})
    job, passes = rest(dict.fromkeys(range(1, 7), "done"))
    verdict = agreement(job, passes, events or [], tmp_path)
    return "\n".join(verdict.report())


def test_sources_that_agree_pass(tmp_path: Path) -> None:
    records = [record(i, i - 1 or None, i) for i in range(1, 7)]
    write_job(tmp_path, records, {3: 3, 6: 6})
    job, passes = rest(dict.fromkeys(range(1, 7), "done"))
    verdict = agreement(job, passes, [], tmp_path, baseline=records)
    assert verdict.ok, "\n".join(verdict.report())
    assert len(verdict.rows) == 6


def test_a_pass_trained_on_an_older_checkpoint_fails(tmp_path: Path) -> None:
    # the soak's failure: rank killed after pass 5's report; the new group loaded checkpoint
    # 3 and trained 6 on it, while REST (and passes.jsonl) kept 4 and 5
    records = [record(i, i - 1 or None, i) for i in range(1, 6)] + [record(6, 3, 4)]
    text = problems(tmp_path, records)
    assert "trained after 20190720/3, not after 20190720/5" in text
    assert "step 4 not after the previous pass's 5" in text
    assert "agreement: 5/6 passes agree" in text


def test_a_pass_done_in_rest_but_rolled_back_in_the_model_fails(tmp_path: Path) -> None:
    # what test_chaos saw before the fix: the new group loaded checkpoint 3, marked 4 rolled
    # back in passes.jsonl and trained 5 on it; REST kept 4 done, no rollback event
    records = [record(i, i - 1 or None, i) for i in range(1, 4)]
    records += [record(4, 3, 4, rolled_back=True), record(5, 3, 4), record(6, 5, 5)]
    write_job(tmp_path, records, {3: 3, 6: 5})
    job, passes = rest(dict.fromkeys(range(1, 7), "done"))
    clean = [record(i, i - 1 or None, i) for i in range(1, 7)]
    verdict = agreement(job, passes, [], tmp_path, baseline=clean)
    text = "\n".join(verdict.report())
    assert "done in REST, not in passes.jsonl" in text
    assert "rolled back in passes.jsonl, no REST rollback event names it" in text
    assert "trained after 20190720/3, not after 20190720/4" in text
    assert "the model is at step 4 after it, 5 without faults" in text
    assert "agreement: 3/6 passes agree" in text


def test_without_after_the_steps_against_a_no_fault_run_still_catch_it(tmp_path: Path) -> None:
    broken = [record(i, None, i) for i in range(1, 6)] + [record(6, None, 5)]
    for r in broken:
        del r["after"]
    write_job(tmp_path, broken, {3: 3, 6: 5})
    job, passes = rest(dict.fromkeys(range(1, 7), "done"))
    clean = [record(i, i - 1 or None, 2 * i) for i in range(1, 7)]  # 2 steps a pass here
    verdict = agreement(job, passes, [], tmp_path, baseline=clean)
    assert not verdict.ok
    text = "\n".join(verdict.report())
    assert "records carry no `after`" in text
    assert "the model is at step 5 after it, 12 without faults" in text


def test_rest_and_passes_jsonl_disagreeing_fail(tmp_path: Path) -> None:
    records = [record(i, i - 1 or None, i) for i in range(1, 7)]
    records[4]["rolled_back"] = True  # pass 5 rolled back in the file, no REST event says so
    text = problems(tmp_path, records)
    assert "20190720/5" in text and "0 kept lines in passes.jsonl" in text
    assert "rolled back in passes.jsonl, no REST rollback event names it" in text
    assert "done in REST, not in passes.jsonl" in text


def test_a_checkpoint_of_another_training_or_missing_fails(tmp_path: Path) -> None:
    records = [record(i, i - 1 or None, i) for i in range(1, 7)]
    write_job(tmp_path, records, {3: 7})  # 6 is missing; 3's manifest from another training
    job, passes = rest(dict.fromkeys(range(1, 7), "done"))
    text = "\n".join(agreement(job, passes, [], tmp_path).report())
    assert "manifest step 7 but passes.jsonl step 3" in text
    assert "no checkpoint directory where one is due" in text
    assert "last_checkpoint 20190720/6 is not a complete checkpoint" in text


def write_model(model: Path, rows: dict[int, np.ndarray], weight: float = 1.0) -> None:
    """A checkpoint after pass 3 and one after pass 6: a dense state and one shard's table
    ``slot_0`` whose rows are ``rows[pass_id]`` (keys 10, 11, 12 saved in reverse order)."""
    for pass_id, table in rows.items():
        directory = model / DAY / str(pass_id)
        shard = directory / "sparse" / "shard-0-of-1"
        shard.mkdir(parents=True)
        np.save(shard / "slot_0.keys.npy", np.array([12, 11, 10], dtype=np.int64))
        np.save(shard / "slot_0.rows.npy", table[::-1].copy())
        (shard / "MANIFEST.json").write_text("{}")
        state = {
            "model": {"w": torch.full((2,), weight * pass_id)},
            "optimizer": {"state": {0: {"sum": torch.ones(2)}}, "param_groups": []},
            "scheduler": {"last_epoch": pass_id},
            "trainer": {"day": DAY, "pass_id": pass_id, "step": pass_id},
        }
        torch.save(state, directory / "dense.pt")
        write_manifest(directory, {"day": DAY, "pass_id": pass_id, "step": pass_id})


def table(flags: float, g2sum: float) -> np.ndarray:
    """3 rows of [show, click, unseen, flags, w, g2sum]."""
    return np.array([[5.0, 1.0, 0.0, flags, 0.25, g2sum]] * 3, dtype=np.float32)


def test_same_model_takes_the_rows_key_by_key_and_leaves_the_saves_dirty_bit_aside(tmp_path):
    # an export cleared the dirty bit (2) in one run only: the same training state
    write_model(tmp_path / "a", {3: table(3.0, 0.5), 6: table(3.0, 0.75)})
    write_model(tmp_path / "b", {3: table(1.0, 0.5), 6: table(3.0, 0.75)})
    match = same_model(tmp_path / "a", tmp_path / "b")
    assert (match.compared, match.equal, match.first_difference) == (2, 2, None)
    assert match.line() == "model: 2/2 checkpoints the no-fault run's bit for bit"


def test_same_model_names_the_first_checkpoint_and_the_part_that_differ(tmp_path):
    write_model(tmp_path / "a", {3: table(3.0, 0.5), 6: table(3.0, 0.75)})
    # the expanded bit (1) and an AdaGrad sum one ulp apart at pass 6; the dense state too
    g2 = float(np.nextafter(np.float32(0.75), np.float32(1)))
    write_model(tmp_path / "b", {3: table(3.0, 0.5), 6: table(2.0, g2)}, weight=1.0)
    write_model(tmp_path / "c", {3: table(3.0, 0.5), 6: table(3.0, 0.75)}, weight=1.5)
    rows = same_model(tmp_path / "a", tmp_path / "b")
    assert (rows.compared, rows.equal) == (2, 1)
    assert rows.first_difference == "first difference at 20190720/6: shard-0-of-1/slot_0"
    dense = same_model(tmp_path / "a", tmp_path / "c")
    assert dense.first_difference == "first difference at 20190720/3: dense.pt"
    assert dense.line().startswith("model: 0/2 checkpoints the no-fault run's bit for bit; ")


def test_same_model_tool_says_it_and_exits_by_it(tmp_path):
    tool = Path(__file__).resolve().parents[2] / "tools" / "same_model.py"
    write_model(tmp_path / "a", {3: table(3.0, 0.5), 6: table(3.0, 0.75)})
    write_model(tmp_path / "b", {3: table(1.0, 0.5), 6: table(3.0, 0.75)})
    write_model(tmp_path / "c", {3: table(3.0, 0.5), 6: table(3.0, 0.5)})

    def run(*args: Path) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(tool), *map(str, args)]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    same, other, bad = (
        run(tmp_path / "a", tmp_path / "b"),
        run(tmp_path / "a", tmp_path / "c"),
        run(tmp_path / "a", tmp_path / "none"),
    )
    assert same.returncode == 0, same.stderr
    assert same.stdout.splitlines()[-1] == "model: 2/2 checkpoints the no-fault run's bit for bit"
    assert other.returncode == 1, other.stderr
    assert other.stdout.splitlines()[-1].endswith(
        "first difference at 20190720/6: shard-0-of-1/slot_0"
    )
    assert bad.returncode == 2 and "none is not a directory" in bad.stderr
