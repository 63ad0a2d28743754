"""Negative sampling through a real node-local sampler process (RecIS's flow)."""

from __future__ import annotations

import json
import shutil
import tempfile

import pytest
import torch
from item_tables import day_items, write_item_table
from streamrec.sampler import LocalRpcDataSampler
from streamrec.sampler.client import stop_server
from streamrec.trainer.data.batches import ParseStats
from streamrec.trainer.data.reader import iter_batches
from streamrec.trainer.runner import OnlineTrainer
from trainer_helpers import small_config


@pytest.fixture
def short_dir():
    path = tempfile.mkdtemp(prefix="trn-", dir="/tmp")  # ipc socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_positives_expanded_with_negatives(stream, tmp_path, short_dir):
    spec_files = sorted((stream / "20190720" / "0000").glob("part-*"))
    batches = list(iter_batches(spec_files, "generated", 4, 10**6, ParseStats()))
    items = day_items(spec_files)[0]
    write_item_table(tmp_path / "items.parquet", items)
    cfg = small_config(
        stream,
        tmp_path / "m",
        end_day="20190720",
        checkpoint_per_pass=0,
        save_base_at_day_end=False,
    )
    job = cfg.model_dump(mode="json")
    job["negative_sampling"] = {
        "enabled": True,
        "table_path": str(tmp_path / "items.parquet"),
        "item_slot": 0,
        "sample_size": 3,
        "endpoint": f"ipc://{short_dir}/sampler.sock",
    }
    cfg = type(cfg).parse(job)
    # a trainer starts a sampler only at its node's own default address: at the one named
    # here the operator starts it (a client that may auto-start it, as a node's would)
    ns = cfg.negative_sampling
    starter = LocalRpcDataSampler(
        "slot_0", "slot_0", ns.weight_tag, ns.skey_name, endpoint=ns.endpoint
    )
    pid = starter.server_pid
    starter.close()
    t = OnlineTrainer(cfg)
    try:
        assert t.negatives is None  # the sampler is reached in the first pass
        rec = t.run_pass(t.passes_todo()[0])
        positives = batches[0].slice(0, 200)
        out = t.negatives(positives)
        npos = int(positives.labels.sum())
        assert len(out) == 3 * npos
        assert out.labels.tolist() == [1.0, 0.0, 0.0] * npos
        k = out.keys.view(npos, 3, 4)
        assert torch.equal(k[:, 1:, 1:], k[:, :1, 1:].expand(-1, 2, -1))  # user side repeated
        assert bool((k[:, 1:, 0] != k[:, :1, 0]).all())  # never the positive's own item
        assert set(k[:, 1:, 0].reshape(-1).tolist()) <= set(items.tolist())
        assert torch.equal(out.dense.view(npos, 3, -1)[:, 2], out.dense.view(npos, 3, -1)[:, 0])
    finally:
        t.close()
        if pid:
            stop_server(pid)
    clicks = int(sum(int(b.labels.sum()) for b in batches))
    assert rec["samples"] == 3 * clicks and rec["actual_ctr"] == pytest.approx(1 / 3)
    line = json.loads((tmp_path / "m" / "passes.jsonl").read_text().splitlines()[0])
    assert line == json.loads(json.dumps(rec))  # the pass record, as returned
    assert line["lines"] == 1500 and line["samples"] == 3 * clicks
    # one pass already tells clicked items from sampled ones, a little: only the item's row
    # does (a negative has its positive's dense features and user side). 0.516-0.523 over
    # runs with the dense normalizer (0.57-0.58 on the raw log1p inputs, whose all-positive
    # bottom MLP gave the interaction larger partners in the first steps); the sampler's
    # draws are not seeded
    assert 0.505 < line["train_auc"] <= 1.0
    assert line["best_auc"] is None  # sampled negatives have no planted click probability
