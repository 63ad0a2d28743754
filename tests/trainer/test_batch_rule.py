"""The automatic batch: a pass's batch follows its rows (about 64 steps a rank, a power of
two in 32..2048); a user's explicit batch always wins."""

from __future__ import annotations

import json

import pytest
from streamrec.trainer.batch_rule import FIRST_BATCH, MAX_BATCH, MIN_BATCH, auto_batch_size
from streamrec.trainer.runner import OnlineTrainer
from test_dense_norm import DAYS, only_schema, write_stream


@pytest.mark.parametrize(
    "rows,batch",
    [
        (None, FIRST_BATCH),
        (0, FIRST_BATCH),
        (1, MIN_BATCH),
        (470, MIN_BATCH),  # a MovieLens day: 15 steps, not 2 at 256
        (64 * 100, 64),
        (20_000, 256),  # the planted stream's split: 78 steps
        (64 * 1024, 1024),
        (50_000_000, MAX_BATCH),
    ],
)
def test_the_rule(rows, batch):
    assert auto_batch_size(rows) == batch


@pytest.mark.parametrize("predict", [True, False])
def test_a_small_pass_gets_many_steps_and_an_explicit_batch_wins(tmp_path, predict):
    data = tmp_path / "data"
    write_stream(data, 1.0, n=700)  # 700 rows a pass: 700 // 64 = 10 -> 32
    for setting, want in (("auto", 32), (512, 512)):
        model = tmp_path / f"m-{setting}"
        cfg = only_schema(
            data,
            model,
            ["income"],
            end_day=DAYS[0],
            end_split="0600",
            train_batch_size=setting,
            predict_before_train=predict,
        )
        with OnlineTrainer(cfg) as t:
            recs = [t.run_pass(s) for s in t.passes_todo()]
        sizes = [r["batch_size"] for r in recs]
        if setting == "auto" and not predict:  # the first pass has counted nothing yet
            assert sizes == [FIRST_BATCH, want], sizes
        else:
            assert sizes == [want] * 2, sizes
        assert recs[-1]["step"] == sum(-(-700 // b) for b in sizes)
        logged = [json.loads(x) for x in (model / "passes.jsonl").read_text().splitlines()]
        assert [r["batch_size"] for r in logged] == sizes
