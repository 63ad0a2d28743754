"""Per-feature embedding dims of a schema: tables of several widths through SparseTables (one
block a width, against the blocks taken apart), a projection per feature of another dim in
the dense model, and whole passes where the signal runs through a projected feature:
trained, checkpointed and loaded to the same predictions, exported and scored."""

from __future__ import annotations

import json

import pytest
import torch
from streamrec.control.trainer_config import TrainerConfig
from streamrec.embedding_store import EmbeddingStore, TableOptions
from streamrec.trainer.data.batches import Batch, ParseStats
from streamrec.trainer.data.reader import iter_batches
from streamrec.trainer.errors import ModelShapeError
from streamrec.trainer.model.dlrm import DLRMDense
from streamrec.trainer.model.export import Predictor
from streamrec.trainer.runner import OnlineTrainer
from streamrec.trainer.sparse import SparseTables
from test_feature_data import SHARED, schema_config, write_planted
from test_sparse import DIM, make_batch

#: SHARED with user_id's table 2 wide and genres' (the signal) 8 wide; tag and tag2 (sharing
#: tag's table) at the job's DIM.
MIXED = {
    **SHARED,
    "sparse": [
        {"name": "user_id", "dim": 2},
        {"name": "genres", "pooling": "mean", "dim": 8},
        {"name": "tag"},
        {"name": "tag2", "table": "tag"},
    ],
}
#: the tables of test_sparse's three slots at several widths: t0 and t2 at DIM, t1 at 2
WIDTHS = {"t0": DIM, "t1": 2, "t2": DIM}


def mixed_store() -> EmbeddingStore:
    opts = {
        "embedx_threshold": 0,
        "initializer": {"type": "uniform", "low": -0.1, "high": 0.1},
        "embed_sgd_param": {"name": "StdAdaGradSGDRule", "learning_rate": 0.05},
        "embedx_sgd_param": {"name": "StdAdaGradSGDRule", "learning_rate": 0.05},
    }
    return EmbeddingStore(
        [TableOptions.parse(dict(opts, name=n, dim=d)) for n, d in WIDTHS.items()], seed=7
    )


def _step(sp: SparseTables, batch: Batch, weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """Pull, pool, backward of sum(w_k * pooled_k), push; the pooled features (detached)."""
    sb = sp.pull(sp.prepare(batch), create=True)
    ly = sp.forward(sb)
    feats = list(ly) if isinstance(ly, list) else list(ly.unbind(1))
    sum((w * f).sum() for w, f in zip(weights, feats, strict=True)).backward()
    sp.push(sb, batch.labels)
    return [f.detach().clone() for f in feats]


@pytest.mark.parametrize("ragged", [False, True])
def test_tables_of_several_dims_are_one_block_a_dim(ragged):
    """Mixed widths (t1 at 2, a slot sharing t0) against each width's SparseTables alone on a
    twin store: the same pooled rows, the same rows after two pushed steps."""
    batch = make_batch(ragged)
    slot_tables = ["t0", "t1", "t2"]
    g = torch.Generator().manual_seed(5)
    weights = [torch.randn(len(batch), WIDTHS[t], generator=g) for t in slot_tables]
    mixed, twin = mixed_store(), mixed_store()
    sp = SparseTables(mixed, slot_tables, DIM, dims=[WIDTHS[t] for t in slot_tables])
    assert sp.by_dim is not None and [s for s, _ in sp.by_dim] == [[0, 2], [1]]
    wide = SparseTables(twin, ["t0", "t2"], DIM)
    narrow = SparseTables(twin, ["t1"], 2)
    feats = batch.features()
    none = torch.zeros(len(batch), 0, dtype=torch.int64)
    wide_batch = Batch(batch.dense, batch.labels, none, bags=feats[0::2])
    narrow_batch = Batch(batch.dense, batch.labels, none, bags=feats[1:2])
    for _ in range(2):
        got = _step(sp, batch, weights)
        w0, w1 = _step(wide, wide_batch, weights[0::2]), _step(narrow, narrow_batch, weights[1:2])
        assert [f.shape[1] for f in got] == [DIM, 2, DIM]
        for a, b in zip(got, [w0[0], w1[0], w0[1]], strict=True):
            torch.testing.assert_close(a, b)
    for name in WIDTHS:
        keys = torch.unique(torch.cat([f.values() for f in feats]))
        torch.testing.assert_close(mixed.pull(name, keys, False), twin.pull(name, keys, False))
    # a table of two widths is refused
    with pytest.raises(ModelShapeError, match="table 't0' has one dim"):
        SparseTables(mixed, ["t0", "t0"], DIM, dims=[DIM, 2])
    mixed.close()
    twin.close()


def test_projections_only_for_features_of_another_dim():
    args = dict(dense_dim=2, num_sparse=3, sparse_dim=4, mlp_bot=[2, 4], mlp_top=[4, 1])
    plain = DLRMDense(**args)
    same = DLRMDense(**args, slot_dims=[4, 4, 4])
    mixed = DLRMDense(**args, slot_dims=[2, 4, 8])
    # all at the job's dim: the state dict (and the init) of a model without slot_dims
    assert same.state_dict().keys() == plain.state_dict().keys()
    for k, v in plain.state_dict().items():
        assert torch.equal(v, same.state_dict()[k]) and torch.equal(v, mixed.state_dict()[k])
    extra = set(mixed.state_dict()) - set(plain.state_dict())
    assert extra == {"proj.0.weight", "proj.2.weight"}
    assert mixed.proj["0"].weight.shape == (4, 2) and mixed.proj["2"].bias is None
    x = torch.randn(5, 2)
    ly = [torch.randn(5, 2), torch.randn(5, 4), torch.randn(5, 8)]
    p = mixed(x, ly)
    p.sum().backward()
    assert p.shape == (5, 1) and mixed.proj["2"].weight.grad is not None
    with pytest.raises(ModelShapeError, match=r"sparse feature 2 must be \(5, 8\)"):
        mixed(x, [ly[0], ly[1], torch.randn(5, 4)])
    with pytest.raises(ModelShapeError, match="come as 3 tensors"):
        mixed(x, torch.randn(5, 3, 4))


def test_a_shared_table_has_one_dim():
    bad = {**MIXED, "sparse": [*MIXED["sparse"][:3], {"name": "tag2", "table": "tag", "dim": 2}]}
    with pytest.raises(ValueError, match=r"runner.schema.sparse\[3\].dim.*tag.*whose dim is 4"):
        schema_config("/tmp/d", "/tmp/m", "parquet", bad)
    # a sharer that names its table's dim, or none, is the table's
    ok = {**MIXED, "sparse": [*MIXED["sparse"][:3], {"name": "tag2", "table": "tag", "dim": DIM}]}
    cfg = schema_config("/tmp/d", "/tmp/m", "parquet", ok)
    assert cfg.slot_dims == [2, 8, DIM, DIM]


def _scores(t: OnlineTrainer, part) -> torch.Tensor:
    """The trainer's float model's click probabilities of one file (nothing created)."""
    out = []
    schema = t.config.runner.feature_schema
    with torch.no_grad():
        for b in iter_batches([part], "parquet", 4, 512, ParseStats(), schema=schema):
            z = t._logits(b, t.sparse.pull(t.sparse.prepare(b), create=False))
            out.append(t._probabilities(z))
    return torch.cat(out)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_job_of_mixed_dims_learns_loads_and_serves(tmp_path):
    write_planted(tmp_path / "data", "parquet")
    cfg = schema_config(tmp_path / "data", tmp_path / "m", "parquet", MIXED)
    part = tmp_path / "data" / "20190721" / "1200" / "part-00000"
    with OnlineTrainer(cfg) as t:
        assert {o.name: o.dim for o in t.tables} == {"slot_0": 2, "slot_1": 8, "slot_2": DIM}
        assert set(t.dense.proj) == {"0", "1"}  # user_id and genres, not tag nor tag2
        assert t.dense.proj["1"].weight.shape == (DIM, 8)
        before = t.dense.proj["1"].weight.detach().clone()
        for s in t.passes_todo():
            t.run_pass(s)
        assert not torch.equal(before, t.dense.proj["1"].weight)  # the dense optimizer's
        trained = _scores(t, part)
        out = t.export_serving(tmp_path / "serving")
    recs = [json.loads(x) for x in (tmp_path / "m" / "passes.jsonl").read_text().splitlines()]
    # the signal (genres' mean) reaches the interaction through its projection
    assert recs[-1]["predict_auc"] > 0.7, [r["predict_auc"] for r in recs]
    assert recs[-1]["predict_auc"] > recs[0]["predict_auc"]
    # checkpoint -> load: the same model, the same predictions
    with OnlineTrainer(TrainerConfig.parse(cfg.model_dump(mode="json", by_alias=True))) as t2:
        assert t2.warm_start() == ("20190721", 2)
        torch.testing.assert_close(_scores(t2, part), trained, rtol=0, atol=0)
    # the export: int8 projections and the tables at their dims, scored by predict
    pred = Predictor(out)
    try:
        assert set(pred.dense.proj) == {"0", "1"}
        res = pred.score_files([part], tmp_path / "scores.txt")
    finally:
        pred.close()
    assert res["samples"] == 1500 and res["auc"] > 0.7, res
    served = torch.tensor([float(x) for x in (tmp_path / "scores.txt").read_text().split()])
    assert (served - trained).abs().max() < 0.05
