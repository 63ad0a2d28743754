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
4. TODO (not measured yet): the trainer end to end on the GPU (``bench/trainer.py`` setup b,
   the store in-process on tier device) against the reference DLRM step alone.

Without a CUDA GPU it exits 2 saying so. Run alone on the GPU machine:
    python bench/embedding_store_gpu.py            (full; a few minutes)
    python bench/embedding_store_gpu.py --quick    (small; a smoke run)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# the figures' printing and --json rows are the CPU store bench's (bench/ is on sys.path)
from embedding_store import RESULTS
from embedding_store import figure as cpu_figure
from streamrec.embedding_store import cuda_ext
from streamrec.embedding_store.device_tier import DeviceTable
from streamrec.embedding_store.tier import index_slots, table_params
from streamrec.store_schema import TableOptions

KEYS_PER_CALL = 1 << 20


def figure(name: str, value: float, unit: str, **kw: Any) -> None:
    """A figure with three decimals (billions of keys/s, GB/s)."""
    cpu_figure(name, value, unit, digits=3, **kw)


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
    args = p.parse_args(argv)
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
    print("trainer end to end on the GPU: TODO, not measured yet (see the module doc)")
    if args.json:
        Path(args.json).write_text(json.dumps(RESULTS, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
