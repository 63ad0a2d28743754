"""Schema jobs' data: ragged bags through SparseTables (against torch's EmbeddingBag), the
slot-text and Parquet readers, string ids hashed alike in every process, and whole passes
over a planted stream whose list feature carries the signal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from streamrec.control.trainer_config import TrainerConfig
from streamrec.keyhash import string_key, string_keys
from streamrec.ragged import RaggedTensor
from streamrec.trainer.__main__ import main
from streamrec.trainer.data.batches import Batch, ParseStats
from streamrec.trainer.data.feature_data import parse_slot_chunk, read_parquet
from streamrec.trainer.data.reader import iter_batches
from streamrec.trainer.errors import DataError
from streamrec.trainer.model.export import Predictor, export_serving
from streamrec.trainer.runner import OnlineTrainer
from streamrec.trainer.sparse import SparseTables
from test_sparse import DIM, make_store
from torch import nn

SCHEMA = {
    "label": "click",
    "dense": ["age", {"name": "price", "log1p": True}],
    "sparse": [{"name": "user_id"}, {"name": "genres", "pooling": "mean"}, {"name": "tag"}],
}


#: SCHEMA with a feature sharing tag's table (its keys are tag's ids too)
SHARED = {**SCHEMA, "sparse": [*SCHEMA["sparse"], {"name": "tag2", "table": "tag"}]}


def schema_config(
    data: Path, model: Path, fmt: str, schema: dict | None = None, **runner
) -> TrainerConfig:
    return TrainerConfig.parse(
        {
            "runner": {
                "train_data_dir": str(data),
                "model_save_path": str(model),
                "data_format": fmt,
                "schema": SCHEMA if schema is None else schema,
                "split_interval": 720,
                "start_day": "20190720",
                "end_day": "20190721",
                "checkpoint_per_pass": 1,
                "train_batch_size": 128,
                "data_sleep_second": 0.05,
                "save_base_at_day_end": False,
                **runner,
            },
            "hyper_parameters": {
                "arch_sparse_feature_size": DIM,
                "arch_mlp_bot": f"2-16-{DIM}",
                "arch_mlp_top": "8-1",
                "learning_rate": 0.05,
            },
        }
    )


# ---- ragged bags against torch's EmbeddingBag -------------------------------------------


def test_bags_pool_and_their_gradients_are_torchs_embedding_bag():
    """A key in two bags gets the sum of both bags' gradients; mean divides by the bag's
    length; an empty bag pools to zeros and gives no gradient."""
    store = make_store()
    tables = ["t0", "t1", "t2"]
    pooling = ["sum", "mean", "mean"]
    sp = SparseTables(store, tables, DIM, pooling=pooling)
    rows = [
        [[7, 3, 7], [], [3], [9, 7]],  # key 7 in two bags, twice in one
        [[5, 6], [5], [], [6, 5, 8]],
        [[], [], [], []],  # every bag empty
    ]
    bags = [RaggedTensor.from_list(r) for r in rows]
    b = 4
    batch = Batch(
        torch.zeros(b, 2), torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.zeros(b, 0), bags=bags
    )
    sb = sp.pull(sp.prepare(batch), create=True)
    out = sp.forward(sb)  # (B, S, DIM)
    g = torch.Generator().manual_seed(1)
    upstream = torch.randn(out.shape, generator=g)
    (out * upstream).sum().backward()
    assert sb.weights is not None and sb.weights.grad is not None
    for t, (name, mode) in enumerate(zip(tables, pooling, strict=True)):
        keys = sb.keys[t]
        lo, hi = sb.bounds[t], sb.bounds[t + 1]
        ref = nn.EmbeddingBag(max(len(keys), 1), DIM, mode=mode)
        with torch.no_grad():
            if len(keys):
                ref.weight.copy_(sb.weights[lo:hi])
        pos = {int(k): i for i, k in enumerate(keys)}
        flat = torch.tensor([pos[k] for r in rows[t] for k in r], dtype=torch.int64)
        offsets = bags[t].offsets()[:-1]
        want = ref(flat, offsets)
        assert torch.allclose(out[:, t], want, atol=1e-6), name
        (want * upstream[:, t]).sum().backward()
        if len(keys):
            assert torch.allclose(sb.weights.grad[lo:hi], ref.weight.grad, atol=1e-6), name
    # the empty bags: zeros out, and the third table holds no key at all
    assert torch.equal(out[1, 0], torch.zeros(DIM)) and torch.equal(out[:, 2], torch.zeros(b, DIM))
    assert sb.bounds[3] == sb.bounds[2]
    # key 7 of table 0 is in bags 0 (twice) and 3: its gradient is the sum of the three
    k7 = sb.bounds[0] + [int(k) for k in sb.keys[0]].index(7)
    assert torch.allclose(sb.weights.grad[k7], 2 * upstream[0, 0] + upstream[3, 0], atol=1e-6)
    sp.push(sb, batch.labels)  # shows and clicks per key: no error on empty tables
    store.close()


@pytest.mark.parametrize("ragged", [False, True])
def test_slots_sharing_a_table_pull_a_key_once_and_sum_its_gradients(ragged):
    """Slots 0 and 2 share table t0: one row a key, the gradient of a key in both slots the
    sum of both, as one torch EmbeddingBag over both slots' bags computes it."""
    store = make_store()
    sp = SparseTables(store, ["t0", "t1", "t0"], DIM)
    b = 3
    if ragged:
        rows = [[[7, 3], [], [3]], [[5], [6], [5]], [[3, 9], [7], []]]
        batch = Batch(
            torch.zeros(b, 2),
            torch.ones(b),
            torch.zeros(b, 0),
            bags=[RaggedTensor.from_list(r) for r in rows],
        )
    else:
        keys = torch.tensor([[7, 5, 3], [3, 6, 7], [9, 5, 7]])
        rows = [[[int(k)] for k in keys[:, t]] for t in range(3)]
        batch = Batch(torch.zeros(b, 2), torch.ones(b), keys)
    sb = sp.pull(sp.prepare(batch), create=True)
    assert len(sb.keys) == 2  # two tables
    t0 = [int(k) for k in sb.keys[0]]
    assert sorted(t0) == sorted({k for t in (0, 2) for r in rows[t] for k in r})
    out = sp.forward(sb)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    (out * upstream).sum().backward()
    assert sb.weights is not None and sb.weights.grad is not None
    ref = nn.EmbeddingBag(len(t0), DIM, mode="sum")
    with torch.no_grad():
        ref.weight.copy_(sb.weights[: len(t0)])
    pos = {k: i for i, k in enumerate(t0)}
    loss = torch.zeros(())
    for t in (0, 2):
        flat = torch.tensor([pos[k] for r in rows[t] for k in r], dtype=torch.int64)
        offsets = RaggedTensor.from_list(rows[t]).offsets()[:-1]
        want = ref(flat, offsets)
        assert torch.allclose(out[:, t], want, atol=1e-6)
        loss = loss + (want * upstream[:, t]).sum()
    loss.backward()
    assert torch.allclose(sb.weights.grad[: len(t0)], ref.weight.grad, atol=1e-6)
    sp.push(sb, batch.labels)
    store.close()


def test_ragged_batches_concat_and_slice():
    bags = [RaggedTensor.from_list([[1, 2], [], [3]]), RaggedTensor.from_list([[4], [5], []])]
    a = Batch(torch.zeros(3, 1), torch.ones(3), torch.zeros(3, 0), bags=bags)
    both = Batch.concat([a, a])
    assert len(both) == 6 and both.num_features == 2
    assert both.bags is not None and both.bags[0].to_list() == [[1, 2], [], [3], [1, 2], [], [3]]
    part = both.slice(2, 5)
    assert part.bags is not None and part.bags[0].to_list() == [[3], [1, 2], []]
    assert part.bags[1].to_list() == [[], [4], [5]]


# ---- string ids ------------------------------------------------------------------------


def test_string_ids_hash_alike_in_every_process():
    words = ["", "a", "item_42", "žánr", "x" * 300]
    raw = [w.encode() for w in words]
    data = np.frombuffer(b"".join(raw), np.uint8)
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in raw])])
    here = string_keys(data, offsets).tolist()
    assert here == [string_key(w) for w in words]
    assert len(set(here)) == len(words)
    code = (
        "import json, sys; from streamrec.keyhash import string_key; "
        "print(json.dumps([string_key(w) for w in json.loads(sys.argv[1])]))"
    )
    for seed in ("1", "2"):  # Python's own str hash differs between these two
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(words)],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        )
        assert json.loads(out.stdout) == here
    # the documented hash, written out in plain integers (keyhash's docstring)
    assert here == [reference_key(w) for w in words]


def reference_key(text: str) -> int:
    """FNV-1a 64 of the UTF-8 bytes, then SplitMix64's finalizer, as int64."""
    m = (1 << 64) - 1
    h = 0xCBF29CE484222325
    for c in text.encode():
        h = ((h ^ c) * 0x100000001B3) & m
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & m
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & m
    h ^= h >> 31
    return h - (1 << 64) if h >= 1 << 63 else h


# ---- slot text -------------------------------------------------------------------------


def test_slot_lines_lists_and_malformed():
    cfg = schema_config(Path("d"), Path("m"), "slot")
    schema = cfg.runner.feature_schema
    assert schema is not None
    text = (
        b"click:1 age:0.5 price:1 user_id:17 genres:5 genres:9 tag:1\n"
        b"click:0 age:-2 price:0 user_id:3\n"  # empty bags for genres and tag
        b"\n"
        b"click:1 age:x price:1 user_id:1\n"  # a non-number dense: malformed
        b"age:1 price:2 user_id:4\n"  # no label: malformed
        b"click:1 age:1 price:2 age:3 user_id:4\n"  # a dense twice: malformed
        b"click:1 age:1 price:2 user_id:sku-z\n"  # a key that is no int: a string id
        b"click:1 age:1 price:2 user_id\n"  # not name:value: malformed
        b"price:3 other:7 click:2 age:1 genres:1\r\n"  # any order, an unknown name skipped
    )
    batch, stats = parse_slot_chunk(text, schema, "part-0", 10)
    assert (stats.lines, stats.malformed) == (8, 4)
    assert stats.first_bad is not None and stats.first_bad[:2] == ("part-0", 13)
    assert batch.labels.tolist() == [1.0, 0.0, 1.0, 1.0]
    assert torch.allclose(batch.dense[:, 0], torch.tensor([0.5, -2.0, 1.0, 1.0]))
    assert torch.allclose(batch.dense[:, 1], torch.log1p(torch.tensor([1.0, 0.0, 2.0, 3.0])))
    assert batch.bags is not None
    sku = string_key("sku-z")  # the key a Parquet string column gives it
    assert [b.to_list() for b in batch.bags] == [
        [[17], [3], [sku], []],
        [[5, 9], [], [], [1]],
        [[1], [], [], []],
    ]


# ---- Parquet ---------------------------------------------------------------------------


def test_parquet_columns_types_and_a_missing_column(tmp_path):
    table = pa.table(
        {
            "click": pa.array([1, 0, None, 1], pa.int64()),
            "age": pa.array([0.5, 1.0, 2.0, 3.0]),
            "price": pa.array([1.0, 0.0, 1.0, 7.0]),
            "user_id": pa.array(["u1", None, "u2", "u1"]),
            "genres": pa.array([[5, 9], [], [1], None], pa.list_(pa.int64())),
            "tag": pa.array([["a", None], ["b"], [], ["a"]], pa.list_(pa.string())),
            "extra": pa.array([0, 0, 0, 0]),
        }
    )
    path = tmp_path / "part-0.parquet"
    pq.write_table(table, path, row_group_size=2)
    schema = schema_config(tmp_path, tmp_path, "parquet").runner.feature_schema
    assert schema is not None
    chunks = list(read_parquet(path, schema, batch_rows=2))
    assert len(chunks) == 2  # a record batch at a time
    stats = ParseStats()
    batches = list(iter_batches([path], "parquet", 3, 10, stats, schema=schema))
    assert (stats.lines, stats.malformed) == (4, 1)  # the null label
    (batch,) = batches
    assert batch.labels.tolist() == [1.0, 0.0, 1.0]
    assert batch.bags is not None
    u1, a = string_key("u1"), string_key("a")
    assert batch.bags[0].to_list() == [[u1], [], [u1]]
    assert batch.bags[1].to_list() == [[5, 9], [], []]
    assert batch.bags[2].to_list() == [[a], [string_key("b")], [a]]
    # a file without a schema column fails the split, naming the column
    pq.write_table(table.drop_columns(["genres"]), tmp_path / "bad.parquet")
    with pytest.raises(DataError, match="no column 'genres'"):
        list(
            iter_batches([tmp_path / "bad.parquet"], "parquet", 3, 10, ParseStats(), schema=schema)
        )


# ---- whole passes over a planted stream --------------------------------------------------


def planted(n: int, seed: int) -> dict[str, list]:
    """Samples whose click depends mostly on a list feature (genres, 0-4 keys a row, mean
    of each genre's hidden weight), a little on a dense one; user_id and tag are noise."""
    rng = np.random.default_rng(seed)
    w = np.random.default_rng(0).normal(0, 2.0, 30)  # the same weights in every split
    lengths = rng.integers(0, 5, n)
    genres = [rng.integers(0, 30, k).tolist() for k in lengths]
    age = rng.normal(0, 1, n)
    logit = np.array([w[g].mean() if g else 0.0 for g in genres]) + 0.5 * age
    click = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return {
        "click": click.tolist(),
        "age": age.tolist(),
        "price": rng.exponential(3.0, n).tolist(),
        "user_id": [f"u{u}" for u in rng.integers(0, 50, n)],
        "genres": genres,
        "tag": [rng.integers(0, 5, rng.integers(0, 3)).tolist() for _ in range(n)],
        "tag2": [rng.integers(0, 5, rng.integers(0, 3)).tolist() for _ in range(n)],
    }


def write_planted(root: Path, fmt: str, samples: int = 1500) -> None:
    for s, (day, split) in enumerate(
        [(d, h) for d in ("20190720", "20190721") for h in ("0000", "1200")]
    ):
        cols = planted(samples, s + 1)
        d = root / day / split
        d.mkdir(parents=True)
        if fmt == "parquet":
            pq.write_table(pa.table(cols), d / "part-00000", row_group_size=500)
        else:
            lines = []
            for i in range(samples):
                toks = [f"click:{cols['click'][i]}", f"age:{cols['age'][i]:.4f}"]
                toks.append(f"price:{cols['price'][i]:.3f}")
                toks.append(f"user_id:{int(cols['user_id'][i][1:])}")
                toks += [f"genres:{g}" for g in cols["genres"][i]]
                toks += [f"tag:{t}" for t in cols["tag"][i]]
                toks += [f"tag2:{t}" for t in cols["tag2"][i]]
                lines.append(" ".join(toks))
            (d / "part-00000").write_text("\n".join(lines) + "\n")
        (d / "to.hadoop.done").write_text("")


@pytest.mark.parametrize("fmt", ["parquet", "slot"])
def test_a_schema_job_learns_the_list_feature(tmp_path, fmt, capsys):
    write_planted(tmp_path / "data", fmt)
    cfg = schema_config(tmp_path / "data", tmp_path / "m", fmt, SHARED)
    assert cfg.slot_tables == ["slot_0", "slot_1", "slot_2", "slot_2"]  # tag2 shares tag's
    with OnlineTrainer(cfg) as t:
        assert [o.name for o in t.tables] == ["slot_0", "slot_1", "slot_2"]
        specs = t.passes_todo()
        assert len(specs) == 4
        for s in specs:
            t.run_pass(s)
        out = export_serving(t, tmp_path / "serving")
    recs = [json.loads(x) for x in (tmp_path / "m" / "passes.jsonl").read_text().splitlines()]
    assert [r["samples"] for r in recs] == [1500] * 4
    assert all(r["malformed_lines"] == 0 for r in recs)
    assert recs[-1]["predict_auc"] > 0.7, [r["predict_auc"] for r in recs]
    assert recs[-1]["predict_auc"] > recs[0]["predict_auc"]
    # the serving export reads the same format by the same schema
    pred = Predictor(out)
    try:
        res = pred.score_files([tmp_path / "data" / "20190721" / "1200" / "part-00000"])
    finally:
        pred.close()
    assert res["samples"] == 1500 and res["auc"] > 0.7, res
    # the CLI's predict: the model's format and schema unless told otherwise
    part = str(tmp_path / "data" / "20190721" / "1200" / "part-00000")
    assert main(["predict", "--model", str(out), "--data", part]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["auc"] == res["auc"]
