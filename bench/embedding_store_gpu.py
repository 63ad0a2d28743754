"""Benchmark of the GPU embedding store (docs/design-notes.md, "The embedding store on a
GPU"): every figure next to a baseline measured in the same run on the same GPU, printed as a ratio.

Figures (HierarchicalKV's benchmark shape: 1,048,576 keys per call):
1. device bandwidth: a device-to-device copy (bytes read + written per second).
2. per dim 8, 64, 128 and load factor 0.5, 1.0 (a ``DeviceTable`` made with ``init_capacity``
   rows and filled to that share of them, so no call grows it; its hash index has twice as
   many slots as rows, see ``tier.index_slots``):
   - find: ``pull(create=False)`` of present keys (probe + gather of the weights), keys/s;
     floor at dim 8: 2.5 billion keys/s (HKV: 2.47 on an A100);
   - find_or_insert: ``pull(create=True)`` of batches half present, half new (the table's
     load rises by the new keys over the timed calls: at most ``steps`` x 0.5 M rows), keys/s;
     floor at dim 64: 1.5 billion keys/s;
   - pull + AdaGrad push of present keys, keys/s, against ``torch.nn.EmbeddingBag(sparse=
     True)`` + ``torch.optim.Adagrad`` over a table of the same rows (forward, backward, step;
     one id per bag); floor 3x. For the pull at dim 128, the bytes it moves per second as a
     share of the measured bandwidth (floor 60%).
3. ``find_or_insert`` alone (the CUDA op over one index and row matrix, rows initialised),
   all-new keys (every key inserted: the row-id atomic, the row initialisation) against
   all-hit (the same keys again: probes only), per dim 8 and 64, keys/s and their ratio.
4. the training step's store work over 1, 4 and 26 tables (one ``pull_rows`` and one
   ``push_rows`` of every table's keys, the trainer's calls; ``device_block.py``): launches,
   host syncs and host-to-device copies per step (``CudaOps.counts``: launches must not grow
   with the tables, syncs must be 0), and keys/s against the same calls a table at a time.
5. the push's duplicate-key reduction: the radix sort ``update_tables`` groups by (sort, sums
   in position order, the steps) against a hash grouping (``unique_tables`` over (table, row):
   claim, first occurrences, scan, spread) plus a float64 scatter-add of the values by its
   inverse (no step), keys/s.
6. TODO (not measured yet): the trainer end to end on the GPU (``bench/trainer.py`` setup b,
   the store in-process on tier device) against the reference DLRM step alone.

Without a CUDA GPU it exits 2 saying so, unless ``--cpu``: figures 4 and 5 on the CPU build of
the kernels (the counts are what a GPU would launch; the rates are the CPU's, not a GPU's).
Run alone on the GPU machine:
    python bench/embedding_store_gpu.py            (full; a few minutes)
    python bench/embedding_store_gpu.py --quick    (small; a smoke run)
    python bench/embedding_store_gpu.py --cpu      (no GPU: counts and the CPU build's rates)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# the figures' printing and --json rows are the CPU store bench's (bench/ is on sys.path)
from embedding_store import RESULTS
from embedding_store import figure as cpu_figure
from streamrec.embedding_store import EmbeddingStore
from streamrec.embedding_store.tiers import cuda_ext
from streamrec.embedding_store.tiers.device_table import DeviceTable
from streamrec.embedding_store.tiers.table_tier import index_slots, table_params
from streamrec.store_schema import TableOptions

KEYS_PER_CALL = 1 << 20


def figure(name: str, value: float, unit: str, digits: int = 3, **kw: Any) -> None:
    """A figure with three decimals (billions of keys/s, GB/s) unless told."""
    cpu_figure(name, value, unit, digits=digits, **kw)


def gpu_timed(step: Callable[[int], object], steps: int) -> float:
    """Seconds per call: one warm-up call (index ``steps``), then the median of ``steps``
    calls timed with CUDA events (calls 0 .. steps-1)."""
    step(steps)
    torch.cuda.synchronize()
    times = []
    for i in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(i)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def device_bandwidth(mib: int) -> float:
    """Bytes per second of a device-to-device copy of ``mib`` MiB (read + write counted)."""
    src = torch.ones(mib * (1 << 20) // 4, device="cuda")
    dst = torch.empty_like(src)
    seconds = gpu_timed(lambda _i: dst.copy_(src), 5)
    return 2 * src.numel() * 4 / seconds


def random_keys(n: int, seed: int) -> torch.Tensor:
    """``n`` distinct-ish int64 keys spread over the whole key space, on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(-(2**62), 2**62, (n,), device="cuda", generator=g)


def make_table_options(dim: int, rows: int) -> TableOptions:
    return TableOptions(
        name=f"bench{dim}",
        dim=dim,
        embedx_threshold=0,
        init_capacity=rows,
        embed_sgd_param={"name": "adagrad"},
        embedx_sgd_param={"name": "adagrad"},
    )


def make_table(dim: int, rows: int) -> DeviceTable:
    return DeviceTable(make_table_options(dim, rows), seed=0)


def bench_table(dim: int, load: float, capacity: int, steps: int, bandwidth: float) -> None:
    n = KEYS_PER_CALL
    table = make_table(dim, capacity + steps * n)
    present = random_keys(int(capacity * load), seed=dim)
    for a in range(0, present.numel(), n):
        table.pull_resident(present[a : a + n], True)
    g = torch.Generator(device="cuda").manual_seed(1)
    batches = [
        present[torch.randint(0, present.numel(), (n,), device="cuda", generator=g)]
        for _ in range(steps + 1)
    ]
    tag = f"dim {dim}, load {load}"
    t_find = gpu_timed(lambda i: table.pull_resident(batches[i], False), steps)
    figure(
        f"find ({tag})",
        n / t_find / 1e9,
        "G keys/s",
        floor=2.5 if dim == 8 else None,
    )
    if dim == 128:
        moved = n * (8 + 16 + 8 + 2 * 4 * dim)  # key, slot, row id, row read, weights written
        figure(f"pull bytes/s share of bandwidth ({tag})", moved / t_find / bandwidth, "")
    mixed = [
        torch.cat([b[: n // 2], random_keys(n - n // 2, seed=100 + i)])
        for i, b in enumerate(batches)
    ]
    t_foi = gpu_timed(lambda i: table.pull_resident(mixed[i], True), steps)
    figure(
        f"find_or_insert, half new ({tag})",
        n / t_foi / 1e9,
        "G keys/s",
        floor=1.5 if dim == 64 else None,
    )
    grads = torch.randn(n, dim, device="cuda") * 0.01
    ones = torch.ones(n, device="cuda")
    zeros = torch.zeros(n, device="cuda")

    def pull_push(i: int) -> None:
        table.pull_resident(batches[i], True)
        table.push(batches[i], grads, ones, zeros)

    t_store = gpu_timed(pull_push, steps)
    rows = table.size()
    table.close()
    torch.cuda.empty_cache()
    t_base = baseline(dim, rows, batches, steps)
    figure(
        f"pull + AdaGrad push ({tag})",
        n / t_store / 1e6,
        "M keys/s",
        baseline=n / t_base / 1e6,
        baseline_name="EmbeddingBag+Adagrad",
        floor=3.0,
    )


def bench_find_or_insert(
    dim: int, steps: int, n: int = KEYS_PER_CALL, device: str = "cuda", timed: Any = None
) -> tuple[float, float]:
    """Keys/s of the op ``find_or_insert`` on batches of ``n`` keys all new, then on the same
    batches again (all hit): each batch of distinct keys over the whole key space, an index
    of ``index_slots`` for every row (load at most 0.5), the new rows initialised. ``device``
    and ``timed`` (a :func:`gpu_timed`) are for a smoke run on the CPU build."""
    cpu = device == "cpu"
    ops = cuda_ext.load_cpu() if cpu else cuda_ext.load(device)
    timed = timed or gpu_timed
    rows = (steps + 1) * n
    gp = cuda_ext.TableParams.of(table_params(make_table_options(dim, rows), seed=0), pad=True)
    slots = ops.index_new(index_slots(rows))
    data = torch.zeros((rows, gp.stride), device=ops.device)
    row_keys = torch.zeros(rows, dtype=torch.int64, device=ops.device)
    next_row = torch.zeros(1, dtype=torch.int64, device=ops.device)
    g = torch.Generator(device=ops.device).manual_seed(dim)
    keys = torch.randint(-(2**62), 2**62, (rows,), device=ops.device, generator=g).unique()
    keys = keys[torch.randperm(keys.numel(), device=ops.device, generator=g)]
    batches = [keys[i * n : (i + 1) * n] for i in range(steps + 1)]

    def call(i: int) -> object:
        return ops.find_or_insert(slots, batches[i], next_row, row_keys, data, gp)

    t_new = timed(call, steps)
    inserted = int(next_row.item())
    assert inserted == keys.numel(), f"{inserted} rows for {keys.numel()} new keys"
    t_hit = timed(call, steps)
    assert int(next_row.item()) == inserted, "an all-hit call inserted rows"
    figure(
        f"find_or_insert op, all new (dim {dim})",
        n / t_new / 1e9,
        "G keys/s",
        baseline=n / t_hit / 1e9,
        baseline_name="all hit",
    )
    return n / t_new, n / t_hit


def cpu_timed(step: Callable[[int], object], steps: int) -> float:
    """Seconds per call on the CPU build: one warm-up call, then the median of ``steps``."""
    step(steps)
    times = []
    for i in range(steps):
        start = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def block_store(device: str, names: list[str], dim: int, rows: int) -> EmbeddingStore:
    opts = [make_table_options(dim, rows).model_copy(update={"name": n}) for n in names]
    return EmbeddingStore(opts, tier="device", device=device)


def bench_block_step(
    device: str, tables: int, keys_per_table: int, dim: int, steps: int, timed: Any
) -> None:
    """A training step's store work over ``tables`` device tables: a ``pull_rows`` and a
    ``push_rows`` of every table's keys (host keys with repeats, gradients on the device, as
    the trainer sends them). Prints its launches, syncs and copies per step (the same every
    step once warm; no sync is allowed inside), and its keys/s against the same tables pulled
    and pushed a table at a time."""
    names = [f"t{i}" for i in range(tables)]
    counts = [keys_per_table] * tables
    rows = keys_per_table * (steps + 2) * 2
    block = block_store(device, names, dim, rows)
    single = block_store(device, names, dim, rows)
    ops = block.tier(names[0])._ops  # type: ignore[attr-defined]
    g = torch.Generator().manual_seed(tables)
    pool = torch.randint(-(2**62), 2**62, (keys_per_table * tables * 4,), generator=g)
    batches = [
        pool[torch.randint(0, pool.numel(), (sum(counts),), generator=g)] for _ in range(steps + 1)
    ]
    grads = torch.randn(sum(counts), dim, device=ops.device) * 0.01

    def block_step(i: int) -> None:
        with ops.no_syncs("a training step"):
            block.pull_rows(names, batches[i], counts)
            block.push_rows(names, batches[i], counts, grads)

    def single_step(i: int) -> None:
        for name, k, gr in zip(names, batches[i].split(counts), grads.split(counts), strict=True):
            single.pull(name, k, device=ops.device)
            single.push(name, k, gr)

    block_step(steps)  # warm: descriptors, buffers
    before = ops.counts()
    block_step(0)
    per_step = ops.counts() - before
    before = ops.counts()
    single_step(0)
    per_table = ops.counts() - before
    tag = f"{tables} tables x {keys_per_table} keys, dim {dim}"
    figure(f"block step launches ({tag})", per_step.launches, "", digits=0,
           one_at_a_time=per_table.launches)  # fmt: skip
    figure(f"block step host syncs ({tag})", per_step.syncs, "", digits=0,
           one_at_a_time=per_table.syncs)  # fmt: skip
    figure(f"block step host-to-device copies ({tag})", per_step.copies, "", digits=0)
    n = sum(counts)
    t_block = timed(block_step, steps)
    t_single = timed(single_step, steps)
    figure(
        f"block pull + push ({tag})",
        n / t_block / 1e6,
        "M keys/s",
        baseline=n / t_single / 1e6,
        baseline_name="a table at a time",
        digits=3,
    )
    for store in (block, single):
        store.close()


def bench_reduction(
    device: str, tables: int, n: int, distinct: int, dim: int, steps: int, timed: Any
) -> None:
    """The push's duplicate-key reduction over a block of ``tables`` tables, ``n`` positions
    of ``distinct`` rows: the sort-grouped update (``update_tables``: a radix sort of
    (table, row, part), float64 sums in position order, the steps) against a hash grouping of
    the same (table, row) pairs (``unique_tables``) and a float64 scatter-add of gradients,
    shows and clicks by its inverse (the step not included)."""
    names = [f"t{i}" for i in range(tables)]
    counts = [n // tables] * tables
    counts[-1] += n - sum(counts)
    store = block_store(device, names, dim, distinct)
    tiers = [store.tier(name) for name in names]
    ops = tiers[0]._ops  # type: ignore[attr-defined]
    g = torch.Generator().manual_seed(7)
    pool = torch.randint(-(2**62), 2**62, (distinct,), generator=g)
    keys = pool[torch.randint(0, distinct, (n,), generator=g)]
    store.pull_rows(names, keys, counts)  # every row created
    entries = (cuda_ext.BlockTable * tables)(*[t.block_entry() for t in tiers])  # type: ignore[attr-defined]
    desc = torch.frombuffer(bytearray(entries), dtype=torch.uint8).to(ops.device)
    offsets = [0, *torch.tensor(counts).cumsum(0).tolist()]
    layout = torch.tensor(offsets + list(range(tables)), dtype=torch.int64, device=ops.device)
    args = cuda_ext.BlockArgs(
        desc,
        layout,
        tables,
        tables,
        n,
        dim,
        max(t.rows_limit() for t in tiers),  # type: ignore[attr-defined]
    )
    rows = ops.find_tables(args, keys.to(ops.device))
    grads = torch.randn(n, dim, device=ops.device) * 1e-3
    flag = ops.check_push_tables(args, grads, None, None)
    offsets_d = torch.tensor(offsets, dtype=torch.int64, device=ops.device)
    values = torch.cat([grads, torch.ones(n, 2, device=ops.device)], dim=1).double()

    def by_sort(_i: int) -> None:
        ops.update_tables(args, rows, grads, None, None, flag)

    def by_hash(_i: int) -> None:
        _distinct, inverse, _counts, _total = ops.unique_tables(rows, offsets_d)
        torch.zeros(n, dim + 2, dtype=torch.float64, device=ops.device).index_add_(
            0, inverse, values
        )

    t_sort, t_hash = timed(by_sort, steps), timed(by_hash, steps)
    tag = f"{tables} tables, {n:,} keys over {distinct:,} rows, dim {dim}"
    figure(f"push reduction by sort, with the steps ({tag})", n / t_sort / 1e6, "M keys/s",
           baseline=n / t_hash / 1e6, baseline_name="hash grouping + scatter-add, no step",
           digits=3)  # fmt: skip
    store.size(names[0])  # settles: the timed pushes left nothing to report
    store.close()


def cpu_main(args: argparse.Namespace) -> int:
    """Figures 4 and 5 on the CPU build of the kernels (no GPU)."""
    steps = args.steps or 3
    q = args.quick
    print(f"CPU build of the kernels, torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads, {steps} steps", flush=True)  # fmt: skip
    for tables in (1, 4, 26):
        bench_block_step("cpu", tables, 256 if q else 1024, 16, steps, cpu_timed)
    bench_reduction("cpu", 4, 1 << (14 if q else 17), 1 << (12 if q else 15), 16, steps, cpu_timed)
    if args.json:
        Path(args.json).write_text(json.dumps(RESULTS, indent=1))
    return 0


def baseline(dim: int, rows: int, batches: list[torch.Tensor], steps: int) -> float:
    """Seconds per call of EmbeddingBag(sparse=True) + Adagrad over ``rows`` rows, one id per
    bag, the store's keys taken modulo ``rows``."""
    bag = torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=True).cuda()
    opt = torch.optim.Adagrad(bag.parameters(), lr=0.05)
    ids = [b.remainder(rows) for b in batches]
    offsets = torch.arange(KEYS_PER_CALL, device="cuda")

    def step(i: int) -> None:
        out = bag(ids[i], offsets)
        out.sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return gpu_timed(step, steps)


def no_gpu_reason() -> str | None:
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    try:
        cuda_ext.load()
    except Exception as exc:  # the extension missing or unbuildable: say what
        return f"{type(exc).__name__}: {exc}"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small and short (a smoke run)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--capacity", type=int, default=None, help="table rows (default 2**24)")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument(
        "--cpu", action="store_true", help="the block figures on the CPU build (no GPU needed)"
    )
    args = p.parse_args(argv)
    if args.cpu:
        return cpu_main(args)
    reason = no_gpu_reason()
    if reason is not None:
        print(f"embedding_store_gpu: needs a CUDA GPU; {reason}", file=sys.stderr)
        return 2
    q = args.quick
    steps = args.steps or (3 if q else 10)
    capacity = args.capacity or (1 << 21 if q else 1 << 24)
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda}),"
        f" {KEYS_PER_CALL:,} keys per call, {steps} steps, table rows {capacity:,}",
        flush=True,
    )
    bandwidth = device_bandwidth(256 if q else 2048)
    figure("device bandwidth (device-to-device copy, read+write)", bandwidth / 1e9, "GB/s")
    failed = 0
    for dim in (8, 64, 128):
        for load in (0.5, 1.0):
            try:
                bench_table(dim, load, capacity, steps, bandwidth)
            except Exception as exc:  # report and go on: the other figures still count
                failed += 1
                print(f"dim {dim} load {load}: NOT MEASURED: {type(exc).__name__}: {exc}")
            torch.cuda.empty_cache()
    for dim in (8, 64):
        try:
            bench_find_or_insert(dim, steps)
        except Exception as exc:
            failed += 1
            print(f"find_or_insert op dim {dim}: NOT MEASURED: {type(exc).__name__}: {exc}")
        torch.cuda.empty_cache()
    for tables in (1, 4, 26):
        try:
            bench_block_step("cuda", tables, 2048 if q else 8192, 16, steps, gpu_timed)
        except Exception as exc:
            failed += 1
            print(f"block step {tables} tables: NOT MEASURED: {type(exc).__name__}: {exc}")
        torch.cuda.empty_cache()
    try:
        bench_reduction("cuda", 26, KEYS_PER_CALL, KEYS_PER_CALL // 8, 16, steps, gpu_timed)
    except Exception as exc:
        failed += 1
        print(f"push reduction: NOT MEASURED: {type(exc).__name__}: {exc}")
    print("trainer end to end on the GPU: TODO, not measured yet (see the module doc)")
    if args.json:
        Path(args.json).write_text(json.dumps(RESULTS, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
