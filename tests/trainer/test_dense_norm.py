"""The online dense normalizer: its statistics against the batch formula, missing and constant
values, the window; raw values up to 1e6 learned as well as small ones; the statistics
through checkpoint, warm start, export and predict; jobs that set only a schema, and a
schema without dense features, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from streamrec.control.trainer_config import TrainerConfig
from streamrec.trainer.data.batches import ParseStats
from streamrec.trainer.data.reader import iter_batches
from streamrec.trainer.model.dense_norm import CLIP, VAR_FLOOR, DenseNorm
from streamrec.trainer.model.dlrm import DLRMDense
from streamrec.trainer.model.export import Predictor, export_serving
from streamrec.trainer.runner import OnlineTrainer

DAYS = ("20190720", "20190721")
SPLITS = ("0000", "0600", "1200", "1800")


def formula(x: np.ndarray) -> np.ndarray:
    """(3, D) count, sum, sum of squares of each column's present (non-NaN) values."""
    present = ~np.isnan(x)
    v = np.where(present, x, 0.0)
    return np.stack([present.sum(0), v.sum(0), (v * v).sum(0)]).astype(np.float64)


def test_statistics_are_the_batch_formula_and_outputs_the_standardized_values():
    rng = np.random.default_rng(0)
    batches = [rng.normal(5.0, 3.0, (n, 3)).astype(np.float32) for n in (7, 64, 1)]
    batches[1][[3, 9], 1] = np.nan  # missing values count nowhere
    norm = DenseNorm([True, True, False])
    norm.train()
    for b in batches:
        norm(torch.from_numpy(b))
    whole = np.concatenate(batches).astype(np.float64)
    np.testing.assert_allclose(norm.pending.numpy(), formula(whole), rtol=1e-12)
    assert not norm.sums.any()  # nothing merged yet
    norm.merge(norm.pending_sums().clone())  # one rank: its own sums are the total
    np.testing.assert_allclose(norm.sums.numpy(), formula(whole), rtol=1e-12)
    assert not norm.pending.any()
    # eval: (x - mean) / sqrt(var + floor), clipped; the unnormalized column as it is; NaN 0
    norm.eval()
    x = np.array([[5.0, np.nan, 1e6], [1e9, 2.0, -3.0]], dtype=np.float32)
    got = norm(torch.from_numpy(x)).numpy()
    mean = np.nanmean(whole, 0)
    std = np.sqrt(np.nanvar(whole, 0) + VAR_FLOOR)
    want = np.clip((x - mean) / std, -CLIP, CLIP)
    want[:, 2] = x[:, 2]
    want[0, 1] = 0.0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert got[1, 0] == CLIP  # one outlier cannot saturate the MLP


def test_two_ranks_pending_sums_merge_to_the_whole_streams():
    """Every rank's pending sums, all-reduced (summed) at the pass end, give every rank the
    statistics of all the ranks' batches."""
    rng = np.random.default_rng(1)
    parts = [rng.exponential(1e5, (50, 2)).astype(np.float32) for _ in range(2)]
    ranks = [DenseNorm([True, True]) for _ in parts]
    for norm, x in zip(ranks, parts, strict=True):
        norm(torch.from_numpy(x))
    total = ranks[0].pending_sums() + ranks[1].pending_sums()
    for norm in ranks:
        norm.merge(total.clone())
    assert torch.equal(ranks[0].sums, ranks[1].sums)
    np.testing.assert_allclose(
        ranks[0].sums.numpy(), formula(np.concatenate(parts).astype(np.float64)), rtol=1e-12
    )


def test_constant_and_missing_columns_give_no_nan_and_a_fresh_model_predicts_sanely():
    norm = DenseNorm([True, True])
    x = torch.tensor([[7.0, float("nan")], [7.0, float("nan")], [7.0, float("nan")]])
    y = norm(x)  # a column constant so far, a column never seen
    assert torch.isfinite(y).all() and not y.any()
    # a fresh model's predict (no statistics yet) standardizes the batch by itself
    fresh = DenseNorm([True, True]).eval()
    y = fresh(torch.tensor([[1e6, 1.0], [3e6, 3.0]]))
    torch.testing.assert_close(y, torch.tensor([[-1.0, -1.0], [1.0, 1.0]]), rtol=1e-3, atol=1e-3)
    assert not fresh.sums.any() and not fresh.pending.any()  # and stored nothing


def test_the_window_keeps_the_moments_and_forgets_the_past():
    norm = DenseNorm([True], window=100)
    norm(torch.full((300, 1), 2.0))
    norm.merge(norm.pending_sums().clone())
    assert float(norm.sums[0, 0]) == pytest.approx(100.0)
    assert float(norm.sums[1, 0] / norm.sums[0, 0]) == pytest.approx(2.0)
    norm(torch.full((100, 1), 4.0))  # the newer values weigh half, not a quarter
    norm.merge(norm.pending_sums().clone())
    assert float(norm.sums[1, 0] / norm.sums[0, 0]) == pytest.approx(3.0)


def test_a_state_saved_before_the_normalizer_loads_unnormalized():
    """Such a model was trained on its inputs as they came: it keeps reading them so."""
    old = DLRMDense(2, 1, 2, [2, 2], [1], seed=0)  # no normalizer
    new = DLRMDense(2, 1, 2, [2, 2], [1], seed=0, normalize=[True, True])
    new.load_state_dict(old.state_dict())
    assert new.dense_norm is not None and not new.dense_norm.mask.any()
    x, ly = torch.tensor([[3.0, 1e3]]), [torch.ones(1, 2)]
    torch.testing.assert_close(new.eval()(x, ly), old.eval()(x, ly))


# ---- whole jobs ------------------------------------------------------------------------


def write_stream(root: Path, scale: float, dense: bool = True, n: int = 1500) -> None:
    """Eight splits whose clicks follow a dense signal (``income`` = ``scale`` * (z + 6),
    z ~ N(0, 1): up to ~1e6 at scale 1e5) and an item id's weight; ``city`` is noise."""
    w = np.random.default_rng(0).normal(0, 1.5, 40)
    for s, (day, split) in enumerate([(d, h) for d in DAYS for h in SPLITS]):
        rng = np.random.default_rng(s + 1)
        z = rng.normal(0, 1, n)
        item = rng.integers(0, 40, n)
        logit = w[item] + (2.0 * z if dense else 0.0)
        cols: dict[str, list] = {
            "click": (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64).tolist(),
            "item": [f"i{i}" for i in item],
            "city": rng.integers(0, 9, n).tolist(),
        }
        if dense:
            cols["income"] = (scale * (z + 6.0)).tolist()
            cols["visits"] = rng.poisson(3.0, n).astype(np.float64).tolist()
        d = root / day / split
        d.mkdir(parents=True)
        pq.write_table(pa.table(cols), d / "part-00000")
        (d / "to.hadoop.done").write_text("")


def only_schema(data: Path, model: Path, dense: list, **runner) -> TrainerConfig:
    """A job that sets where the data is and its schema: nothing of the model."""
    return TrainerConfig.parse(
        {
            "runner": {
                "train_data_dir": str(data),
                "model_save_path": str(model),
                "data_format": "parquet",
                "schema": {
                    "label": "click",
                    "dense": dense,
                    "sparse": [{"name": "item"}, {"name": "city"}],
                },
                "split_interval": 360,
                "start_day": DAYS[0],
                "end_day": DAYS[-1],
                "data_sleep_second": 0.05,
                "save_base_at_day_end": False,
                **runner,
            }
        }
    )


def mean_predict_auc(config: TrainerConfig) -> tuple[float, list[dict]]:
    with OnlineTrainer(config) as t:
        recs = [t.run_pass(s) for s in t.passes_todo()]
    return float(np.mean([r["predict_auc"] for r in recs[1:]])), recs


def test_raw_values_up_to_1e6_learn_as_small_ones(tmp_path):
    """The same clicks with the dense signal at scale 1 (values ~6) and at 1e5 (~6e5, up to
    1e6): at the defaults both learn it, within 0.01 mean predict AUC. (Before the
    normalizer the raw stream's logits were in the hundreds: AUC 0.5 on every pass.)"""
    dense = ["income", "visits"]
    aucs = {}
    for scale in (1.0, 1e5):
        data = tmp_path / f"data-{scale:g}"
        write_stream(data, scale)
        cfg = only_schema(data, tmp_path / f"m-{scale:g}", dense)
        assert cfg.hyper_parameters.arch_mlp_bot == [2, 512, 256, 64, 16]  # from the schema
        aucs[scale], recs = mean_predict_auc(cfg)
        assert max(r["predicted_ctr"] for r in recs[1:]) < 0.95, recs
    assert aucs[1.0] > 0.75, aucs
    assert abs(aucs[1e5] - aucs[1.0]) < 0.01, aucs


def test_statistics_survive_checkpoint_warm_start_export_and_predict(tmp_path):
    data = tmp_path / "data"
    write_stream(data, 1e5)
    cfg = only_schema(data, tmp_path / "m", ["income", "visits"], end_day=DAYS[0], end_split="0600")
    with OnlineTrainer(cfg) as t:
        for s in t.passes_todo():
            t.run_pass(s)
        assert t.dense.dense_norm is not None
        sums = t.dense.dense_norm.sums.clone()
        out = export_serving(t, tmp_path / "serving")
        files = sorted(data.glob(f"{DAYS[0]}/*/part-*"))[:2]  # the passes trained
        schema = cfg.runner.feature_schema
        batch = next(iter(iter_batches(files, "parquet", 2, 512, ParseStats(), schema=schema)))
        t.dense.eval()
        normalized = t.dense.dense_norm(batch.dense)
    # the statistics are the batch formula over every training row (transformed as read)
    every = iter_batches(files, "parquet", 2, 4096, ParseStats(), schema=schema)
    rows = torch.cat([b.dense for b in every])
    np.testing.assert_allclose(sums.numpy(), formula(rows.double().numpy()), rtol=1e-9)
    # a warm start from the checkpoint: bit-identical statistics
    again = only_schema(data, tmp_path / "m", ["income", "visits"], end_day=DAYS[0])
    with OnlineTrainer(again) as warm:
        warm.warm_start()
        assert warm.dense.dense_norm is not None
        assert torch.equal(warm.dense.dense_norm.sums, sums)
    # the serving export (int8 weights) reads the same statistics and normalizes alike
    pred = Predictor(out)
    try:
        norm = pred.dense.dense_norm
        assert norm is not None and torch.equal(norm.sums, sums) and bool(norm.mask.all())
        assert torch.equal(norm(batch.dense), normalized)
        res = pred.score_files(files)
    finally:
        pred.close()
    assert res["auc"] > 0.7, res
    model_json = json.loads((out / "model.json").read_text())
    assert model_json["hyper_parameters"]["arch_mlp_bot"][0] == 2


def test_a_schema_without_dense_features_trains_exports_and_warm_starts(tmp_path):
    data = tmp_path / "data"
    write_stream(data, 1.0, dense=False)
    cfg = only_schema(data, tmp_path / "m", [])
    assert cfg.hyper_parameters.arch_mlp_bot == [0, 16]
    auc, recs = mean_predict_auc(cfg)
    assert auc > 0.65, [r["predict_auc"] for r in recs]
    with OnlineTrainer(only_schema(data, tmp_path / "m", [])) as t:
        t.warm_start()
        assert t.dense.dense_norm is None and t.last_pass == (DAYS[-1], len(SPLITS))
        out = export_serving(t, tmp_path / "serving")
    pred = Predictor(out)
    try:
        res = pred.score_files(sorted(data.glob(f"{DAYS[-1]}/*/part-*")))
    finally:
        pred.close()
    assert res["samples"] == 4 * 1500 and res["auc"] > 0.65, res
