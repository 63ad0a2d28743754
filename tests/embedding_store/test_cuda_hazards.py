"""The CUDA ops at their edges, on the CPU build of the kernels (everywhere) and on a GPU:
hot keys, dim 128, rows full and the retry after growth, tombstones at high index load,
arguments the kernels would misread, the update's scratch, and the device guard."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import pytest
import streamrec.embedding_store._C as _C
import torch
from streamrec.embedding_store.tiers import cuda_ext
from streamrec.embedding_store.tiers.table_tier import table_params
from streamrec.store_schema import SgdRuleParam, TableOptions

pytestmark = pytest.mark.gpu

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_gpu)]
TOL = {"rtol": 1e-6, "atol": 1e-7}


@pytest.fixture(scope="module", params=DEVICES)
def ops(request: pytest.FixtureRequest) -> cuda_ext.CudaOps:
    return cuda_ext.load_cpu() if request.param == "cpu" else cuda_ext.load(request.param)


def params(dim: int = 8, rule: str = "SparseAdaGradSGDRule", **kw: Any) -> tuple[Any, Any]:
    sgd = SgdRuleParam(name=rule)
    options = TableOptions(name="t", dim=dim, embed_sgd_param=sgd, embedx_sgd_param=sgd, **kw)
    p = table_params(options, seed=5)
    return p, cuda_ext.TableParams.of(p)


def distinct_keys(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**63), 2**63 - 1, (2 * n,), generator=g).unique()[:n]


def on(ops: cuda_ext.CudaOps, t: torch.Tensor) -> torch.Tensor:
    """A copy of t on the ops' device (never the same storage as the CPU core's)."""
    return t.to(ops.device, copy=True)


@pytest.mark.parametrize("dim,rule", [(8, "SparseAdamSGDRule"), (128, "SparseAdaGradSGDRule")])
def test_a_hot_key_repeated_100k_times_sums_as_the_cpu_core(
    ops: cuda_ext.CudaOps, dim: int, rule: str
) -> None:
    """One key at 10^5 positions (summed by many threads, in pieces), beside keys seen once
    and a few repeated across piece borders; dim 128 as in production."""
    p, gp = params(dim, rule, embedx_threshold=0.0)
    rows_n = 300
    keys = distinct_keys(rows_n, seed=1)
    data = torch.zeros((rows_n, p.width))
    _C.init_rows(data, keys, 0, rows_n, p)
    g = torch.Generator().manual_seed(2)
    hot = torch.zeros(100_000, dtype=torch.int64)  # row 0
    warm = torch.randint(1, 20, (5_000,), generator=g)  # rows 1..19, spanning pieces
    once = torch.arange(20, rows_n)
    rows = torch.cat([hot, warm, once])[torch.randperm(105_000 + rows_n - 20, generator=g)]
    grads = torch.randn((rows.numel(), dim), generator=g) * 1e-3
    shows = torch.rand(rows.numel(), generator=g)
    clicks = shows * 0.5
    device_data = on(ops, data)
    got = ops.update(
        device_data, on(ops, keys), on(ops, rows), on(ops, grads), on(ops, shows),
        on(ops, clicks), gp,
    )  # fmt: skip
    want = _C.update(data, keys, rows, grads, shows, clicks, p)
    assert got == want
    torch.testing.assert_close(device_data.cpu(), data, rtol=1e-5, atol=1e-6)
    # the hot row took every position's show: 10^5 of them
    assert float(device_data[0, _C.SHOW]) == pytest.approx(float(shows[rows == 0].sum()), 1e-6)


@pytest.mark.parametrize("dim", [128, 9])  # 4 weights per load, and one at a time
def test_rows_padded_to_16_bytes_hold_the_cpu_cores_rows_and_padding_is_never_touched(
    ops: cuda_ext.CudaOps, dim: int
) -> None:
    p, _ = params(dim, embedx_threshold=1.0)
    gp = cuda_ext.TableParams.of(p, pad=True)
    assert gp.stride % 4 == 0 and gp.stride >= p.width
    n = 500
    keys = distinct_keys(n, seed=7)
    want = torch.zeros((n, p.width))
    _C.init_rows(want, keys, 0, n, p)
    data = torch.full((n, gp.stride), 7.0, device=ops.device)
    ops.init_rows(data, on(ops, keys), 0, n, gp)
    g = torch.Generator().manual_seed(8)
    rows = torch.randint(0, n, (3000,), generator=g)
    grads = torch.randn((3000, dim), generator=g) * 0.1
    shows = torch.rand(3000, generator=g) * 2
    assert ops.update(
        data, on(ops, keys), on(ops, rows), on(ops, grads), on(ops, shows), on(ops, shows * 0.3),
        gp,
    ) == _C.update(want, keys, rows, grads, shows, shows * 0.3, p)  # fmt: skip
    torch.testing.assert_close(data[:, : p.width].cpu(), want, **TOL)
    gathered = ops.gather(data, on(ops, torch.tensor([3, -1, 499, 0])), gp).cpu()
    assert torch.equal(
        gathered, _C.gather(data[:, : p.width].cpu().contiguous(), torch.tensor([3, -1, 499, 0]), p)
    )
    assert torch.equal(ops.shrink(data, n, gp).cpu(), _C.shrink(want, n, p))
    ops.mark_dirty(data, on(ops, rows), gp)
    assert bool((data[:, p.width :] == 7.0).all())  # the padding, never read or written


def test_rows_full_clamps_next_row_and_a_retry_after_growth_leaves_no_hole(
    ops: cuda_ext.CudaOps,
) -> None:
    p, gp = params()
    keys = on(ops, distinct_keys(100, seed=3))
    slots = ops.index_new(256)
    next_row = torch.zeros(1, dtype=torch.int64, device=ops.device)
    row_keys = torch.zeros(40, dtype=torch.int64, device=ops.device)
    data = torch.zeros((40, gp.width), device=ops.device)
    with pytest.raises(cuda_ext.RowsFull, match="no free row"):
        ops.find_or_insert(slots, keys, next_row, row_keys, data, gp)
    assert int(next_row.item()) == 40  # clamped: ids drawn past R were given back
    assert ops.size(slots) == 40
    # grow the rows (ids kept), retry: the 60 others get rows 40..99, no hole, no duplicate
    row_keys = torch.cat([row_keys, torch.zeros(60, dtype=torch.int64, device=ops.device)])
    data = torch.cat([data, torch.zeros((60, gp.width), device=ops.device)])
    rows = ops.find_or_insert(slots, keys, next_row, row_keys, data, gp).cpu()
    assert sorted(rows.tolist()) == list(range(100))
    assert int(next_row.item()) == 100
    assert torch.equal(row_keys.cpu()[rows], keys.cpu())
    # every row initialised as the CPU core draws it
    want = torch.zeros((100, p.width))
    _C.init_rows(want, row_keys.cpu(), 0, 100, p)
    assert torch.equal(data.cpu(), want)


def test_no_probe_returns_a_tombstone_at_high_load(ops: cuda_ext.CudaOps) -> None:
    """An index at 90% load, two thirds of it erased: the erased keys read absent on the
    device and through the CPU core's probe of the same slots; the rest keep their rows;
    new keys reuse tombstones."""
    slots = ops.index_new(1024)
    keys = distinct_keys(920, seed=4)
    vals = torch.arange(920)
    ops.insert_or_assign(slots, on(ops, keys), on(ops, vals))
    gone, kept = keys[:600], keys[600:]
    assert ops.erase(slots, on(ops, gone)) == 600
    assert bool((ops.find(slots, on(ops, gone)) == -1).all())
    assert torch.equal(ops.find(slots, on(ops, kept)).cpu(), vals[600:])
    cpu_slots = slots.cpu().clone()
    assert bool((cpu_slots[:, 1] == -3).sum() >= 1)  # tombstones keep their old keys ...
    assert bool((_C.find(cpu_slots, gone) == -1).all())  # ... which no CPU probe returns
    assert torch.equal(_C.find(cpu_slots, kept), vals[600:])
    fresh = distinct_keys(1500, seed=5)
    fresh = fresh[~torch.isin(fresh, keys)][:500]
    ops.insert_or_assign(slots, on(ops, fresh), on(ops, torch.arange(500) + 1000))
    assert torch.equal(ops.find(slots, on(ops, fresh)).cpu(), torch.arange(500) + 1000)
    assert torch.equal(ops.find(slots, on(ops, kept)).cpu(), vals[600:])
    assert ops.size(slots) == 820


def test_arguments_the_kernels_would_misread_are_refused_by_name(ops: cuda_ext.CudaOps) -> None:
    _, gp = params()
    slots = ops.index_new(64)
    keys = torch.arange(8, device=ops.device)
    with pytest.raises(ValueError, match="find: keys has dtype torch.int32"):
        ops.find(slots, keys.to(torch.int32))
    with pytest.raises(ValueError, match="find: keys is not contiguous"):
        ops.find(slots, torch.arange(16, device=ops.device)[::2])
    with pytest.raises(ValueError, match="find: slots has shape"):
        ops.find(torch.zeros((64, 3), dtype=torch.int64, device=ops.device), keys)
    data = torch.zeros((8, gp.width), device=ops.device)
    with pytest.raises(ValueError, match=f"gather: data has shape \\(8, {gp.width - 1}\\)"):
        ops.gather(data[:, 1:].contiguous(), keys, gp)
    with pytest.raises(ValueError, match="update: grads has shape"):
        ops.update(data, keys, keys, torch.zeros((8, 3), device=ops.device), data[:, 0].clone(),
                   data[:, 0].clone(), gp)  # fmt: skip
    if ops.device.type == "cpu":  # a view into a message's bytes at an odd offset
        odd = torch.frombuffer(bytearray(8 * 4 + 1), dtype=torch.float32, offset=1, count=8)
        with pytest.raises(ValueError, match="update: shows is not aligned to its 4-byte"):
            ops.update(data, keys, keys, torch.zeros((8, gp.dim)), odd, odd.clone(), gp)
    if ops.device.type == "cpu" and torch.cuda.is_available():  # pragma: no cover - GPU hosts
        with pytest.raises(ValueError, match="find: keys is on cuda"):
            ops.find(slots, keys.cuda())


def test_update_takes_its_scratch_from_the_caller(ops: cuda_ext.CudaOps) -> None:
    """The scratch is the caller's (torch's caching allocator on a GPU), sized by the library;
    too little is refused before any launch."""
    lib = ops.lib
    assert lib.streamrec_cuda_update_scratch_bytes(0, 8) == 0
    small, large = (lib.streamrec_cuda_update_scratch_bytes(n, 8) for n in (10, 100_000))
    assert 0 < small < large
    _, gp = params()
    table = cuda_ext.Rows(chunks=1, key_chunks=1, shift=0, R=1)
    push = cuda_ext.Push(table=table, n=10, flag=1, rows=1, grads=1, shows=1, clicks=1)
    rc = lib.streamrec_cuda_update(push, 1, small - 1, ctypes.byref(gp), None)
    assert rc == cuda_ext.ERR_ARGUMENT
    assert b"update: scratch must hold" in lib.streamrec_cuda_last_error()
    # a field the struct has not is refused (plain ctypes would keep it as an attribute)
    with pytest.raises(TypeError, match="Push has no field R, data; its fields: table, rows"):
        cuda_ext.Push(n=10, R=1, data=1)


@pytest.mark.timeout(300)
def test_each_call_raises_only_its_own_kernel_error_under_concurrency(
    ops: cuda_ext.CudaOps,
) -> None:
    """One CudaOps serves every table of a device, and ctypes lets two threads into the
    library at once. Thread A gathers a row outside its table (ERR_ROW_OUTSIDE) over and over
    while thread B pushes through the same ops: A raises that error every time, B never, and
    B's every push lands (the rows the same pushes give one after another)."""
    p, gp = params()
    n_rows, rounds = 256, 60
    keys = distinct_keys(n_rows, seed=11)
    start = torch.zeros((n_rows, p.width))
    _C.init_rows(start, keys, 0, n_rows, p)
    g = torch.Generator().manual_seed(12)
    rows = torch.randint(0, n_rows, (20_000,), generator=g)
    grads = torch.randn((rows.numel(), 8), generator=g) * 1e-2
    shows = torch.rand(rows.numel(), generator=g)
    args = [on(ops, t) for t in (keys, rows, grads, shows, shows * 0.5)]
    want = on(ops, start)
    for _ in range(rounds):  # the same pushes one after another: what B must end with
        ops.update(want, *args, gp)
    a_table = torch.zeros((8, gp.width), device=ops.device)
    a_rows = torch.tensor([0, 3, 8, 1], device=ops.device)  # row 8 is outside A's 8 rows
    got, problems, b_done = on(ops, start), [], threading.Event()
    gate = threading.Barrier(2, timeout=60)
    a_calls = 0

    def thread_a() -> None:
        nonlocal a_calls
        gate.wait()
        while not b_done.is_set() or a_calls < rounds:
            a_calls += 1
            try:
                ops.gather(a_table, a_rows, gp)
                problems.append("A: a gather outside the table returned without its error")
            except cuda_ext.CudaOpError as exc:
                if exc.rc != cuda_ext.ERR_ROW_OUTSIDE:
                    problems.append(f"A: {exc}")

    def thread_b() -> None:
        gate.wait()
        try:
            for _ in range(rounds):
                try:
                    ops.update(got, *args, gp)
                except cuda_ext.CudaOpError as exc:
                    problems.append(f"B: {exc}")
        finally:
            b_done.set()

    threads = [threading.Thread(target=f) for f in (thread_a, thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads)
    assert problems == [], problems[:5]
    assert a_calls >= rounds
    assert torch.equal(got.cpu(), want.cpu())  # no push dropped


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"
)
def test_ops_on_cuda_1_run_there_with_device_0_current() -> None:  # pragma: no cover - 2 GPUs
    ops = cuda_ext.load("cuda:1")
    assert ops is cuda_ext.load(torch.device("cuda", 1)) and ops is not cuda_ext.load("cuda:0")
    p, gp = params()
    torch.cuda.set_device(0)
    keys = distinct_keys(500, seed=6)
    slots = ops.index_new(2048)
    next_row = torch.zeros(1, dtype=torch.int64, device="cuda:1")
    row_keys = torch.zeros(500, dtype=torch.int64, device="cuda:1")
    data = torch.zeros((500, gp.width), device="cuda:1")
    rows = ops.find_or_insert(slots, keys.to("cuda:1"), next_row, row_keys, data, gp)
    want = torch.zeros((500, p.width))
    _C.init_rows(want, row_keys.cpu(), 0, 500, p)
    assert torch.equal(data.cpu(), want)
    assert torch.equal(ops.find(slots, keys.to("cuda:1")).cpu(), rows.cpu())
    with pytest.raises(ValueError, match="is on cuda:0"):
        ops.find(slots, keys.to("cuda:0"))
