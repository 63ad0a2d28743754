"""The device tier against the host tier on the same calls: same weights pulled, same rows
after pushes with repeated keys, shrink, export, import, growth past the initial rows,
capacity. Tables are compared by key (the device numbers new rows differently). On the CPU
build of the kernels (device "cpu", everywhere) and on a GPU where there is one."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from streamrec.embedding_store.errors import (
    CapacityExceeded,
    InvalidInput,
    NonFiniteGradient,
    TierUnavailable,
)
from streamrec.embedding_store.tiers.host_table import HostTable
from streamrec.embedding_store.tiers.table_tier import SELECT_ALL, SELECT_BASE, SELECT_DELTA
from streamrec.store_schema import TableOptions

TOL = {"rtol": 1e-6, "atol": 1e-7}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_a_gpu_the_device_table_is_unavailable() -> None:
    from streamrec.embedding_store.tiers.device_table import DeviceTable

    with pytest.raises(TierUnavailable, match="needs a CUDA GPU"):
        DeviceTable(TableOptions(name="t", dim=4))


needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU; none present"
)


DEVICES = ["cpu", pytest.param("cuda", marks=needs_gpu)]


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    """Where the device tier runs: the CPU build of the kernels, or the GPU."""
    return str(request.param)


def tables(device: str, capacity: int | None = None, **kw: Any) -> tuple[HostTable, Any]:
    from streamrec.embedding_store.tiers.device_table import DeviceTable

    options = TableOptions(name="t", dim=8, embedx_threshold=2.0, **kw)
    return HostTable(options, 3, capacity), DeviceTable(options, 3, capacity, device=device)


def keys_of(n: int, distinct: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    pool = torch.randint(-(2**63), 2**63 - 1, (distinct,), generator=g)
    return pool[torch.randint(0, distinct, (n,), generator=g)]


def same_contents(host: HostTable, device: Any) -> None:
    hk, hr = host.export(SELECT_ALL)
    dk, dr = device.export(SELECT_ALL)
    ho, do = torch.argsort(hk), torch.argsort(dk)
    assert torch.equal(hk[ho], dk[do])
    torch.testing.assert_close(dr[do], hr[ho], **TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("rule", ["SparseAdaGradSGDRule", "SparseAdamSGDRule"])
def test_pulls_and_pushes_match_the_host_tier(device: str, rule: str) -> None:
    host, table = tables(device, embed_sgd_param={"name": rule}, embedx_sgd_param={"name": rule})
    g = torch.Generator().manual_seed(1)
    for step in range(5):
        keys = keys_of(3000, 2500, seed=step)  # new keys every step: growth past 1024 rows
        torch.testing.assert_close(table.pull(keys, True), host.pull(keys, True), **TOL)
        grads = torch.randn((keys.numel(), 8), generator=g) * 0.1
        shows = torch.rand(keys.numel(), generator=g) * 2
        clicks = shows * torch.rand(keys.numel(), generator=g)
        assert table.push(keys, grads, shows, clicks) and host.push(keys, grads, shows, clicks)
        assert table.size() == host.size()
    same_contents(host, table)
    assert table.counters["rows_created"] == host.counters["rows_created"]
    assert table.counters["rows_expanded"] == host.counters["rows_expanded"]
    probe = torch.cat([keys, keys_of(50, 50, seed=99)])
    for name, value in host.inspect(probe).items():
        torch.testing.assert_close(table.inspect(probe)[name], value, **TOL)
    absent = keys_of(20, 20, seed=98)
    assert not bool(table.pull(absent, False).any())


@pytest.mark.gpu
def test_day_shrink_export_and_dirty_marks_match_the_host_tier(device: str) -> None:
    host, table = tables(device, delete_after_unseen_days=1.0)
    old = keys_of(2000, 2000, seed=5).unique()
    for t in (host, table):
        t.pull(old, True)
        t.advance_day()
        t.advance_day()  # old keys are now unseen for 2 days > 1
    fresh = keys_of(500, 500, seed=6)
    ones = torch.ones(fresh.numel())
    for t in (host, table):
        t.push(fresh, torch.full((fresh.numel(), 8), 0.01), ones * 5, ones)
    for select in (SELECT_BASE, SELECT_DELTA):
        hk, _ = host.export(select)
        dk, _ = table.export(select)
        assert torch.equal(hk.sort().values, dk.sort().values)
    host.clear_dirty()
    table.clear_dirty()
    host.mark_dirty(fresh[:10])
    table.mark_dirty(fresh[:10])
    assert torch.equal(
        host.export(SELECT_DELTA)[0].sort().values, table.export(SELECT_DELTA)[0].sort().values
    )
    gone = table.shrink()  # the keys deleted: the same rows as the host tier's
    assert torch.equal(gone.sort().values, host.shrink().sort().values) and gone.numel() > 0
    same_contents(host, table)
    # after compaction the index finds every kept key
    torch.testing.assert_close(table.pull(fresh, False), host.pull(fresh, False), **TOL)


@pytest.mark.gpu
def test_import_rows_and_weights_round_trip_with_the_host_tier(device: str) -> None:
    host, table = tables(device)
    keys = keys_of(1500, 1500, seed=7).unique()
    host.pull(keys, True)
    host.push(
        keys,
        torch.randn((keys.numel(), 8)) * 0.1,
        torch.ones(keys.numel()) * 3,
        torch.ones(keys.numel()),
    )
    k, rows = host.export(SELECT_ALL)
    table.import_rows(k, rows)
    same_contents(host, table)
    other_host, other_device = tables(device)
    values = torch.randn((k.numel(), 8))
    values[::3, 1:] = 0
    other_host.import_weights(k, values)
    other_device.import_weights(k, values)
    same_contents(other_host, other_device)
    with pytest.raises(InvalidInput, match="rows must be"):
        table.import_rows(k, rows[:, :3])
    table.reset()
    assert table.size() == 0 and not bool(table.pull(k, False).any())


@pytest.mark.gpu
def test_capacity_and_admission_are_refused_by_name(device: str) -> None:
    first = keys_of(1000, 1000, seed=8).unique()
    more = keys_of(500, 500, seed=9).unique()
    more = more[~torch.isin(more, first)]
    assert more.numel() > 100
    capacity = first.numel() + 100
    _, table = tables(device, capacity=capacity)
    table.pull(first, True)
    before = table.size()
    with pytest.raises(CapacityExceeded, match=f"capacity {capacity}"):
        table.pull(more, True)
    assert table.size() == before
    with pytest.raises(InvalidInput, match="admission"):
        tables(device, admission_probability=0.5)


@pytest.mark.gpu
@needs_gpu
def test_checkpoints_round_trip_between_the_device_and_host_tiers(tmp_path: Any) -> None:
    from streamrec.embedding_store import EmbeddingStore

    options = TableOptions(name="t", dim=8, embedx_threshold=2.0)
    device = EmbeddingStore([options], seed=3, tier="device")
    host = EmbeddingStore([options], seed=3)
    keys = keys_of(3000, 2000, seed=11)
    grads = torch.randn((keys.numel(), 8)) * 0.1
    for s in (device, host):
        s.pull("t", keys)
        s.push("t", keys, grads, torch.ones(keys.numel()) * 3, torch.ones(keys.numel()))
    device.save(str(tmp_path / "from-device"), "checkpoint")
    host.save(str(tmp_path / "from-host"), "checkpoint")
    loaded_host, loaded_device = (
        EmbeddingStore([options], seed=3),
        EmbeddingStore([options], seed=3, tier="device"),
    )
    loaded_host.load(str(tmp_path / "from-device"))
    loaded_device.load(str(tmp_path / "from-host"))
    for s in (loaded_host, loaded_device, device):
        torch.testing.assert_close(s.pull("t", keys, create=False), host.pull("t", keys, False))


@pytest.mark.gpu
@needs_gpu
def test_a_device_table_checks_and_applies_gpu_gradients_on_the_gpu(monkeypatch) -> None:
    """Gradients already on the table's GPU are checked there (not by the host's C++ check,
    which would need them copied over) and give the rows that the same push from host
    memory gives; a NaN among them is refused naming the first bad key."""
    from streamrec.embedding_store import EmbeddingStore, validation

    options = [TableOptions(name="t", dim=8)]
    on_gpu = EmbeddingStore(options, tier="device")
    from_host = EmbeddingStore(options, tier="device")
    keys = keys_of(4096, 1000, seed=5)
    grads = torch.randn(keys.numel(), 8, generator=torch.Generator().manual_seed(6))
    shows, clicks = torch.ones(keys.numel()), (torch.arange(keys.numel()) % 2).float()
    from_host.push("t", keys, grads, shows, clicks)

    def host_check(*_: Any) -> tuple[int, int]:
        raise AssertionError("GPU gradients went through the host's check")

    monkeypatch.setattr(validation._C, "check_push", host_check)
    on_gpu.push("t", keys, grads.cuda(), shows.cuda(), clicks.cuda())
    got, want = on_gpu.pull("t", keys, create=False), from_host.pull("t", keys, create=False)
    assert torch.equal(got, want)
    bad = grads.cuda()
    bad[7, 3] = float("nan")
    with pytest.raises(NonFiniteGradient, match=f"first key {int(keys[7])}"):
        on_gpu.push("t", keys, bad)


@pytest.mark.gpu
@needs_gpu
def test_a_tables_ops_run_in_call_order_whichever_stream_calls() -> None:
    """Two callers with streams of their own (as two threads' current streams): the first
    queues a long kernel, then the day advance and the dirty marks cleared, and returns (the
    table's lock released with that work still queued); the second pushes at once from its
    idle stream. The push runs after them (unseen_days 0 after it, its rows dirty), as on the
    host tier."""
    host, table = tables("cuda")
    keys = keys_of(2048, 1500, seed=21)
    g = torch.Generator().manual_seed(22)
    grads = torch.randn((keys.numel(), 8), generator=g) * 0.1
    shows = torch.rand(keys.numel(), generator=g)
    for t in (host, table):
        t.pull(keys, True)
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(first):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time ahead of the table's work
        table.advance_day()
        table.clear_dirty()
    with torch.cuda.stream(second):
        assert table.push(keys[:1000], grads[:1000], shows[:1000], shows[:1000] * 0.5)
        pulled = table.pull_resident(keys, False)
    host.advance_day()
    host.clear_dirty()
    host.push(keys[:1000], grads[:1000], shows[:1000], shows[:1000] * 0.5)
    with torch.cuda.stream(second):  # the pulled weights are ready on the caller's stream
        torch.testing.assert_close(pulled.cpu(), host.pull(keys, False), **TOL)
    same_contents(host, table)
    delta = [t.export(SELECT_DELTA)[0].sort().values for t in (host, table)]
    assert torch.equal(delta[0], delta[1])


# -- compact rows (dtype fp16 / bf16): the host tier's words, bit for bit ------------------
COMPACT = ["fp16", "bf16"]
COMPACT_RULES = ["SparseNaiveSGDRule", "SparseAdaGradSGDRule"]


def compact_options(dtype: str, rule: str, dim: int = 8, name: str = "t") -> TableOptions:
    sgd = {"name": rule}
    return TableOptions(
        name=name, dim=dim, dtype=dtype, embedx_threshold=2.0, embed_sgd_param=sgd,
        embedx_sgd_param=sgd,
    )  # fmt: skip


def same_words(host: Any, device: Any) -> None:
    """Both tables hold the same keys and the same rows bit for bit: the header words and the
    payload's 16-bit values (not the pad half after an odd payload, which neither tier's
    initializer writes: its bits are whatever the new rows' memory held)."""
    hk, hr = host.export(SELECT_ALL)
    dk, dr = device.export(SELECT_ALL)
    ho, do = torch.argsort(hk), torch.argsort(dk)
    assert torch.equal(hk[ho], dk[do])
    hr, dr = hr[ho], dr[do]
    assert torch.equal(dr[:, :4].view(torch.int32), hr[:, :4].view(torch.int32))
    payload = host.payload
    halves = [r[:, 4:].contiguous().view(torch.int16)[:, :payload] for r in (hr, dr)]
    assert torch.equal(halves[1], halves[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [8, 9, 16])
@pytest.mark.parametrize("rule", COMPACT_RULES)
@pytest.mark.parametrize("dtype", COMPACT)
def test_compact_pulls_and_pushes_are_the_host_tiers_bit_for_bit(
    device: str, dtype: str, rule: str, dim: int
) -> None:
    from streamrec.embedding_store.tiers.device_table import DeviceTable

    options = compact_options(dtype, rule, dim)
    host, table = HostTable(options, 3), DeviceTable(options, 3, device=device)
    assert table.width == host.width < 4 + dim  # compact: fewer words than an fp32 row
    g = torch.Generator().manual_seed(1)
    for step in range(4):
        keys = keys_of(3000, 2500, seed=step)  # new keys every step: growth past 1024 rows
        assert torch.equal(table.pull(keys, True), host.pull(keys, True))
        grads = torch.randn((keys.numel(), dim), generator=g) * 0.1
        shows = torch.rand(keys.numel(), generator=g) * 2
        clicks = shows * torch.rand(keys.numel(), generator=g)
        assert table.push(keys, grads, shows, clicks) and host.push(keys, grads, shows, clicks)
    same_words(host, table)
    assert table.counters["rows_expanded"] == host.counters["rows_expanded"] > 0
    for name, value in host.inspect(keys).items():
        assert torch.equal(table.inspect(keys)[name], value)
    assert torch.equal(table.pull(keys, False), host.pull(keys, False))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", COMPACT)
def test_compact_imports_and_exports_are_the_host_tiers_bit_for_bit(
    device: str, dtype: str
) -> None:
    from streamrec.embedding_store.tiers.device_table import DeviceTable

    options = compact_options(dtype, "SparseAdaGradSGDRule", dim=9)
    host = HostTable(options, 3)
    keys = keys_of(1500, 1500, seed=7).unique()
    host.pull(keys, True)
    host.push(keys, torch.randn((keys.numel(), 9)) * 0.1, torch.ones(keys.numel()) * 3,
              torch.ones(keys.numel()))  # fmt: skip
    k, rows = host.export(SELECT_ALL)
    table = DeviceTable(options, 3, device=device)
    table.import_rows(k, rows)  # the words as stored
    same_words(host, table)
    # weights encoded to nearest as the host tier does: fp16 saturating, embedx zeros kept
    values = torch.randn((k.numel(), 9)) * 100
    values[::3, 1:] = 0
    values[1, 2], values[2, 3] = 1e6, -1e6
    other_host, other_device = HostTable(options, 3), DeviceTable(options, 3, device=device)
    for t in (other_host, other_device, host, table):
        t.import_weights(k, values)
    same_words(other_host, other_device)
    same_words(host, table)
    assert torch.equal(table.pull(k, False), host.pull(k, False))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", COMPACT)
def test_compact_store_blocks_and_checkpoints_match_the_host_tier(
    device: str, dtype: str, tmp_path: Any
) -> None:
    """Two compact tables through the store (the device tier's block pulls and pushes, a
    push counter per table as the host tier's), then checkpoints loaded across tiers."""
    from streamrec.embedding_store import EmbeddingStore

    options = [compact_options(dtype, "SparseAdaGradSGDRule", 8, name) for name in ("a", "b")]
    on_device = EmbeddingStore(options, seed=3, tier="device", device=device)
    host = EmbeddingStore(options, seed=3)
    g = torch.Generator().manual_seed(4)
    for step in range(3):
        keys = {name: keys_of(2000, 1500, seed=10 * step + i) for i, name in enumerate("ab")}
        for s in (on_device, host):
            for name in "ab":
                s.pull(name, keys[name])
        for name in "ab":
            grads = torch.randn((keys[name].numel(), 8), generator=g) * 0.1
            ones = torch.ones(keys[name].numel())
            for s in (on_device, host):
                s.push(name, keys[name], grads, ones * 3, ones)
    for step in range(3):  # blocks: one pull and one push of both tables a step
        both = [keys_of(1500, 1200, seed=50 + step), keys_of(1000, 900, seed=60 + step)]
        counts, flat = [k.numel() for k in both], torch.cat(both)
        pulled = [s.pull_rows(["a", "b"], flat, counts).cpu() for s in (on_device, host)]
        assert torch.equal(pulled[0], pulled[1])
        grads = torch.randn((flat.numel(), 8), generator=g) * 0.1
        shows = torch.rand(flat.numel(), generator=g) * 3
        for s in (on_device, host):
            s.push_rows(["a", "b"], flat, counts, grads, shows, shows * 0.5)
        keys = {"a": torch.cat([keys["a"], both[0]]), "b": torch.cat([keys["b"], both[1]])}
    small = [keys["a"][:50], keys["b"][:40]]
    flat = torch.cat(small)
    for _ in range(4):  # no growth, the same descriptor: each push still draws new bits
        grads = torch.randn((flat.numel(), 8), generator=g) * 0.1
        for s in (on_device, host):
            s.push_rows(["a", "b"], flat, [50, 40], grads)
    for name in "ab":
        assert torch.equal(
            on_device.pull(name, keys[name], create=False), host.pull(name, keys[name], False)
        )
    on_device.save(str(tmp_path / "from-device"), "checkpoint")
    host.save(str(tmp_path / "from-host"), "checkpoint")
    loaded_host = EmbeddingStore(options, seed=3)
    loaded_device = EmbeddingStore(options, seed=3, tier="device", device=device)
    loaded_host.load(str(tmp_path / "from-device"))
    loaded_device.load(str(tmp_path / "from-host"))
    for name in "ab":
        want = host.pull(name, keys[name], False)
        for s in (loaded_host, loaded_device):
            assert torch.equal(s.pull(name, keys[name], create=False), want)


@pytest.mark.gpu
@pytest.mark.parametrize("rule", COMPACT_RULES)
@pytest.mark.parametrize("dtype", COMPACT)
def test_a_compact_gpu_cache_is_the_host_tier_bit_for_bit(
    device: str, dtype: str, rule: str
) -> None:
    """A GPU cache of compact rows (gather decoding, pushes on the cached rows with the
    backing table's push counter) in front of a host table, against a host table alone."""
    from streamrec.embedding_store.tiers.cached_table import CachedTable

    options = compact_options(dtype, rule, dim=9)
    host, cached = HostTable(options, 3), CachedTable(HostTable(options, 3), 1.0, device=device)
    g = torch.Generator().manual_seed(2)
    for step in range(4):
        keys = keys_of(400, 400, seed=70 + step % 2).unique()  # cached from the second pull on
        assert torch.equal(cached.pull(keys, True).cpu(), host.pull(keys, True))
        grads = torch.randn((keys.numel(), 9), generator=g) * 0.1
        shows = torch.rand(keys.numel(), generator=g) * 3
        for t in (cached, host):
            assert t.push(keys, grads, shows, shows * 0.5)
    assert cached.gpu_counters["gpu_cache_hits"] > 0
    assert torch.equal(cached.pull(keys, False).cpu(), host.pull(keys, False))
    same_words(host, cached)
