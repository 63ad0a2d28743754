"""Every CUDA op against the CPU core (``_C``) on the same inputs.

Run on the CPU build of the kernels (a "CPU device" of the CUDA library: the same kernel
bodies on CPU threads, so these run in CI everywhere) and, where a GPU is present, on it. Same
keys found, same rows created (uniform and zeros draws bit for bit, normal draws within
the tolerance csrc/shared/row_init.h documents), same optimizer results within float tolerance,
duplicate keys in one batch, growth past the initial capacity, a full index as an error.
Row ids differ by design (the GPU numbers new rows by an atomic counter): tables are compared
key by key.
"""

from __future__ import annotations

from typing import Any

import pytest
import streamrec.embedding_store._C as _C
import torch
from streamrec.embedding_store.tiers import cuda_ext
from streamrec.embedding_store.tiers.table_tier import table_params
from streamrec.store_schema import (
    NormalInitializer,
    SgdRuleParam,
    TableOptions,
    UniformInitializer,
    ZerosInitializer,
)

pytestmark = pytest.mark.gpu

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    ),
]

RULES = [
    "SparseNaiveSGDRule",
    "SparseAdaGradSGDRule",
    "StdAdaGradSGDRule",
    "SparseAdamSGDRule",
    "TorchAdaGradSGDRule",
]
#: float tolerance of optimizer results (same formulas, no fused multiply-add on either side)
TOL = {"rtol": 1e-6, "atol": 1e-7}


@pytest.fixture(scope="module", params=DEVICES)
def ops(request: pytest.FixtureRequest) -> cuda_ext.CudaOps:
    """The ops on the CPU build of the kernels, or on the GPU."""
    return cuda_ext.load_cpu() if request.param == "cpu" else cuda_ext.load(request.param)


def params(rule: str = "SparseAdaGradSGDRule", **kw: Any) -> tuple[Any, cuda_ext.TableParams]:
    """(CPU TableParams, the same as the C API's struct) of a dim-8 table."""
    sgd = SgdRuleParam(name=rule, weight_bounds=(-0.5, 0.5))
    options = TableOptions(name="t", dim=8, embed_sgd_param=sgd, embedx_sgd_param=sgd, **kw)
    p = table_params(options, seed=7)
    return p, cuda_ext.TableParams.of(p)


def sample_keys(n: int, distinct: int, seed: int = 0) -> torch.Tensor:
    """(n,) int64 keys over the whole int64 range, with repeats (distinct of them)."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.randint(-(2**63), 2**63 - 1, (distinct,), generator=g, dtype=torch.int64)
    return pool[torch.randint(0, distinct, (n,), generator=g)]


def cpu_table(keys: torch.Tensor, p: Any, rows: int) -> tuple[torch.Tensor, ...]:
    """A CPU index, row matrix and row keys holding keys (created as a pull creates them)."""
    slots = _C.index_build(4 * rows, torch.empty(0, dtype=torch.int64))
    found, new_keys = _C.find_or_insert(slots, keys, 0)
    data = torch.zeros((rows, p.width), dtype=torch.float32)
    row_keys = torch.zeros(rows, dtype=torch.int64)
    row_keys[: new_keys.numel()] = new_keys
    _C.init_rows(data, row_keys, 0, new_keys.numel(), p)
    return slots, found, data, row_keys


def gpu_table(
    ops: cuda_ext.CudaOps, keys: torch.Tensor, gp: cuda_ext.TableParams, rows: int
) -> tuple[torch.Tensor, ...]:
    slots = ops.index_new(4 * rows)
    next_row = torch.zeros(1, dtype=torch.int64, device=ops.device)
    row_keys = torch.zeros(rows, dtype=torch.int64, device=ops.device)
    data = torch.zeros((rows, gp.width), dtype=torch.float32, device=ops.device)
    found = ops.find_or_insert(slots, keys.to(ops.device, copy=True), next_row, row_keys, data, gp)
    return slots, found, data, row_keys, next_row


def by_key(keys: torch.Tensor, rows: torch.Tensor, data: torch.Tensor) -> dict[int, torch.Tensor]:
    data, rows = data.cpu(), rows.cpu()
    return {int(k): data[int(r)] for k, r in zip(keys.tolist(), rows.tolist(), strict=True)}


def test_find_or_insert_matches_the_cpu_with_duplicate_keys(ops: cuda_ext.CudaOps) -> None:
    p, gp = params()
    keys = sample_keys(5000, 1500)
    _, cpu_rows, _, _ = cpu_table(keys, p, 2048)
    slots, rows, _, row_keys, next_row = gpu_table(ops, keys, gp, 2048)
    m = int(torch.unique(keys).numel())
    assert int(next_row.item()) == m == int(cpu_rows.max()) + 1
    rows = rows.cpu()
    # one row per distinct key: the same partition of positions as the CPU's
    assert sorted(rows.unique().tolist()) == list(range(m))
    assert torch.equal(row_keys.cpu()[rows], keys)
    # the same partition of positions as the CPU's: row ids pair one to one
    pairs = set(zip(rows.tolist(), cpu_rows.tolist(), strict=True))
    assert len(pairs) == m
    # find: present keys their rows, absent keys -1
    absent = sample_keys(300, 300, seed=1)
    absent = absent[~torch.isin(absent, keys)]
    probe = torch.cat([keys, absent]).to(ops.device, copy=True)
    found = ops.find(slots, probe).cpu()
    assert torch.equal(found[: keys.numel()], rows)
    assert bool((found[keys.numel() :] == -1).all())
    assert ops.size(slots) == m


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize(
    "initializer",
    [None, UniformInitializer(low=-0.3, high=0.2), ZerosInitializer(), NormalInitializer(std=0.1)],
)
def test_rows_created_match_the_cpu_initializers(
    ops: cuda_ext.CudaOps, rule: str, initializer: object
) -> None:
    # embedx_threshold <= 0: rows expand at creation, so the embedx draws are compared too
    for threshold in (10.0, 0.0):
        p, gp = params(rule, initializer=initializer, embedx_threshold=threshold)
        keys = sample_keys(3000, 1000, seed=2)
        _, cpu_rows, cpu_data, _ = cpu_table(keys, p, 1024)
        _, rows, data, _, _ = gpu_table(ops, keys, gp, 1024)
        want, got = by_key(keys, cpu_rows, cpu_data), by_key(keys, rows, data)
        w = torch.stack([want[k] for k in want])
        g = torch.stack([got[k] for k in want])
        if isinstance(initializer, NormalInitializer):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7)
        else:
            assert torch.equal(g, w)
        # the standalone draws
        uniq = torch.tensor(list(want), dtype=torch.int64)
        for with_embedx in (False, True):
            cpu_w = _C.initial_weights(uniq, p, with_embedx)
            gpu_w = ops.initial_weights(uniq.to(ops.device, copy=True), gp, with_embedx).cpu()
            torch.testing.assert_close(gpu_w, cpu_w, rtol=1e-6, atol=1e-7)


def test_init_rows_matches_the_cpu(ops: cuda_ext.CudaOps) -> None:
    p, gp = params("SparseAdamSGDRule", embedx_threshold=0.0)
    row_keys = sample_keys(700, 700, seed=3)
    cpu = torch.full((700, p.width), 9.0)
    _C.init_rows(cpu, row_keys, 100, 500, p)
    gpu = torch.full((700, gp.width), 9.0, device=ops.device)
    ops.init_rows(gpu, row_keys.to(ops.device, copy=True), 100, 500, gp)
    assert torch.equal(gpu.cpu(), cpu)


@pytest.mark.parametrize("rule", RULES)
def test_update_matches_the_cpu(ops: cuda_ext.CudaOps, rule: str) -> None:
    # a low threshold: some rows expand during the pushes, expanded rows take the embedx rule
    p, gp = params(rule, embedx_threshold=2.0)
    keys = sample_keys(4000, 800, seed=4)
    _, cpu_rows, cpu_data, cpu_row_keys = cpu_table(keys, p, 1024)
    gpu_data = cpu_data.to(ops.device, copy=True)
    gpu_row_keys = cpu_row_keys.to(ops.device, copy=True)
    g = torch.Generator().manual_seed(5)
    for step in range(4):
        pick = torch.randint(0, keys.numel(), (3000,), generator=g)
        rows = cpu_rows[pick].clone()
        rows[::97] = -1  # absent positions are skipped
        grads = torch.randn((rows.numel(), p.dim), generator=g) * 0.1
        shows = torch.rand(rows.numel(), generator=g) * 2
        clicks = shows * torch.rand(rows.numel(), generator=g)
        want = _C.update(cpu_data, cpu_row_keys, rows, grads, shows, clicks, p)
        got = ops.update(
            gpu_data,
            gpu_row_keys,
            rows.to(ops.device, copy=True),
            grads.to(ops.device, copy=True),
            shows.to(ops.device, copy=True),
            clicks.to(ops.device, copy=True),
            gp,
        )
        assert got == want, step
        torch.testing.assert_close(gpu_data.cpu(), cpu_data, **TOL)


def test_update_refuses_a_row_outside_and_writes_nothing(ops: cuda_ext.CudaOps) -> None:
    p, gp = params()
    data = torch.zeros((16, gp.width), device=ops.device)
    row_keys = torch.arange(16, device=ops.device)
    rows = torch.tensor([1, 2, 16], device=ops.device)
    grads = torch.ones((3, gp.dim), device=ops.device)
    ones = torch.ones(3, device=ops.device)
    with pytest.raises(cuda_ext.CudaOpError, match="outside the table"):
        ops.update(data, row_keys, rows, grads, ones, ones, gp)
    assert not bool(data.any())


def test_gather_and_bag_pooling_match_the_cpu(ops: cuda_ext.CudaOps) -> None:
    p, gp = params(embedx_threshold=0.0)
    keys = sample_keys(1000, 400, seed=6)
    _, cpu_rows, cpu_data, _ = cpu_table(keys, p, 512)
    rows = cpu_rows.clone()
    rows[::13] = -1
    gpu_data = cpu_data.to(ops.device, copy=True)
    out = ops.gather(gpu_data, rows.to(ops.device, copy=True), gp).cpu()
    assert torch.equal(out, _C.gather(cpu_data, rows, p))
    offsets = torch.tensor([0, 0, 5, 6, 300, 1000])
    for mean in (False, True):
        pooled = ops.gather_pooled(
            gpu_data, rows.to(ops.device, copy=True), offsets.to(ops.device, copy=True), gp, mean
        ).cpu()
        want = torch.nn.functional.embedding_bag(
            torch.arange(rows.numel()),
            _C.gather(cpu_data, rows, p),
            offsets,
            mode="mean" if mean else "sum",
            include_last_offset=True,
        )
        torch.testing.assert_close(pooled, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(cuda_ext.CudaOpError, match="outside"):
        ops.gather(gpu_data, torch.tensor([0, 512], device=ops.device), gp)


def test_insert_or_assign_erase_and_export(ops: cuda_ext.CudaOps) -> None:
    slots = ops.index_new(1024)
    keys = sample_keys(500, 500, seed=7).unique()
    vals = torch.arange(keys.numel()) * 3
    ops.insert_or_assign(slots, keys.to(ops.device, copy=True), vals.to(ops.device, copy=True))
    cpu = _C.index_build(1024, torch.empty(0, dtype=torch.int64))
    _C.insert_or_assign(cpu, keys, vals)
    assert torch.equal(ops.find(slots, keys.to(ops.device, copy=True)).cpu(), _C.find(cpu, keys))
    # assign over present keys
    ops.insert_or_assign(
        slots, keys[:10].to(ops.device, copy=True), torch.full((10,), 7, device=ops.device)
    )
    assert bool((ops.find(slots, keys[:10].to(ops.device, copy=True)) == 7).all())
    # erase (a duplicate counts once), then the erased keys read absent, the rest stay
    erase = torch.cat([keys[:100], keys[:5]])
    assert ops.erase(slots, erase.to(ops.device, copy=True)) == 100
    assert bool((ops.find(slots, keys[:100].to(ops.device, copy=True)) == -1).all())
    assert torch.equal(ops.find(slots, keys[100:].to(ops.device, copy=True)).cpu(), vals[100:])
    assert ops.size(slots) == keys.numel() - 100
    exported_keys, exported_rows = ops.export(slots)
    order = torch.argsort(exported_keys.cpu())
    assert torch.equal(exported_keys.cpu()[order], keys[100:].sort().values)
    assert torch.equal(exported_rows.cpu()[order], vals[100:][torch.argsort(keys[100:])])
    # a tombstone is reused by a new key and walked past by the old ones
    # distinct keys (of a duplicated key in one call, either value may win)
    fresh = sample_keys(50, 50, seed=8).unique()[:30]
    ops.insert_or_assign(
        slots, fresh.to(ops.device, copy=True), torch.arange(30, device=ops.device)
    )
    assert torch.equal(ops.find(slots, fresh.to(ops.device, copy=True)).cpu(), torch.arange(30))
    assert torch.equal(ops.find(slots, keys[100:].to(ops.device, copy=True)).cpu(), vals[100:])


def test_growth_past_the_initial_capacity(ops: cuda_ext.CudaOps) -> None:
    p, gp = params()
    slots = ops.index_new(1024)
    next_row = torch.zeros(1, dtype=torch.int64, device=ops.device)
    row_keys = torch.zeros(8192, dtype=torch.int64, device=ops.device)
    data = torch.zeros((8192, gp.width), device=ops.device)
    seen: dict[int, int] = {}
    for batch in range(6):
        keys = sample_keys(1000, 1000, seed=10 + batch).unique()
        size = ops.size(slots)
        if (size + keys.numel()) > 0.75 * slots.shape[0]:  # the host tier's MAX_LOAD
            slots = ops.rebuild(slots, 4 * slots.shape[0])
            assert ops.size(slots) == size
        rows = ops.find_or_insert(
            slots, keys.to(ops.device, copy=True), next_row, row_keys, data, gp
        ).cpu()
        seen.update(zip(keys.tolist(), rows.tolist(), strict=True))
    assert slots.shape[0] > 1024
    every = torch.tensor(list(seen), dtype=torch.int64)
    assert ops.find(slots, every.to(ops.device, copy=True)).cpu().tolist() == list(seen.values())


def test_a_full_index_is_an_error_and_a_retry_after_growth_is_idempotent(
    ops: cuda_ext.CudaOps,
) -> None:
    _, gp = params()
    slots = ops.index_new(64)
    next_row = torch.zeros(1, dtype=torch.int64, device=ops.device)
    row_keys = torch.zeros(1024, dtype=torch.int64, device=ops.device)
    keys = sample_keys(100, 100, seed=20).unique().to(ops.device, copy=True)
    with pytest.raises(cuda_ext.IndexFull, match="index is full"):
        ops.find_or_insert(slots, keys, next_row, row_keys)
    assert ops.size(slots) == 64  # the keys that found a slot are in, consistently
    before = ops.find(slots, keys).cpu()
    slots = ops.rebuild(slots, 256)
    rows = ops.find_or_insert(slots, keys, next_row, row_keys).cpu()
    placed = before >= 0
    assert torch.equal(rows[placed], before[placed])
    assert sorted(rows.tolist()) == list(range(keys.numel()))
    assert int(next_row.item()) == keys.numel()
    # no free row is an error too
    few = torch.zeros(4, dtype=torch.int64, device=ops.device)
    with pytest.raises(cuda_ext.RowsFull):
        ops.find_or_insert(ops.index_new(64), keys[:10], torch.zeros_like(next_row), few)


def test_day_shrink_selection_and_dirty_marks_match_the_cpu(ops: cuda_ext.CudaOps) -> None:
    p, gp = params()
    g = torch.Generator().manual_seed(9)
    cpu = torch.zeros((300, p.width))
    cpu[:, _C.SHOW] = torch.rand(300, generator=g) * 4
    cpu[:, _C.CLICK] = cpu[:, _C.SHOW] * torch.rand(300, generator=g)
    cpu[:, _C.UNSEEN] = torch.randint(0, 40, (300,), generator=g).float()
    cpu[:, _C.FLAGS] = torch.randint(0, 4, (300,), generator=g).float()
    gpu = cpu.to(ops.device, copy=True)
    _C.advance_day(cpu, 250)
    ops.advance_day(gpu, 250, gp)
    for mode in (0, 1, 2):
        assert torch.equal(
            ops.select_rows(gpu, 250, mode, gp).cpu(), _C.select_rows(cpu, 250, mode, p)
        )
    assert torch.equal(ops.shrink(gpu, 250, gp).cpu(), _C.shrink(cpu, 250, p))
    _C.clear_dirty(cpu, 250)
    ops.clear_dirty(gpu, 250, gp)
    assert torch.equal(gpu.cpu(), cpu)
    ops.mark_dirty(gpu, torch.tensor([3, 3, -1, 7], device=ops.device), gp)
    dirty = (gpu[:, _C.FLAGS].cpu().to(torch.int64) & _C.FLAG_DIRTY) != 0
    assert dirty[:250].nonzero().flatten().tolist() == [3, 7]
    assert torch.equal(gpu[250:].cpu(), cpu[250:])  # rows past size untouched


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("dim", [2, 9, 33, 70])
def test_update_is_bit_identical_to_the_cpu_core(
    ops: cuda_ext.CudaOps, rule: str, dim: int
) -> None:
    """The warp-per-row push (lane-strided columns, AdaGrad's sum of squares as 8 lane sums
    combined in the CPU's order) gives the CPU core's floats exactly, at every dim's tail
    (dim - 1 embedx weights: 1, 8, 32, 69)."""
    sgd = SgdRuleParam(name=rule, weight_bounds=(-0.5, 0.5))
    options = TableOptions(
        name="t", dim=dim, embed_sgd_param=sgd, embedx_sgd_param=sgd, embedx_threshold=2.0
    )
    p = table_params(options, seed=7)
    gp = cuda_ext.TableParams.of(p)
    keys = sample_keys(600, 300, seed=dim)
    _, cpu_rows, cpu_data, cpu_row_keys = cpu_table(keys, p, 512)
    dev_data, dev_keys = cpu_data.to(ops.device, copy=True), cpu_row_keys.to(ops.device, copy=True)
    g = torch.Generator().manual_seed(dim)
    for _ in range(3):  # rows expand on the way: the embedx rule runs from the second step
        grads = torch.randn((cpu_rows.numel(), dim), generator=g)
        shows = torch.rand(cpu_rows.numel(), generator=g) * 2
        want = _C.update(cpu_data, cpu_row_keys, cpu_rows, grads, shows, shows * 0.5, p)
        got = ops.update(
            dev_data, dev_keys, *(t.to(ops.device, copy=True) for t in (cpu_rows, grads)),
            shows.to(ops.device, copy=True), (shows * 0.5).to(ops.device, copy=True), gp,
        )  # fmt: skip
        assert got == want
        assert torch.equal(dev_data.cpu(), cpu_data)


@pytest.mark.parametrize("rule", RULES)
def test_a_dim_1_push_writes_only_its_own_rows(ops: cuda_ext.CudaOps, rule: str) -> None:
    """dim 1: no embedx weights and no embedx state columns; the embedx rule of an expanded
    row must write nothing (AdaGrad's g2sum at width is the next row's show)."""
    sgd = SgdRuleParam(name=rule)
    options = TableOptions(
        name="t", dim=1, embed_sgd_param=sgd, embedx_sgd_param=sgd, embedx_threshold=0.0
    )
    gp = cuda_ext.TableParams.of(table_params(options, seed=7))
    data = torch.zeros((8, gp.width), device=ops.device)
    keys = torch.arange(8, device=ops.device)
    ops.init_rows(data, keys, 0, 8, gp)
    before = data.cpu()
    rows = torch.tensor([0, 2, 4, 6], device=ops.device)
    ones = torch.ones(4, device=ops.device)
    for _ in range(2):
        ops.update(data, keys, rows, torch.ones((4, 1), device=ops.device), ones, ones, gp)
    after = data.cpu()
    assert bool(after.isfinite().all())
    assert torch.equal(after[1::2], before[1::2])  # the rows not pushed: untouched


# -- compact rows (TableOptions.dtype fp16 / bf16): the kernels decode and encode as the CPU core
COMPACT = ["fp16", "bf16"]
COMPACT_RULES = ["SparseNaiveSGDRule", "SparseAdaGradSGDRule", "TorchAdaGradSGDRule"]


def compact_params(dtype: str, rule: str, dim: int) -> tuple[Any, cuda_ext.TableParams]:
    """(CPU TableParams, the C API's struct) of a table of rows of dtype."""
    sgd = SgdRuleParam(name=rule, weight_bounds=(-0.5, 0.5))
    options = TableOptions(
        name="t", dim=dim, dtype=dtype, embed_sgd_param=sgd, embedx_sgd_param=sgd,
        embedx_threshold=2.0,
    )  # fmt: skip
    p = table_params(options, seed=7)
    return p, cuda_ext.TableParams.of(p)


@pytest.mark.parametrize("dim", [8, 9])
@pytest.mark.parametrize("dtype", COMPACT)
def test_compact_rows_created_gathered_and_pooled_match_the_cpu(
    ops: cuda_ext.CudaOps, dtype: str, dim: int
) -> None:
    """New rows encoded to nearest, word for word the CPU core's (an odd payload's pad half
    included); the gather decodes them to the CPU core's float32 weights."""
    p, gp = compact_params(dtype, "SparseAdaGradSGDRule", dim)
    keys = sample_keys(1000, 400, seed=dim)
    _, cpu_rows, cpu_data, _ = cpu_table(keys, p, 512)
    _, found, gpu_data, _, _ = gpu_table(ops, keys, gp, 512)
    cpu_by_key, gpu_by_key = by_key(keys, cpu_rows, cpu_data), by_key(keys, found, gpu_data)
    assert all(torch.equal(gpu_by_key[k], v) for k, v in cpu_by_key.items())
    rows = cpu_rows.clone()
    rows[::13] = -1
    dev_data = cpu_data.to(ops.device, copy=True)
    want = _C.gather(cpu_data, rows, p)
    assert want.abs().sum() > 0
    assert torch.equal(ops.gather(dev_data, rows.to(ops.device, copy=True), gp).cpu(), want)
    offsets = torch.tensor([0, 0, 5, 6, 300, 1000])
    for mean in (False, True):
        pooled = ops.gather_pooled(
            dev_data, rows.to(ops.device, copy=True), offsets.to(ops.device, copy=True), gp, mean
        ).cpu()
        bags = torch.nn.functional.embedding_bag(
            torch.arange(rows.numel()), want, offsets, mode="mean" if mean else "sum",
            include_last_offset=True,
        )  # fmt: skip
        torch.testing.assert_close(pooled, bags, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rule", COMPACT_RULES)
@pytest.mark.parametrize("dim", [2, 9, 33])
@pytest.mark.parametrize("dtype", COMPACT)
def test_compact_update_is_bit_identical_to_the_cpu_core(
    ops: cuda_ext.CudaOps, dtype: str, dim: int, rule: str
) -> None:
    """The push on compact rows (decode, the float32 step, stochastic rounding from the key,
    the column and round_step) writes the CPU core's words exactly, step after step."""
    p, gp = compact_params(dtype, rule, dim)
    keys = sample_keys(600, 300, seed=dim)
    _, cpu_rows, cpu_data, cpu_row_keys = cpu_table(keys, p, 512)
    dev_data, dev_keys = cpu_data.to(ops.device, copy=True), cpu_row_keys.to(ops.device, copy=True)
    g = torch.Generator().manual_seed(dim)
    for step in range(1, 4):
        p.round_step = gp.round_step = step
        grads = torch.randn((cpu_rows.numel(), dim), generator=g) * 0.1
        shows = torch.rand(cpu_rows.numel(), generator=g) * 2
        before = cpu_data.clone()
        want = _C.update(cpu_data, cpu_row_keys, cpu_rows, grads, shows, shows * 0.5, p)
        got = ops.update(
            dev_data, dev_keys, *(t.to(ops.device, copy=True) for t in (cpu_rows, grads)),
            shows.to(ops.device, copy=True), (shows * 0.5).to(ops.device, copy=True), gp,
        )  # fmt: skip
        assert got == want
        assert not torch.equal(cpu_data, before)
        assert torch.equal(dev_data.cpu(), cpu_data)
