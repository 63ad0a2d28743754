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
