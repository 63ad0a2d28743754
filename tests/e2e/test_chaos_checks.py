"""The chaos verdict (:mod:`chaos_checks`) on a model directory written here: it passes a job
whose sources agree and fails each disagreement a chaos run can leave, the soak's first (a
group restarted from an older checkpoint while REST kept the passes after it ``done``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos_checks import agreement
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
