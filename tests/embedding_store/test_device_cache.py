"""The GPU cache of a host or ssd table (``gpu_cache_budget_mb``, device_cache.py).

Its bookkeeping and rows are torch tensors on a device and its row ops the CUDA extension's,
so every scenario runs for real on ``"cpu"`` (the CPU build of the kernels) and, marked ``gpu``,
on ``"cuda"`` (adding pinned staging and streams): hits and misses, eviction order, bypass, a
table far larger than the cache, duplicate keys, write-back (the backing table's rows equal a
no-cache run's once flushed; bit for bit, the same fused update runs on the same rows), save
and the whole-table operations flushing first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from streamrec.embedding_store import EmbeddingStore, TableOptions
from streamrec.embedding_store.errors import TierUnavailable
from streamrec.embedding_store.tiers.cached_table import CachedTable, SlotMap, cache_slots
from streamrec.embedding_store.tiers.host_table import HostTable
from streamrec.embedding_store.tiers.table_tier import SELECT_ALL
from streamrec.errors import BadRequest

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="the cache on a GPU (pinned staging, CUDA streams): needs a CUDA GPU; none present",
)
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_gpu])]
DIM = 8


def table(**kw: Any) -> TableOptions:
    return TableOptions(
        name="t",
        dim=DIM,
        embedx_threshold=2.0,
        embed_sgd_param={"name": "adagrad"},
        embedx_sgd_param={"name": "adam"},
        **kw,
    )


def budget_for(rows: int) -> float:
    """A budget in MiB that holds exactly ``rows`` slots of ``table()``."""
    width = HostTable(table()).width
    mb = rows * (4 * width + 18) / 2**20
    assert cache_slots(mb, width) == rows
    return mb


def sorted_export(store: EmbeddingStore) -> tuple[torch.Tensor, torch.Tensor]:
    with store.exclusive("t") as tier:
        keys, rows = tier.export(SELECT_ALL)
    order = torch.argsort(keys)
    return keys[order], rows[order]


def same_rows(a: EmbeddingStore, b: EmbeddingStore) -> None:
    ak, ar = sorted_export(a)
    bk, br = sorted_export(b)
    assert torch.equal(ak, bk) and torch.equal(ar, br)


def batches(steps: int, n: int, space: int, seed: int) -> list[torch.Tensor]:
    """Skewed batches (a hot head and a long tail), duplicates included."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        hot = torch.randint(0, 64, (n // 2,), generator=g)
        cold = torch.randint(0, space, (n - n // 2,), generator=g)
        out.append(torch.cat([hot, cold])[torch.randperm(n, generator=g)] * 7919 - 3)
    return out


def run_side_by_side(plain: EmbeddingStore, cached: EmbeddingStore, steps: int = 12) -> None:
    """The same pulls and pushes on both stores; every pull must agree bit for bit."""
    g = torch.Generator().manual_seed(4)
    for keys in batches(steps, 600, 5000, seed=1):
        assert torch.equal(cached.pull("t", keys), plain.pull("t", keys))
        grads = torch.randn(keys.numel(), DIM, generator=g) * 0.1
        shows = torch.rand(keys.numel(), generator=g) * 2
        clicks = shows * torch.rand(keys.numel(), generator=g)
        for s in (plain, cached):
            s.push("t", keys, grads, shows, clicks)


# ---- the bookkeeping ---------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_slot_map_hits_misses_and_eviction_order(device: str) -> None:
    m = SlotMap(4, ways=4, device=device)  # one set of four ways: order is all that matters
    keys = torch.tensor([10, 11, 12], device=device)
    m.begin()
    assert torch.equal(m.lookup(keys), torch.full((3,), -1, device=device))
    first = m.claim(keys)
    assert sorted(first.tolist()) == [0, 1, 2]  # empty ways, in order
    m.fill(first, keys)
    assert torch.equal(m.lookup(keys), first)
    m.begin()  # tick 2: 13 takes the last empty way, 11 is used again
    m.fill(m.claim(torch.tensor([13], device=device)), torch.tensor([13], device=device))
    m.touch(m.lookup(torch.tensor([11], device=device)))
    m.begin()  # tick 3: the oldest are 10 and 12 (tick 1), 10 in the lower way first
    new = torch.tensor([20, 21], device=device)
    got = m.claim(new)
    assert got.tolist() == m.lookup(torch.tensor([10, 12], device=device)).tolist()
    m.fill(got, new)
    assert (m.lookup(torch.tensor([10, 12], device=device)) < 0).all()
    assert (m.lookup(torch.tensor([11, 13, 20, 21], device=device)) >= 0).all()
    # a call never evicts what it touched; misses beyond the free ways are bypassed
    m.begin()
    m.touch(m.lookup(torch.tensor([11, 13, 20], device=device)))
    got = m.claim(torch.tensor([30, 31], device=device))
    assert got.tolist() == [int(m.lookup(torch.tensor([21], device=device))), -1]


@pytest.mark.parametrize("device", DEVICES)
def test_slot_map_spreads_keys_over_sets_and_dirty_slots_are_reported(device: str) -> None:
    m = SlotMap(64, ways=4, device=device)
    assert (m.sets, m.ways) == (16, 4)
    keys = torch.arange(48, device=device) * 1024  # a stride that a plain modulo would pile up
    sets = m.set_of(keys)
    assert sets.min() >= 0 and sets.max() < 16 and sets.unique().numel() >= 12
    m.begin()
    slots = m.claim(keys)
    placed = slots >= 0
    m.fill(slots[placed], keys[placed])
    m.dirty[slots[placed][:5]] = True
    assert set(m.changed().tolist()) == set(slots[placed][:5].tolist())
    assert set(m.occupied(slots[placed]).tolist()) == set(slots[placed][:5].tolist())
    assert m.size() == int(placed.sum())


# ---- the cache in front of a table, through the store ---------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_cached_host_table_matches_a_table_without_cache(device: str) -> None:
    plain = EmbeddingStore([table()], seed=5)
    cached = EmbeddingStore(
        [table()], seed=5, gpu_cache_budget_mb=budget_for(256), gpu_cache_device=device
    )
    run_side_by_side(plain, cached)
    tier = cached.tier("t")
    assert isinstance(tier, CachedTable)
    assert cached.size("t") == plain.size("t") > 4 * tier.map.slots  # larger than the cache
    assert int(tier.map.changed().numel()) > 0  # rows only the cache holds yet
    # save (export) flushes first: the backing table then equals the no-cache run's
    pk, pr = sorted_export(plain)
    ck, cr = sorted_export(cached)
    assert torch.equal(pk, ck) and torch.equal(pr, cr)
    assert tier.map.changed().numel() == 0
    bk, br = tier.backing.export(SELECT_ALL)
    order = torch.argsort(bk)
    assert torch.equal(bk[order], pk) and torch.equal(br[order], pr)
    s = cached.stats()["tables"]["t"]
    assert s["gpu_cache_hits"] > 0 and s["gpu_cache_misses"] > 0
    assert s["gpu_cache_hit_rate"] == pytest.approx(
        s["gpu_cache_hits"] / (s["gpu_cache_hits"] + s["gpu_cache_misses"])
    )
    assert s["rows_by_tier"]["device"] == tier.map.size() <= 256
    assert s["rows_by_tier"]["host"] == plain.size("t")
    assert s["bytes"]["device"] > 0
    assert s["rows_expanded"] == plain.stats()["tables"]["t"]["rows_expanded"] > 0


@pytest.mark.parametrize("device", DEVICES)
def test_hit_and_miss_counts_of_known_calls(device: str) -> None:
    store = EmbeddingStore([table()], gpu_cache_budget_mb=budget_for(64), gpu_cache_device=device)
    keys = torch.tensor([1, 2, 3, 2, 1])  # 3 distinct keys: counted once each
    store.pull("t", keys)
    store.pull("t", keys)
    store.push("t", torch.tensor([1, 2, 9]), torch.zeros(3, DIM))
    s = store.stats()["tables"]["t"]
    assert (s["gpu_cache_hits"], s["gpu_cache_misses"]) == (3 + 2, 3 + 1)
    assert s["gpu_cache_hit_rate"] == pytest.approx(5 / 9)
    assert s["rows"] == 4  # the push created key 9 in the backing table


@pytest.mark.parametrize("device", DEVICES)
def test_absent_keys_read_zeros_and_are_not_cached(device: str) -> None:
    store = EmbeddingStore([table()], gpu_cache_budget_mb=budget_for(64), gpu_cache_device=device)
    keys = torch.tensor([5, 6, 5])
    assert not store.pull("t", keys, create=False).any()
    assert store.size("t") == 0 and store.tier("t").map.size() == 0  # type: ignore[attr-defined]
    w = store.pull("t", keys)
    assert torch.equal(w, store.pull("t", keys, create=False))
    assert torch.equal(w[0], w[2])


@pytest.mark.parametrize("device", DEVICES)
def test_whole_table_operations_flush_first(device: str, tmp_path: Path) -> None:
    """Day, shrink, inspect, checkpoint save and load agree with a no-cache store."""
    opts = table(delete_after_unseen_days=1.0)
    plain = EmbeddingStore([opts], seed=2)
    cached = EmbeddingStore(
        [opts], seed=2, gpu_cache_budget_mb=budget_for(128), gpu_cache_device=device
    )
    run_side_by_side(plain, cached, steps=4)
    probe = batches(1, 300, 5000, seed=1)[0]
    for name, value in plain.inspect("t", probe).items():
        assert torch.equal(cached.inspect("t", probe)[name], value), name
    for s in (plain, cached):
        s.advance_day()
        s.advance_day()
    run_side_by_side(plain, cached, steps=2)  # touches some rows: they survive the shrink
    assert cached.shrink() == plain.shrink()
    same_rows(plain, cached)
    run_side_by_side(plain, cached, steps=2)
    cached.save(str(tmp_path / "ckpt"), "checkpoint")
    fresh = EmbeddingStore([opts], seed=2)
    fresh.load(str(tmp_path / "ckpt"))
    same_rows(plain, fresh)
    # loading into a cached store drops what the cache held
    cached.push("t", probe.unique(), torch.ones(probe.unique().numel(), DIM))
    cached.load(str(tmp_path / "ckpt"))
    same_rows(plain, cached)
    assert torch.equal(cached.pull("t", probe), plain.pull("t", probe))


@pytest.mark.parametrize("device", DEVICES)
def test_cached_ssd_table_matches_a_table_without_cache(device: str, tmp_path: Path) -> None:
    ssd = {"tier": "ssd", "capacity": 20_000, "cache_budget_mb": 0.25}
    plain = EmbeddingStore([table()], seed=1, persistent_path=str(tmp_path / "a"), **ssd)
    cached = EmbeddingStore(
        [table()],
        seed=1,
        persistent_path=str(tmp_path / "b"),
        gpu_cache_budget_mb=budget_for(128),
        gpu_cache_device=device,
        **ssd,
    )
    run_side_by_side(plain, cached, steps=6)
    same_rows(plain, cached)
    s = cached.stats()["tables"]["t"]
    assert set(s["rows_by_tier"]) == {"host", "ssd", "device"}
    cached.close()
    plain.close()


def test_the_option_is_refused_where_it_cannot_do_what_it_says() -> None:
    with pytest.raises(BadRequest, match="gpu_cache_budget_mb caches rows of tier 'host'"):
        EmbeddingStore([table()], tier="device", gpu_cache_budget_mb=1.0)
    with pytest.raises(BadRequest, match="gpu_cache_device"):
        EmbeddingStore([table()], gpu_cache_budget_mb=1.0, gpu_cache_device="tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_a_gpu_a_cuda_cache_says_it_needs_one(tmp_path: Path) -> None:
    with pytest.raises(TierUnavailable, match="needs a CUDA GPU"):
        EmbeddingStore([table()], gpu_cache_budget_mb=1.0)
    # the ssd table made before the refusal let its directory go (its lock file)
    ssd = {"tier": "ssd", "capacity": 100, "cache_budget_mb": 1.0}
    for _ in range(2):
        with pytest.raises(TierUnavailable):
            EmbeddingStore([table()], persistent_path=str(tmp_path), gpu_cache_budget_mb=1.0, **ssd)
