"""The device tier's chunked rows (device_rows.RowChunks): growth that allocates only new
chunks and moves no row, compaction in place across chunk borders, and the refusals, on the
CPU build of the kernels (and on a GPU where there is one). Small chunks (8 to 64 rows) so
that a few hundred rows cross many chunk borders."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from streamrec.embedding_store.errors import CapacityExceeded, InvalidInput
from streamrec.embedding_store.tiers import cuda_ext
from streamrec.embedding_store.tiers.device_rows import RowChunks, chunk_shift
from streamrec.embedding_store.tiers.host_table import HostTable
from streamrec.embedding_store.tiers.table_tier import SELECT_ALL
from streamrec.store_schema import TableOptions

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_gpu)]
OPTIONS = TableOptions(name="t", dim=8, embedx_threshold=2.0, delete_after_unseen_days=1.0)


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def device_table(device: str, chunk_rows: int, capacity: int | None = None) -> Any:
    from streamrec.embedding_store.tiers.device_table import DeviceTable

    return DeviceTable(OPTIONS, 3, capacity, device=device, chunk_rows=chunk_rows)


def distinct_keys(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**62), 2**62, (n,), generator=g).unique()


def push_some(table: Any, keys: torch.Tensor, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    shows = torch.rand(keys.numel(), generator=g) * 4
    grads = torch.randn((keys.numel(), 8), generator=g) * 0.1
    assert table.push(keys, grads, shows, shows * 0.5)


def contents(table: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows sorted by key: (keys, rows)."""
    k, r = table.export(SELECT_ALL)
    order = torch.argsort(k)
    return k[order], r[order]


def test_chunk_shift_starts_with_one_chunk_and_caps_the_chunk_bytes() -> None:
    assert chunk_shift(1024, 16) == 10
    assert chunk_shift(1000, 16) == 10
    assert chunk_shift(1, 16) == 0
    assert chunk_shift(1 << 30, 16) == 22  # 2**22 rows * 64 bytes = 256 MiB
    assert chunk_shift(1 << 30, 16, max_bytes=1 << 20) == 14


@pytest.mark.gpu
def test_growth_adds_chunks_and_keeps_every_row_bit_for_bit(device: str) -> None:
    table = device_table(device, chunk_rows=64)
    first = distinct_keys(300, seed=1)
    table.pull(first, True)
    push_some(table, first, seed=2)
    before_keys, before_rows = contents(table)
    chunks = table.row_chunks().chunks()
    addresses = [c.data_ptr() for c in chunks]
    more = distinct_keys(1500, seed=3)
    more = more[~torch.isin(more, first)]
    table.pull(more, True)  # grows from 1024 rows (16 chunks) past 1800 (29 chunks)
    grown = table.row_chunks()
    # the old chunks are the same tensors: nothing was copied or moved
    assert [c.data_ptr() for c in grown.chunks()[: len(chunks)]] == addresses
    assert all(a is b for a, b in zip(grown.chunks(), chunks, strict=False))
    after_keys, after_rows = contents(table)
    at = torch.isin(after_keys, before_keys)
    assert torch.equal(after_keys[at], before_keys)
    assert torch.equal(after_rows[at], before_rows)  # bit for bit
    # never more than the rows plus one chunk: whole chunks, values and keys
    size = table.size()
    assert len(grown.chunks()) == -(-size // 64) == grown.rows // 64
    row_bytes = 4 * table.row_chunks().stride + 8
    assert grown.nbytes() == len(grown.chunks()) * 64 * row_bytes
    assert grown.nbytes() < (size + 64) * row_bytes
    assert table.bytes_used()["device"] == grown.nbytes() + table._slots.numel() * 8


@pytest.mark.gpu
def test_shrink_compacts_across_chunk_borders_as_the_host_tier(device: str) -> None:
    host = HostTable(OPTIONS, 3)
    table = device_table(device, chunk_rows=16)
    old = distinct_keys(700, seed=4)
    for t in (host, table):
        t.pull(old, True)
        t.advance_day()
        t.advance_day()  # unseen for 2 days > 1: every old row is dropped unless pushed
    kept = old[torch.randperm(old.numel(), generator=torch.Generator().manual_seed(5))[:250]]
    for t in (host, table):
        push_some(t, kept, seed=6)
    chunks = table.row_chunks().chunks()
    gone = table.shrink()  # the keys deleted: the same rows as the host tier's
    assert torch.equal(gone.sort().values, host.shrink().sort().values)
    assert gone.numel() >= old.numel() - kept.numel()  # and low scores
    hk, hr = contents(host)
    dk, dr = contents(table)
    assert torch.equal(hk, dk)
    torch.testing.assert_close(dr, hr, rtol=1e-6, atol=1e-7)
    # in place: the chunks still needed are the same tensors; the 1024 initial rows stay
    after = table.row_chunks().chunks()
    assert all(a is b for a, b in zip(after, chunks, strict=False))
    assert table.row_chunks().rows == 1024
    torch.testing.assert_close(
        table.pull(kept, False), host.pull(kept, False), **{"rtol": 1e-6, "atol": 1e-7}
    )


@pytest.mark.gpu
@pytest.mark.parametrize("keep_fraction", [0.0, 0.1, 0.5, 0.97, 1.0])
def test_compact_equals_the_numpy_reference(device: str, keep_fraction: float) -> None:
    """RowChunks.compact against numpy's fancy indexing, bit for bit, chunks of 8 rows; the
    padding columns (past the width) are neither read nor written: each row keeps its own."""
    ops = cuda_ext.load_cpu() if device == "cpu" else cuda_ext.load(device)
    gp = _params()
    rows = RowChunks(gp.stride, 3, ops.device)
    n = 203  # 26 chunks, the last one partly used
    rows.reserve(n)
    g = torch.Generator().manual_seed(7)
    values = torch.randn((n, gp.stride), generator=g)
    keys = torch.randint(-(2**62), 2**62, (n,), generator=g)
    every = torch.arange(n, device=ops.device)
    ops.write_rows(rows, every, 0, values.to(ops.device), gp, keys.to(ops.device))
    mask = torch.rand(n, generator=g) < keep_fraction
    mask[:5] = keep_fraction > 0.9  # a kept prefix (blocks already in place) or none
    idx = mask.nonzero().squeeze(1)
    rows.compact(ops, idx.to(ops.device), gp)
    m = idx.numel()
    out_keys = torch.empty(m, dtype=torch.int64, device=ops.device)
    got = ops.read_rows(rows, every[:m], 0, gp.stride, gp, out_keys=out_keys).cpu().numpy()
    assert gp.stride > gp.width  # padded rows
    assert np.array_equal(got[:, : gp.width], values.numpy()[idx.numpy(), : gp.width])
    assert np.array_equal(got[:, gp.width :], values.numpy()[:m, gp.width :])
    assert np.array_equal(out_keys.cpu().numpy(), keys.numpy()[idx.numpy()])


@pytest.mark.gpu
def test_rows_full_and_capacity_refusals_with_chunks(device: str) -> None:
    ops = cuda_ext.load_cpu() if device == "cpu" else cuda_ext.load(device)
    gp = _params()
    rows = RowChunks(gp.stride, 3, ops.device)
    rows.reserve(16)  # two chunks of 8
    slots = ops.index_new(64)
    next_row = torch.zeros(1, dtype=torch.int64, device=ops.device)
    keys = distinct_keys(20, seed=8).to(ops.device)
    with pytest.raises(cuda_ext.RowsFull):
        ops.find_or_insert(slots, keys, next_row, rows, None, gp)
    assert int(next_row.item()) == 16  # ids past R given back: no hole on the retry
    rows.reserve(20)
    got = ops.find_or_insert(slots, keys, next_row, rows, None, gp)
    assert sorted(got.cpu().tolist()) == list(range(20))
    out_keys = torch.empty(20, dtype=torch.int64, device=ops.device)
    ops.read_rows(rows, got, 0, 1, gp, out_keys=out_keys)
    assert torch.equal(out_keys.cpu(), keys.cpu())
    with pytest.raises(cuda_ext.CudaOpError, match="ROW|outside|row"):
        ops.read_rows(rows, torch.tensor([rows.rows], device=ops.device), 0, 1, gp)
    with pytest.raises(ValueError, match="stride"):
        ops.gather(RowChunks(gp.stride + 4, 3, ops.device), got, gp)
    table = device_table(device, chunk_rows=8, capacity=1030)
    table.pull(distinct_keys(1000, seed=9), True)
    with pytest.raises(CapacityExceeded, match="capacity 1030"):
        table.pull(distinct_keys(100, seed=10), True)
    with pytest.raises(InvalidInput, match="power of two"):
        device_table(device, chunk_rows=12)


def _params() -> cuda_ext.TableParams:
    from streamrec.embedding_store.tiers.table_tier import table_params

    return cuda_ext.TableParams.of(table_params(OPTIONS, 3), pad=True)
