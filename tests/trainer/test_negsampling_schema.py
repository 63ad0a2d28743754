"""Negative sampling in a schema job through a real node-local sampler process: item-side
features named by name, a list feature packed from the negative table as a ragged bag and
combined with the positives, user-side bags repeated; whole passes train on it."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from streamrec.control.trainer_config import TrainerConfig
from streamrec.sampler import LocalRpcDataSampler
from streamrec.sampler.client import stop_server
from streamrec.trainer.data.batches import ParseStats
from streamrec.trainer.data.negsampling import ItemSide
from streamrec.trainer.data.reader import iter_batches
from streamrec.trainer.errors import ConfigError, DataError
from streamrec.trainer.runner import OnlineTrainer
from test_feature_data import schema_config

#: item_id and genres (a list) are the item's; user_id and hist (genres' table) the user's
SCHEMA = {
    "label": "click",
    "dense": ["age", {"name": "price", "log1p": True}],
    "sparse": [
        {"name": "user_id"},
        {"name": "item_id"},
        {"name": "genres", "pooling": "mean", "dim": 8},
        {"name": "hist", "table": "genres"},
    ],
}
ITEMS, GENRES = 200, 20


def catalog() -> tuple[np.ndarray, list[list[int]]]:
    """Item ids (1000..1199) and each item's 1-3 genres: the same in every split."""
    rng = np.random.default_rng(0)
    ids = np.arange(1000, 1000 + ITEMS, dtype=np.int64)
    return ids, [rng.integers(0, GENRES, rng.integers(1, 4)).tolist() for _ in ids]


def write_stream(root: Path, samples: int = 3000) -> None:
    """Two splits of impressions whose click follows the item's genres (the mean of +3 for
    genres 0-4, -6 for the others): clicked items have those genres, most of the sampler's
    negatives do not (the best AUC of positives against uniform items: 0.89)."""
    ids, genres = catalog()
    w = np.where(np.arange(GENRES) < 5, 3.0, -6.0)
    for s, split in enumerate(["0000", "1200"]):
        rng = np.random.default_rng(s + 10)
        pick = rng.integers(0, ITEMS, samples)
        logit = np.array([w[genres[i]].mean() for i in pick])
        cols = {
            "click": (rng.random(samples) < 1 / (1 + np.exp(-logit))).astype(np.int64),
            "age": rng.normal(0, 1, samples),
            "price": rng.exponential(3.0, samples),
            "user_id": rng.integers(0, 50, samples),
            "item_id": ids[pick],
            "genres": [genres[i] for i in pick],
            "hist": [rng.integers(0, GENRES, rng.integers(0, 4)).tolist() for _ in pick],
        }
        d = root / "20190720" / split
        d.mkdir(parents=True)
        pq.write_table(pa.table(cols), d / "part-00000")
        (d / "to.hadoop.done").write_text("")


def write_items(path: Path) -> None:
    ids, genres = catalog()
    pq.write_table(
        pa.table(
            {
                "item_id": pa.array(ids, pa.int64()),
                "genres": pa.array(genres, pa.list_(pa.int64())),
                "category": pa.array(np.ones(ITEMS, np.int64)),
                "weight": pa.array(np.ones(ITEMS, np.float32)),
                "skey": pa.array([""] * ITEMS),
            }
        ),
        path,
    )


@pytest.fixture
def short_dir():
    path = tempfile.mkdtemp(prefix="trn-", dir="/tmp")  # ipc socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def sampling_config(tmp_path: Path, endpoint: str, **sampling) -> TrainerConfig:
    cfg = schema_config(tmp_path / "data", tmp_path / "m", "parquet", SCHEMA, end_day="20190720")
    job = cfg.model_dump(mode="json", by_alias=True)
    job["negative_sampling"] = {
        "enabled": True,
        "table_path": str(tmp_path / "items.parquet"),
        "sample_size": 3,
        "endpoint": endpoint,
        **sampling,
    }
    return TrainerConfig.parse(job)


def test_item_features_are_named_by_name(tmp_path):
    cfg = sampling_config(tmp_path, "ipc:///tmp/x.sock", item_features=["item_id", "genres"])
    side = ItemSide.of(cfg.negative_sampling, 4, cfg.runner.feature_schema)
    assert (side.item, side.category, side.slots) == (1, None, [1, 2])
    assert side.columns == ["user_id", "item_id", "genres", "hist"]
    # default: the first sparse feature, as item_slot 0 is to a job without a schema
    plain = sampling_config(tmp_path, "ipc:///tmp/x.sock")
    assert ItemSide.of(plain.negative_sampling, 4, plain.runner.feature_schema).slots == [0]
    for sampling, words in [
        ({"item_features": ["nope"]}, r"item_features\[0\]: names no sparse feature"),
        ({"category_feature": "age"}, r"category_feature: names no sparse feature"),
        ({"item_slot": 1}, r"negative_sampling.item_slot: a schema job names"),
        ({"item_features": ["genres", "genres"]}, "names a feature twice"),
    ]:
        with pytest.raises(ValueError, match=words):
            sampling_config(tmp_path, "ipc:///tmp/x.sock", **sampling)
    # a job without a schema names slots: features by name are refused by name
    job = {"negative_sampling": {"enabled": True, "reload": False, "item_features": ["a"]}}
    with pytest.raises(ValueError, match="negative_sampling.item_features: names schema"):
        TrainerConfig.parse(job)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_negatives_of_a_schema_job_pack_list_features(tmp_path, short_dir):
    write_stream(tmp_path / "data")
    write_items(tmp_path / "items.parquet")
    endpoint = f"ipc://{short_dir}/sampler.sock"
    cfg = sampling_config(
        tmp_path, endpoint, item_features=["item_id", "genres"], category_feature=None
    )
    ns = cfg.negative_sampling
    starter = LocalRpcDataSampler(
        "category", "item_id", ns.weight_tag, ns.skey_name, endpoint=endpoint
    )
    pid = starter.server_pid
    starter.close()
    files = [tmp_path / "data" / "20190720" / "0000" / "part-00000"]
    schema = cfg.runner.feature_schema
    (batch,) = list(iter_batches(files, "parquet", 4, 10**6, ParseStats(), schema=schema))
    ids, genres = catalog()
    genres_of = dict(zip(ids.tolist(), genres, strict=True))
    t = OnlineTrainer(cfg)
    try:
        recs = [t.run_pass(s) for s in t.passes_todo()]
        assert t.negatives is not None
        positives = batch.slice(0, 300)
        out = t.negatives(positives)
        keep = positives.labels > 0.5
        npos = int(keep.sum())
        assert len(out) == 3 * npos and out.bags is not None and out.keys.shape == (3 * npos, 0)
        assert out.labels.tolist() == [1.0, 0.0, 0.0] * npos
        user, item, gen, hist = (f.to_list() for f in out.bags)
        pos_rows = torch.nonzero(keep).view(-1).tolist()
        src = [f.to_list() for f in positives.bags]
        for i, r in enumerate(pos_rows):
            at = 3 * i
            # user-side bags (user_id, and hist though it shares genres' table) repeated
            assert user[at : at + 3] == [src[0][r]] * 3 and hist[at : at + 3] == [src[3][r]] * 3
            assert item[at] == src[1][r]  # the positive keeps its own item
            for j in (1, 2):
                (neg,) = item[at + j]
                assert neg != src[1][r][0] and neg in genres_of  # an item of the table
                assert gen[at + j] == genres_of[neg]  # its list, packed from the table
            assert gen[at] == genres_of[src[1][r][0]]
        # an item bag of two ids is refused, naming the feature and the row
        two = positives.slice(0, 1)
        two.labels = torch.ones(1)  # a new tensor: the slice is a view of the batch
        two.bags[1] = type(two.bags[1]).from_list([[1000, 1001]])
        with pytest.raises(DataError, match="feature 'item_id' is the item id.*row 0 holds 2"):
            t.negatives(two)
    finally:
        t.close()
        if pid:
            stop_server(pid)
    clicks = int(batch.labels.sum())
    assert recs[0]["samples"] == 3 * clicks and recs[0]["actual_ctr"] == pytest.approx(1 / 3)
    lines = [json.loads(x) for x in (tmp_path / "m" / "passes.jsonl").read_text().splitlines()]
    assert [r["lines"] for r in lines] == [3000, 3000]
    # clicked items have genres 0-4, most sampled ones do not (the draws are not seeded)
    assert lines[-1]["predict_auc"] > 0.8, [(r["train_auc"], r["predict_auc"]) for r in lines]


def test_a_table_without_an_item_feature_column_is_named(tmp_path, short_dir):
    from streamrec.trainer.data.negsampling import NegativeSampler

    write_stream(tmp_path / "data", samples=100)
    ids, _ = catalog()
    pq.write_table(
        pa.table(
            {
                "item_id": pa.array(ids, pa.int64()),
                "category": pa.array(np.ones(ITEMS, np.int64)),
                "weight": pa.array(np.ones(ITEMS, np.float32)),
                "skey": pa.array([""] * ITEMS),
            }
        ),
        tmp_path / "items.parquet",
    )
    endpoint = f"ipc://{short_dir}/sampler.sock"
    cfg = sampling_config(tmp_path, endpoint, item_features=["item_id", "genres"])
    ns = cfg.negative_sampling
    starter = LocalRpcDataSampler(
        "category", "item_id", ns.weight_tag, ns.skey_name, endpoint=endpoint
    )
    pid = starter.server_pid
    starter.close()
    files = [tmp_path / "data" / "20190720" / "0000" / "part-00000"]
    schema = cfg.runner.feature_schema
    (batch,) = list(iter_batches(files, "parquet", 4, 10**6, ParseStats(), schema=schema))
    neg = NegativeSampler(ns, 4, load=True, schema=schema)
    try:
        with pytest.raises(ConfigError, match="no column 'genres'"):
            neg(batch)
    finally:
        neg.close()
        if pid:
            stop_server(pid)
