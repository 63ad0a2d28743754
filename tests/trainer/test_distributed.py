"""Two trainer ranks (torchrun, gloo on 127.0.0.1) sharing an embedding-store shard process."""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml
from e2e.chaos_checks import same_model
from servers import torchrun_command
from streamrec.datagen.planted import StreamParams, generate
from streamrec.embedding_store import LocalShards
from streamrec.trainer.data.batches import ParseStats
from streamrec.trainer.data.reader import iter_batches
from streamrec.trainer.errors import ConfigError
from streamrec.trainer.runner import OnlineTrainer
from streamrec.trainer.store_tables import build_table_options
from trainer_helpers import SLOTS, small_config

HERE = Path(__file__).parent


def tables_file(config, path: Path) -> Path:
    path.write_text(
        json.dumps({"tables": [t.model_dump(mode="json") for t in build_table_options(config)]})
    )
    return path


def test_two_ranks_same_dense_parameters(tmp_path):
    data = tmp_path / "data"
    # 3 files a split: rank 0 reads 2, rank 1 reads 1, so their batch counts differ
    generate(
        data,
        "20190720",
        1,
        720,
        900,
        files_per_split=3,
        params=StreamParams(slots=SLOTS, vocab=300, seed=5),
    )
    config = small_config(data, tmp_path / "model", end_day="20190720")
    with LocalShards(tables_file(config, tmp_path / "tables.json"), 1) as shards:
        job = config.model_dump(mode="json")
        job["store"]["endpoints"] = shards.endpoints
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        proc = subprocess.run(
            [
                *torchrun_command(2),
                str(HERE / "two_rank_worker.py"),
                str(tmp_path / "job.yaml"),
                str(tmp_path),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    fresh = small_config(data, tmp_path / "unused")
    with OnlineTrainer(fresh) as t:
        init = t.dense.state_dict()
    assert r0.keys() == r1.keys()
    for k in r0:
        assert torch.equal(r0[k], r1[k]), k
        if k != "dense_norm.mask":  # which features are normalized: all, from the start
            assert not torch.equal(r0[k], init[k]), k  # and they did train
    # the dense normalizer's statistics: every rank's batches, merged, = the batch formula
    # over the whole stream (count, sum, sum of squares of the log1p'd ints)
    files = sorted(p for p in data.rglob("part-*"))
    batches = list(iter_batches(files, "generated", SLOTS, 10_000, ParseStats()))
    x = torch.cat([b.dense for b in batches]).double()
    want = torch.stack([torch.full((13,), float(x.shape[0])), x.sum(0), x.square().sum(0)])
    # two passes over the same day's two splits: each sample seen once
    torch.testing.assert_close(r0["dense_norm.sums"], want, rtol=1e-9, atol=1e-6)
    infos = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [i["world"] for i in infos] == [2, 2]
    assert infos[0]["step"] == infos[1]["step"] > 0
    recs = [json.loads(x) for x in (tmp_path / "model" / "passes.jsonl").read_text().splitlines()]
    assert [(r["pass_id"], r["samples"], r["world_size"], r["files"]) for r in recs] == [
        (1, 900, 2, 3),
        (2, 900, 2, 3),
    ]  # rank 0 alone writes, with every rank's samples
    ckpt = tmp_path / "model" / "20190720" / "2"
    assert (ckpt / "MANIFEST.json").is_file() and (ckpt / "sparse").is_dir()


def torchrun(script: str, job_yaml: Path, out: Path, timeout: float, **env: str):
    """Two ranks of ``script`` under torchrun (gloo on 127.0.0.1)."""
    return subprocess.run(
        [
            *torchrun_command(2),
            str(HERE / script),
            str(job_yaml),
            str(out),
        ],
        env=dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "fault",
    ["garbage_split_predict", "garbage_split_train", "checkpoint_enospc"],
)
def test_a_failure_in_one_rank_fails_the_group_fast(tmp_path, fault):
    """Rank 1's split of binary garbage (DataError while predicting or while training), or
    rank 0's checkpoint hitting a full disk (ENOSPC): both ranks raise PassFailed within
    seconds, naming the failed rank, instead of rank 0 waiting in a collective (600 s)."""
    data = tmp_path / "data"
    generate(
        data, "20190720", 1, 720, 900, files_per_split=2, params=StreamParams(slots=SLOTS, seed=5)
    )
    env = {}
    if fault.startswith("garbage"):
        # rank r reads files r::2: part-00001 of the first split is rank 1's
        garbage = random.Random(7).randbytes(1 << 16)
        (data / "20190720" / "0000" / "part-00001").write_bytes(garbage)
    else:
        env["STREAMREC_FAULT"] = "checkpoint_enospc"
    config = small_config(
        data,
        tmp_path / "model",
        end_day="20190720",
        predict_before_train=fault != "garbage_split_train",
    )
    with LocalShards(tables_file(config, tmp_path / "tables.json"), 1) as shards:
        job = config.model_dump(mode="json")
        job["store"]["endpoints"] = shards.endpoints
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
        started = time.monotonic()
        proc = torchrun("two_rank_failing_worker.py", tmp_path / "job.yaml", tmp_path, 120, **env)
        took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-12000:]
    outs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert took < 60, took
    assert all(o["seconds"] < 15 and o["clean"] is False for o in outs), outs
    if fault.startswith("garbage"):
        assert {o["raised"] for o in outs} == {"BadSplits"}
        assert all(o["kind"] == "data" and o["bad_splits"] == ["0000"] for o in outs), outs
        assert all(
            "rank 1: DataError" in o["message"] and "part-00001" in o["message"] for o in outs
        )
    else:
        assert {o["raised"] for o in outs} == {"PassFailed"}
        # a full disk is the disk's state, not the pass's: infra (a restart with backoff)
        assert all(o["kind"] == "infra" and o["bad_splits"] == [] for o in outs), outs
        assert all("rank 0: OSError: [Errno 28]" in o["message"] for o in outs), outs
        assert not (tmp_path / "model" / "passes.jsonl").exists()  # recorded after its save
        assert not (tmp_path / "model" / "20190720" / "1" / "MANIFEST.json").exists()


@pytest.mark.parametrize("shards", [2])
def test_one_rank_through_the_store_service(tmp_path, stream, shards):
    config = small_config(stream, tmp_path / "model", end_day="20190720", checkpoint_per_pass=1)
    with LocalShards(tables_file(config, tmp_path / "tables.json"), shards) as local:
        remote = config.model_copy(
            update={
                "store": config.store.model_copy(
                    update={"endpoints": local.endpoints, "tier": "host"}
                )
            }
        )
        with OnlineTrainer(remote) as t:
            t.run()
            rows = t.store.stats()["total"]["rows"]
            sizes = sum(t.store.size(n) for n in config.table_names)
        with OnlineTrainer(remote) as t:
            assert t.warm_start() == ("20190720", 2)
    recs = [json.loads(x) for x in (tmp_path / "model" / "passes.jsonl").read_text().splitlines()]
    assert [r["samples"] for r in recs] == [1500, 1500]
    assert recs[1]["predict_auc"] > 0.5
    assert rows == sizes > 100


def test_a_store_tier_other_than_the_shards_is_refused(tmp_path, stream):
    """The shards own their tier: a job that needs another one fails at start, naming it."""
    config = small_config(stream, tmp_path / "model", end_day="20190720")
    with LocalShards(tables_file(config, tmp_path / "tables.json"), 2) as local:
        store = config.store.model_copy(update={"endpoints": local.endpoints, "tier": "ssd"})
        with pytest.raises(ConfigError) as err:
            OnlineTrainer(config.model_copy(update={"store": store}))
    assert str(err.value) == (
        f"store.tier is 'ssd' but shard 0 ({local.endpoints[0]}) serves tier 'host' (shards "
        f"own their tier: start them with --tier ssd, or change store.tier)"
    )


def _two_rank_run(tmp_path: Path, data: Path, name: str, push_order: str) -> Path:
    """Two ranks over 2 fresh shard processes, the job of ``small_config`` with batches of 64
    (several steps a pass, rank 0 with more than rank 1); returns the model directory."""
    out = tmp_path / name
    out.mkdir()
    config = small_config(
        data, out / "model", end_day="20190720", train_batch_size=64, sparse_push_order=push_order
    )
    with LocalShards(tables_file(config, out / "tables.json"), 2) as shards:
        job = config.model_dump(mode="json")
        job["store"]["endpoints"] = shards.endpoints
        (out / "job.yaml").write_text(yaml.safe_dump(job))
        proc = torchrun("two_rank_worker.py", out / "job.yaml", out, 240)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "model"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_ranks_in_rank_push_order_repeat_bit_for_bit(tmp_path):
    """``runner.sparse_push_order: rank``: two runs of the same two-rank job leave the same
    model at every checkpoint, dense state and every row (in arrival order a row two ranks
    update takes their pushes in whichever order they reach its shard)."""
    data = tmp_path / "data"
    # 3 files a split: rank 0 reads 2, rank 1 reads 1; both see the popular keys every step
    generate(
        data,
        "20190720",
        1,
        720,
        1200,
        files_per_split=3,
        params=StreamParams(slots=SLOTS, vocab=100, seed=5),
    )
    first = _two_rank_run(tmp_path, data, "first", "rank")
    second = _two_rank_run(tmp_path, data, "second", "rank")
    match = same_model(first, second)
    assert (match.compared, match.equal, match.first_difference) == (2, 2, None), match.line()
    recs = [json.loads(x) for x in (first / "passes.jsonl").read_text().splitlines()]
    assert [(r["samples"], r["world_size"]) for r in recs] == [(1200, 2), (1200, 2)]
    assert all(r["step"] > 2 for r in recs[1:])  # several steps a pass
