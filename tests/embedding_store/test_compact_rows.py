"""Compact rows (TableOptions.dtype fp16 / bf16): what a pull and a push give beside an fp32
table, stochastic rounding's bias, the bytes a row takes and the tiers that refuse them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from streamrec.embedding_store import _C, EmbeddingStore, SgdRuleParam, TableOptions
from streamrec.embedding_store.errors import CheckpointError
from streamrec.embedding_store.tiers import row_codec
from streamrec.embedding_store.tiers.cached_table import CachedTable
from streamrec.embedding_store.tiers.device_table import DeviceTable
from streamrec.embedding_store.tiers.host_table import HostTable

COMPACT = ["fp16", "bf16"]
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
#: a float32 value's relative error once rounded to the dtype (half an ulp; stochastic
#: rounding: up to one ulp)
EPS = {"fp16": 2.0**-11, "bf16": 2.0**-8}


def table(dtype: str, dim: int = 16, rule: str = "torch_adagrad", **kw) -> TableOptions:
    sgd = SgdRuleParam(name=rule, initial_range=0.5, learning_rate=0.05)
    return TableOptions(
        name="item", dim=dim, dtype=dtype, embed_sgd_param=sgd, embedx_sgd_param=sgd, **kw
    )


def train(dtype: str, steps: int, rule: str = "torch_adagrad") -> tuple[torch.Tensor, ...]:
    """(initial weights, weights after `steps` pushes) of 200 keys, the same gradients for
    every dtype."""
    store = EmbeddingStore([table(dtype, rule=rule, embedx_threshold=0)], seed=3)
    keys = torch.arange(200, dtype=torch.int64) * 7919
    first = store.pull("item", keys)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        grads = torch.randn(200, 16, generator=gen) * 0.05
        store.push("item", keys, grads, torch.ones(200), torch.zeros(200))
    return first, store.pull("item", keys)


@pytest.mark.parametrize("dtype", COMPACT)
def test_pull_is_the_fp32_pull_rounded_to_nearest(dtype: str) -> None:
    want, _ = train("fp32", 0)
    got, _ = train(dtype, 0)
    assert got.dtype == torch.float32
    # new rows round to nearest: bit for bit torch's conversion of the fp32 table's values
    assert torch.equal(got, want.to(HALF[dtype]).to(torch.float32))


@pytest.mark.parametrize("rule", ["naive", "adagrad", "std_adagrad", "torch_adagrad"])
@pytest.mark.parametrize("dtype", COMPACT)
def test_pushes_track_an_fp32_table(dtype: str, rule: str) -> None:
    _, want = train("fp32", 60, rule)
    _, got = train(dtype, 60, rule)
    err = (got - want).abs()
    # each step's rounding error is at most an ulp of the weight; they are unbiased, so 60
    # of them add up like a random walk
    scale = want.abs().clamp(min=0.05)
    assert float((err / scale).max()) < 40 * EPS[dtype]
    assert float((err / scale).mean()) < 8 * EPS[dtype]


@pytest.mark.parametrize("dtype", COMPACT)
def test_pushes_are_deterministic(dtype: str) -> None:
    assert torch.equal(train(dtype, 5)[1], train(dtype, 5)[1])


@pytest.mark.parametrize("dtype", COMPACT)
def test_stochastic_rounding_keeps_updates_below_half_an_ulp(dtype: str) -> None:
    """1000 steps of -1e-4 from 1.0: round to nearest would never move (an ulp at 1.0 is
    2^-10 in fp16, 2^-7 in bf16); stochastic rounding lands on 0.9 on average."""
    sgd = SgdRuleParam(name="naive", learning_rate=1e-4, initial_range=0.0)
    opts = TableOptions(
        name="item", dim=4, dtype=dtype, embedx_threshold=0, embed_sgd_param=sgd,
        embedx_sgd_param=sgd,
    )  # fmt: skip
    store = EmbeddingStore([opts], seed=3)
    n = 512
    keys = torch.arange(n, dtype=torch.int64)
    with store.exclusive("item") as tier:
        tier.import_weights(keys, torch.ones(n, 4))
    ones = torch.ones(n)
    for _ in range(1000):
        store.push("item", keys, torch.ones(n, 4), ones, ones * 0)
    w = store.pull("item", keys)
    assert abs(float(w.mean()) - 0.9) < 0.003
    # each weight is a sum of independent roundings: spread about the mean, not stuck
    assert float(w.std()) > 0


@pytest.mark.parametrize("dim", [16, 64])
def test_bytes_per_row_halved(dim: int) -> None:
    """A row's words: the 4 header words stay float32, so the ratio is a little over half
    (dim 16: 20 against 36 words with torch_adagrad's state per weight)."""
    fp32 = HostTable(table("fp32", dim), 0).width
    for dtype in COMPACT:
        width = HostTable(table(dtype, dim), 0).width
        assert width == _C.EMBED_W + dim  # dim weights and dim state values, two a word
        assert 0.45 <= width / fp32 <= 0.56


@pytest.mark.parametrize("dtype", COMPACT)
def test_codec_round_trips_and_saturates(dtype: str) -> None:
    p = 2 * 16
    rows = torch.zeros(3, row_codec.row_width(dtype, p))
    values = torch.tensor([[1.0, -2.5, 1e-6, 7e4] * 8, [0.1] * p, [-0.0] * p])
    row_codec.encode_(rows, dtype, _C.EMBED_W, values)
    back = row_codec.decode(rows, dtype, _C.EMBED_W, p)
    want = values.to(HALF[dtype]).to(torch.float32)
    if dtype == "fp16":  # 7e4 saturates at 65504 (no Inf)
        want = torch.where(values.abs() > 65504, values.sign() * 65504, want)
    assert torch.equal(back, want)
    wide = row_codec.convert(rows, dtype, "fp32", p)
    assert torch.equal(wide[:, _C.EMBED_W :], want)
    assert torch.equal(row_codec.convert(wide, "fp32", dtype, p), rows)


@pytest.mark.parametrize("dtype", COMPACT)
def test_compact_rows_refuse_adam(dtype: str) -> None:
    with pytest.raises(ValueError, match=f"dtype '{dtype}' cannot hold SparseAdamSGDRule"):
        table(dtype, rule="adam")
    table("fp32", rule="adam")


@pytest.mark.parametrize("dtype", COMPACT)
def test_every_tier_takes_the_compact_dtypes(dtype: str) -> None:
    """The device tier and the GPU cache store compact rows too (their kernels' CPU build
    here; bit for bit against the host tier in test_cuda_device_tier.py)."""
    device = DeviceTable(table(dtype), 0, device="cpu")
    cached = CachedTable(HostTable(table(dtype), 0), 1.0, device="cpu")
    assert device.width == cached.width == HostTable(table(dtype), 0).width
    for tier in (device, cached):
        tier.close()


# -- saves and loads ---------------------------------------------------------------------
def trained(dtype: str, n: int = 300) -> tuple[EmbeddingStore, torch.Tensor]:
    """A store of one table of ``dtype``, n keys pulled and pushed a few times."""
    store = EmbeddingStore([table(dtype, embedx_threshold=0, base_threshold=0)], seed=3)
    keys = torch.arange(n, dtype=torch.int64) * 31
    store.pull("item", keys)
    gen = torch.Generator().manual_seed(2)
    for _ in range(5):
        store.push(
            "item", keys, torch.randn(n, 16, generator=gen) * 0.1, torch.ones(n), 0 * torch.ones(n)
        )
    return store, keys


@pytest.mark.parametrize("dtype", COMPACT)
def test_checkpoint_holds_the_rows_as_stored(dtype: str, tmp_path) -> None:
    store, keys = trained(dtype)
    manifest = store.save(str(tmp_path / "ckpt"))
    assert manifest["tables"]["item"]["options"]["dtype"] == dtype
    assert manifest["tables"]["item"]["width"] == _C.EMBED_W + 16  # half the fp32 row's words
    back = EmbeddingStore([table(dtype, embedx_threshold=0, base_threshold=0)], seed=3)
    back.load(str(tmp_path / "ckpt"))
    with store.exclusive("item") as a, back.exclusive("item") as b:
        assert torch.equal(a.export(0)[1], b.export(0)[1])  # every word, state included
    assert torch.equal(back.pull("item", keys), store.pull("item", keys))


@pytest.mark.parametrize(("src", "dst"), [("fp16", "fp32"), ("fp32", "bf16"), ("bf16", "fp16")])
def test_checkpoint_loads_into_another_dtype_converted(
    src: str, dst: str, tmp_path, caplog
) -> None:
    store, keys = trained(src)
    store.save(str(tmp_path / "ckpt"))
    back = EmbeddingStore([table(dtype=dst, embedx_threshold=0, base_threshold=0)], seed=3)
    with caplog.at_level("INFO"):
        back.load(str(tmp_path / "ckpt"))
    said = [r.getMessage() for r in caplog.records if "loading rows saved as" in r.getMessage()]
    assert said == [
        f"table 'item': loading rows saved as {src} into a table of dtype {dst} (converted) "
        f"from {tmp_path / 'ckpt'}"
    ]
    want = store.pull("item", keys)
    got = back.pull("item", keys)
    if dst != "fp32":
        want = want.to(HALF[dst]).to(torch.float32)  # rounded to nearest
    assert torch.equal(got, want)
    with store.exclusive("item") as a, back.exclusive("item") as b:
        assert torch.equal(a.export(0)[1][:, : _C.EMBED_W], b.export(0)[1][:, : _C.EMBED_W])
        state = row_codec.decode(b.export(0)[1], dst, _C.EMBED_W + 16, 16)
        want_state = row_codec.decode(a.export(0)[1], src, _C.EMBED_W + 16, 16)
        if dst != "fp32":
            want_state = want_state.to(HALF[dst]).to(torch.float32)
        assert torch.equal(state, want_state)


@pytest.mark.parametrize("dtype", COMPACT)
def test_checkpoint_nan_check_reads_decoded_values(dtype: str, tmp_path) -> None:
    """A NaN in the low half of a word leaves the word a finite float32: only the decoded
    values show it."""
    store, keys = trained(dtype, 4)
    with store.exclusive("item") as tier:
        k, rows = tier.export(0)
        row_codec.encode_(rows[:1], dtype, _C.EMBED_W, torch.tensor([[float("nan")]]))
        assert torch.isfinite(rows).all()
        tier.import_rows(k, rows)
    store.save(str(tmp_path / "ckpt"))
    back = EmbeddingStore([table(dtype, embedx_threshold=0)], seed=3)
    with pytest.raises(CheckpointError, match="holds NaN or Inf"):
        back.load(str(tmp_path / "ckpt"))
    with pytest.raises(CheckpointError, match="holds NaN or Inf"):
        back.load(str(tmp_path / "ckpt"), shard=(0, 1))  # the streaming (resharding) load


@pytest.mark.parametrize("dtype", COMPACT)
def test_base_and_delta_write_float32_weights(dtype: str, tmp_path) -> None:
    store, keys = trained(dtype)
    store.save(str(tmp_path / "base"), mode="base")
    got_keys = np.load(tmp_path / "base" / "item.base.keys.npy")
    values = np.load(tmp_path / "base" / "item.base.values.npy")
    assert values.dtype == np.float32 and values.shape == (keys.numel(), 16)
    assert torch.equal(torch.from_numpy(values), store.pull("item", torch.from_numpy(got_keys)))
    # a base loads into tables of any dtype (predict, warm start): the weights rounded there
    for dst in ("fp32", *COMPACT):
        model = EmbeddingStore([table(dst, embedx_threshold=0)], seed=5)
        model.load(str(tmp_path / "base"))
        want = torch.from_numpy(values)
        if dst != "fp32":
            want = want.to(HALF[dst]).to(torch.float32)
        assert torch.equal(model.pull("item", torch.from_numpy(got_keys), create=False), want)


# -- the ssd tier --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", COMPACT)
def test_ssd_beyond_its_cache_equals_host_bit_for_bit(dtype: str, tmp_path) -> None:
    """The same rows in the file's records and the cache as in RAM: a table 4x its cache
    evicts and reads back compact rows, and every push rounds with the same bits."""
    opts = table(dtype, dim=8, embedx_threshold=2)
    ssd = EmbeddingStore(
        [opts], tier="ssd", persistent_path=str(tmp_path / "ssd"), cache_budget_mb=0.05,
        capacity=20_000, seed=4,
    )  # fmt: skip
    host = EmbeddingStore([opts], seed=4)
    assert ssd.tier("item").width == host.tier("item").width == _C.EMBED_W + 8
    rng = np.random.default_rng(0)
    for _ in range(20):
        keys = (rng.zipf(1.2, 1000) % 5000).astype(np.int64)
        assert torch.equal(ssd.pull("item", keys), host.pull("item", keys))
        grads = rng.normal(0, 0.1, (1000, 8)).astype(np.float32)
        clicks = (rng.random(1000) < 0.3).astype(np.float32)
        for s in (ssd, host):
            s.push("item", keys, grads, None, clicks)
    all_keys = torch.arange(5000)
    tier = ssd.tier("item")
    assert ssd.size("item") > 2 * tier.cache_rows  # rows went through the file
    assert torch.equal(
        ssd.pull("item", all_keys, create=False), host.pull("item", all_keys, create=False)
    )
    # a checkpoint of the ssd tier (streamed, rows as stored) loads into either tier
    ssd.save(str(tmp_path / "ck"))
    assert ssd.save(str(tmp_path / "ck2"))["tables"]["item"]["options"]["dtype"] == dtype
    for back in (
        EmbeddingStore([opts], seed=4),
        EmbeddingStore(
            [opts], tier="ssd", persistent_path=str(tmp_path / "ssd2"), cache_budget_mb=0.05,
            capacity=20_000, seed=4,
        ),
    ):  # fmt: skip
        back.load(str(tmp_path / "ck"))
        assert torch.equal(
            back.pull("item", all_keys, create=False), host.pull("item", all_keys, create=False)
        )
    # a base's float32 weights into the ssd tier: rounded to nearest there
    host.save(str(tmp_path / "base"), "base")
    fresh = EmbeddingStore(
        [table(dtype, dim=8)], tier="ssd", persistent_path=str(tmp_path / "ssd3"),
        cache_budget_mb=0.05, capacity=20_000, seed=9,
    )  # fmt: skip
    fresh.load(str(tmp_path / "base"))
    keys = torch.from_numpy(np.load(tmp_path / "base" / "item.base.keys.npy"))
    want = torch.from_numpy(np.load(tmp_path / "base" / "item.base.values.npy"))
    assert torch.equal(fresh.pull("item", keys, create=False), want)  # already on the grid
