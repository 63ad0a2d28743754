"""Benchmark of the embedding store : every figure next to a baseline
measured in the same run, printed as a ratio.

Figures:
1. memory bandwidth: a large numpy copy (bytes read + written per second).
2. pull + push, dim 16 and 64, ~100k ids per step drawn uniform and Zipf(1.1) from 10M
   possible keys: in-process with AdaGrad (and naive SGD), through the service with 1 and 2
   shards (AdaGrad). Baseline: ``torch.nn.EmbeddingBag(sparse=True)`` over a fixed 1M-row
   table (id mod 1M) with the matching torch optimizer (SGD / Adagrad) on the same ids, one
   id per bag (a lookup is one id, as for the store). Floors (not asserted): in-process
   >= 2.0x, service >= 1.0x. For in-process AdaGrad, the bytes the step moves per second as a
   share of the measured memory bandwidth.
3. RAM bytes per row (dim 16, AdaGrad) against the minimum: key 8 + weights 4*dim + AdaGrad
   state 2*4 (one g2sum per part) + show/click 2*4. Then fp16 and bf16 tables (``dtype``)
   beside fp32 at dims 16 and 64 (torch Adagrad): the row's bytes and pull + push
   throughput, each as a ratio to fp32's in the same run.
4. ssd tier with a table 4x its cache budget: throughput and hit rate, against the host tier
   on the same ids.
5. the trainer's shape: pull + naive SGD push of 106,496 ids a step (setup b's 26 slots x 2
   batches of 2,048) drawn uniform from 1M keys presized, dim 16, against EmbeddingBag + SGD
   over the same 1M rows and ids; floor 3.0x, goal 4.0x; with the bytes it moves as a share of
   the measured copy bandwidth.

Run alone on the machine for the recorded figures:
    .venv/bin/python bench/embedding_store.py            (full; several minutes)
    .venv/bin/python bench/embedding_store.py --quick    (small and short; a smoke run)
    .venv/bin/python bench/embedding_store.py --sections trainer-shape   (figure 5 alone)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from streamrec.embedding_store import (
    EmbeddingStore,
    EmbeddingStoreClient,
    LocalShards,
    TableOptions,
)
from streamrec.keyhash import mix64

KEY_SPACE = 10_000_000
SECTIONS = ("transport", "speed", "bytes-per-row", "ssd-tier", "trainer-shape")
BASELINE_ROWS = 1_000_000
RESULTS: list[dict] = []


def figure(
    name: str,
    value: float,
    unit: str,
    baseline: float | None = None,
    baseline_name: str = "",
    floor: float | None = None,
    digits: int = 1,
    **extra: float,
) -> None:
    """Prints one figure (with its baseline and ratio) and keeps it for --json. ``floor``:
    the least ratio to the baseline, or the least value where there is no baseline."""
    line = f"{name:<56} {value:>12,.{digits}f} {unit}"
    row = {"name": name, "value": value, "unit": unit, **extra}
    if baseline is not None:
        ratio = value / baseline if baseline else float("nan")
        line += f" | {baseline_name} {baseline:,.{digits}f} {unit} | ratio {ratio:.2f}x"
        row.update(baseline=baseline, baseline_name=baseline_name, ratio=ratio)
        if floor is not None:
            line += f" (floor {floor:.1f}x: {'met' if ratio >= floor else 'NOT met'})"
            row["floor"] = floor
    elif floor is not None:
        line += f" (floor {floor:,.{digits}f}: {'met' if value >= floor else 'NOT met'})"
        row["floor"] = floor
    for k, v in extra.items():
        line += f" | {k} {v:.3g}"
    print(line, flush=True)
    RESULTS.append(row)


def markdown_table(rows: list[dict]) -> str:
    """The figures as a Markdown table: figure, value, baseline, ratio, floor, notes."""
    out = ["| figure | value | baseline | ratio | floor | notes |", "|---|---|---|---|---|---|"]
    skip = {"name", "value", "unit", "baseline", "baseline_name", "ratio", "floor"}
    for r in rows:
        base = f"{r['baseline']:,.1f} ({r['baseline_name']})" if "baseline" in r else ""
        ratio = f"{r['ratio']:.2f}x" if "ratio" in r else ""
        floor = f"{r['floor']:.1f}x" if "floor" in r else ""
        notes = ", ".join(f"{k} {v:.3g}" for k, v in r.items() if k not in skip)
        value = f"{r['value']:,.1f} {r['unit']}"
        out.append(f"| {r['name']} | {value} | {base} | {ratio} | {floor} | {notes} |")
    return "\n".join(out)


def memory_bandwidth(mib: int) -> float:
    """Bytes per second of a numpy copy of ``mib`` MiB (read + write counted), best of 5."""
    src = np.ones(mib * (1 << 20) // 8, dtype=np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.nbytes / best


def id_batches(dist: str, steps: int, n: int, seed: int) -> list[np.ndarray]:
    """``steps`` batches of ``n`` int64 keys from 10M possible keys (rank -> mixed key)."""
    rng = np.random.default_rng(seed)
    if dist == "uniform":
        ranks = [rng.integers(0, KEY_SPACE, n) for _ in range(steps)]
    else:
        weights = np.arange(1, KEY_SPACE + 1, dtype=np.float64) ** -1.1
        cdf = np.cumsum(weights)
        cdf /= cdf[-1]
        ranks = [np.searchsorted(cdf, rng.random(n)) for _ in range(steps)]
    # hot ranks spread over the key space (and the shards), as real feature ids are
    return [mix64(r.astype(np.uint64)).view(np.int64) for r in ranks]


def timed(step: Callable[[int], None], steps: int) -> float:
    """Seconds per step: one warm-up step on batch ``steps`` (not one of the timed batches,
    so no timed step finds its ids already created by the warm-up), then the median of
    ``steps`` timed steps on batches 0 .. steps-1 (the machine may be shared; the median
    keeps a stray stall from deciding a figure). Callers hold steps + 1 batches."""
    step(steps)
    times = []
    for i in range(steps):
        t = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def baseline(rule: str, dim: int, batches: list[np.ndarray]) -> float:
    """Lookups/s of EmbeddingBag(sparse=True) over 1M rows with torch SGD or Adagrad."""
    bag = torch.nn.EmbeddingBag(BASELINE_ROWS, dim, mode="sum", sparse=True)
    opt = (
        torch.optim.SGD(bag.parameters(), lr=0.05)
        if rule == "sgd"
        else torch.optim.Adagrad(bag.parameters(), lr=0.05)
    )
    idx = [
        torch.from_numpy((b.view(np.uint64) % np.uint64(BASELINE_ROWS)).astype(np.int64))
        for b in batches
    ]
    offsets = torch.arange(idx[0].numel())

    def step(i: int) -> None:
        out = bag(idx[i % len(idx)], offsets)
        out.sum().backward()
        opt.step()
        opt.zero_grad()

    return idx[0].numel() / timed(step, len(batches) - 1)


def table(
    name: str, dim: int, rule: str, init_capacity: int = 0, dtype: str = "fp32"
) -> TableOptions:
    sgd = {"name": rule, "learning_rate": 0.05, "initial_range": 0.01}
    return TableOptions.parse(
        {
            "name": name,
            "dim": dim,
            "embedx_threshold": 0,
            "embed_sgd_param": sgd,
            "embedx_sgd_param": sgd,
            "init_capacity": init_capacity,
            "dtype": dtype,
        }
    )


def distinct_keys(batches: list[np.ndarray]) -> int:
    """Rows a table holds after every batch (what a user sizes ``init_capacity`` to)."""
    return int(np.unique(np.concatenate(batches)).size)


def store_step(
    store, name: str, batches: list[np.ndarray], grads: torch.Tensor
) -> Callable[[int], None]:
    keys = [torch.from_numpy(b) for b in batches]

    def step(i: int) -> None:
        k = keys[i % len(keys)]
        store.pull(name, k)
        store.push(name, k, grads)

    return step


def bytes_moved(batches: list[np.ndarray], dim: int, row_bytes: float) -> float:
    """Bytes one pull + push step moves on average: pull reads a row's weights and writes
    the output, push reads the gradient, then reads and writes each unique row whole."""
    n = batches[0].size
    unique = np.mean([np.unique(b).size for b in batches])
    return n * 4 * dim * 3 + unique * (4 * dim + 2 * row_bytes)


def bench_speed(args: argparse.Namespace, bandwidth: float, tmp: Path) -> None:
    n, steps = args.ids, args.steps
    dists = ("uniform", "zipf")
    batches = {d: id_batches(d, steps + 1, n, seed=1) for d in dists}  # + warm-up
    sizes = {d: distinct_keys(batches[d]) for d in dists}
    # service tables presized to the rows the run creates, sized for the smallest shard
    # count (one file for every run: with 2 shards each allocates twice what it fills)
    per_shard = {d: int(sizes[d] * 1.1 / min(args.shards)) for d in dists}
    service_tables = [
        table(f"ada{dim}_{d}", dim, "adagrad", per_shard[d]) for dim in args.dims for d in dists
    ]
    tables_file = tmp / "tables.json"
    tables_file.write_text(json.dumps([t.model_dump(mode="json") for t in service_tables]))
    base: dict[tuple, float] = {}
    for dim in args.dims:
        grads = torch.full((n, dim), 1e-3)
        for d in dists:
            for rule, torch_rule in (("adagrad", "adagrad"), ("naive", "sgd")):
                if rule == "naive" and (dim != args.dims[0]):
                    continue
                b = baseline(torch_rule, dim, batches[d])
                base[(dim, d, rule)] = b
                # growing from empty, and presized to the rows the run creates (the
                # baseline's fixed table is allocated before its timing too)
                for sizing, init in (("grown", 0), ("presized", sizes[d])):
                    store = EmbeddingStore([table("t", dim, rule, init)], num_threads=args.threads)
                    sec = timed(store_step(store, "t", batches[d], grads), steps)
                    stats = store.stats()
                    row_bytes = sum(stats["bytes"].values()) / max(stats["rows"], 1)
                    store.close()
                    extra = {}
                    if rule == "adagrad":
                        moved = bytes_moved(batches[d], dim, row_bytes) / sec
                        extra["share_of_bandwidth"] = moved / bandwidth
                    figure(
                        f"in-process {sizing} pull+{rule} push dim{dim} {d}",
                        n / sec / 1e3,
                        "k lookups/s",
                        b / 1e3,
                        f"EmbeddingBag+{torch_rule}",
                        floor=2.0,
                        **extra,
                    )
    for transport in ("tcp", "ipc"):
        # tcp on 127.0.0.1 (a shard on another machine goes over tcp), and ipc (a Unix
        # socket: a shard on the trainer's node); moving 25 MB of rows each way per dim-64
        # step costs about 33 ms over loopback tcp here and 13 ms over ipc
        for shards in args.shards:
            endpoint = (
                "tcp://127.0.0.1:*" if transport == "tcp" else f"ipc://{tmp}/shard-{{shard}}.ipc"
            )
            with LocalShards(
                tables_file, shards, extra_args=["--workers", "2"], endpoint=endpoint
            ) as svc:
                client = EmbeddingStoreClient(svc.endpoints, timeout_s=120)
                for dim in args.dims:
                    grads = torch.full((n, dim), 1e-3)
                    for d in dists:
                        step = store_step(client, f"ada{dim}_{d}", batches[d], grads)
                        sec = timed(step, steps)
                        figure(
                            f"service {transport} {shards} shard(s) presized pull+adagrad "
                            f"push dim{dim} {d}",
                            n / sec / 1e3,
                            "k lookups/s",
                            base[(dim, d, "adagrad")] / 1e3,
                            "EmbeddingBag+adagrad",
                            floor=1.0,
                        )
                client.close()


#: the trainer's shape (figure 5): setup b's 26 slots x 2 batches of 2,048 ids, 1M keys
TRAINER_SHAPE_IDS = 106_496
TRAINER_SHAPE_KEYS = 1_000_000


def bench_trainer_shape(args: argparse.Namespace, bandwidth: float) -> None:
    """Figure 5: store pull + naive push against EmbeddingBag + SGD, 1M presized keys."""
    n, dim, steps = TRAINER_SHAPE_IDS, 16, args.steps
    rng = np.random.default_rng(5)
    ranks = [rng.integers(0, TRAINER_SHAPE_KEYS, n) for _ in range(steps + 1)]  # + warm-up
    batches = [mix64(r.astype(np.uint64)).view(np.int64) for r in ranks]
    grads = torch.full((n, dim), 1e-3)
    store = EmbeddingStore([table("t", dim, "naive", TRAINER_SHAPE_KEYS)], num_threads=args.threads)
    every = mix64(np.arange(TRAINER_SHAPE_KEYS, dtype=np.uint64)).view(np.int64)
    store.pull("t", every)  # presized and filled: every key exists before timing
    stats = store.stats()
    row_bytes = sum(stats["bytes"].values()) / max(stats["rows"], 1)
    for _ in range(3):  # store and baseline in turns: both see the machine's load alike
        base = baseline("sgd", dim, batches)
        sec = timed(store_step(store, "t", batches, grads), steps)
        moved = bytes_moved(batches, dim, row_bytes) / sec
        figure(
            f"in-process pull+naive push dim{dim}, {n:,} ids over 1M presized keys",
            n / sec / 1e3,
            "k lookups/s",
            base / 1e3,
            "EmbeddingBag+sgd",
            floor=3.0,
            share_of_bandwidth=moved / bandwidth,
        )
    store.close()


def transport_round_trip(tmp: Path, mb: float = 25.6) -> None:
    """Milliseconds to send ``mb`` MB over ZeroMQ and get it back (a dim-64 step's pull reply
    and push request), over loopback tcp and over ipc, between two threads."""
    import zmq

    ctx = zmq.Context()
    payload = np.ones(int(mb * 1e6) // 4, dtype=np.float32)
    for transport, address in (("tcp", "tcp://127.0.0.1:*"), ("ipc", f"ipc://{tmp}/rt.ipc")):
        server, client = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
        server.bind(address)
        client.connect(server.getsockopt(zmq.LAST_ENDPOINT).decode())

        def echo(count: int, server=server) -> None:
            for _ in range(count):
                frames = server.recv_multipart(copy=False)
                server.send_multipart([frames[0], frames[-1]], copy=False)

        rounds = 6
        th = threading.Thread(target=echo, args=(rounds,))
        th.start()
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            client.send(payload, copy=False)
            client.recv(copy=False)
            times.append(time.perf_counter() - t)
        th.join()
        server.close()
        client.close()
        figure(f"zmq round trip {mb} MB each way, {transport}", 1e3 * np.median(times[1:]), "ms")
    ctx.term()


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def bytes_per_row_in_fresh_process(rows: int, init_capacity: int) -> tuple[float, float]:
    """(allocated bytes / row from the store's stats, RSS growth / row) of a dim-16 AdaGrad
    table filled with ``rows`` keys, in this (fresh) process: memory an earlier section freed
    and the allocator kept would otherwise hide the growth."""
    dim = 16
    before = rss_bytes()
    store = EmbeddingStore([table("t", dim, "adagrad", init_capacity)])
    chunk = 100_000
    keys = mix64(np.arange(rows, dtype=np.uint64)).view(np.int64)
    for i in range(0, rows, chunk):
        store.pull("t", keys[i : i + chunk])
    stats = store.stats()
    held = sum(stats["bytes"].values()) / stats["rows"]
    grown = (rss_bytes() - before) / rows
    store.close()
    return held, grown


def bench_bytes_per_row(rows: int) -> None:
    minimum = 8 + 4 * 16 + 2 * 4 + 2 * 4
    spawn = multiprocessing.get_context("spawn")
    for sizing, init in (("grown", 0), ("presized", rows)):
        with ProcessPoolExecutor(1, mp_context=spawn) as pool:
            held, grown = pool.submit(bytes_per_row_in_fresh_process, rows, init).result()
        for what, value in (("store stats", held), ("process RSS growth", grown)):
            figure(
                f"RAM bytes/row dim16 adagrad, {sizing} ({rows:,} rows, {what})",
                value,
                "B/row",
                minimum,
                "minimum",
            )


def bench_compact_rows(args: argparse.Namespace) -> None:
    """Row bytes and pull + push throughput of fp16 and bf16 tables beside fp32's, in the
    same run: dims 16 and 64 under the trainer's default rule (torch Adagrad: one state
    value per weight), uniform ids over 1M keys, presized."""
    n, steps = args.ids, args.steps
    rng = np.random.default_rng(5)
    batches = [
        mix64(rng.integers(0, 1_000_000, n).astype(np.uint64)).view(np.int64)
        for _ in range(steps + 1)
    ]
    distinct = distinct_keys(batches)
    for dim in (16, 64):
        grads = torch.full((n, dim), 1e-3)
        fp32: tuple[float, float] | None = None
        for dtype in ("fp32", "fp16", "bf16"):
            store = EmbeddingStore([table("t", dim, "torch_adagrad", distinct, dtype)])
            rate = n / timed(store_step(store, "t", batches, grads), steps)
            row_bytes = 4.0 * store.tier("t").width  # the row's words (key and index apart)
            store.close()
            fp32 = fp32 or (row_bytes, rate)
            figure(f"row bytes dim{dim} torch_adagrad {dtype}", row_bytes, "B/row", fp32[0], "fp32")
            figure(
                f"pull+push dim{dim} torch_adagrad {dtype} ({n:,} ids)",
                rate / 1e3,
                "k lookups/s",
                fp32[1] / 1e3,
                "fp32",
            )


def bench_ssd(args: argparse.Namespace, tmp: Path) -> None:
    dim, n, steps = 16, args.ids, args.steps
    budget_mb = args.ssd_cache_mb
    probe = EmbeddingStore([table("t", dim, "adagrad")])
    probe.pull("t", np.arange(100_000, dtype=np.int64))
    stats = probe.stats()["tables"]["t"]
    row_bytes = sum(stats["bytes"].values()) / stats["rows"]
    probe.close()
    rows = int(4 * budget_mb * (1 << 20) / row_bytes)
    keys = mix64(np.arange(rows, dtype=np.uint64)).view(np.int64)
    rng = np.random.default_rng(2)
    batches = [keys[rng.integers(0, rows, n)] for _ in range(steps + 1)]  # + warm-up
    grads = torch.full((n, dim), 1e-3)
    results = {}
    for tier in ("host", "ssd"):
        kw = {}
        if tier == "ssd":
            kw = {
                "persistent_path": str(tmp / "ssd"),
                "cache_budget_mb": budget_mb,
                "capacity": 2 * rows,
            }
        store = EmbeddingStore([table("t", dim, "adagrad")], tier=tier, **kw)
        for i in range(0, rows, 100_000):
            store.pull("t", keys[i : i + 100_000])
        s0 = store.stats()["tables"]["t"]
        sec = timed(store_step(store, "t", batches, grads), steps)
        s1 = store.stats()["tables"]["t"]
        hits = s1["cache_hits"] - s0["cache_hits"]
        misses = s1["cache_misses"] - s0["cache_misses"]
        results[tier] = (n / sec, hits / max(hits + misses, 1), s1["rows"])
        store.close()
    figure(
        f"ssd tier pull+adagrad push, {results['ssd'][2]:,} rows = 4x {budget_mb} MiB cache",
        results["ssd"][0] / 1e3,
        "k lookups/s",
        results["host"][0] / 1e3,
        "host tier",
        hit_rate=results["ssd"][1],
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small and short (a smoke run)")
    p.add_argument("--ids", type=int, default=None, help="ids per step (default 100k)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="store compute threads")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument(
        "--markdown", action="store_true", help="end with a table of the figures (BENCHMARKS.md)"
    )
    p.add_argument(
        "--sections",
        nargs="+",
        choices=SECTIONS,
        default=list(SECTIONS),
        help="which figures to measure (default: all)",
    )
    args = p.parse_args(argv)
    if args.threads:  # for the baselines too, so both sides run on the same threads
        torch.set_num_threads(args.threads)
    q = args.quick
    args.ids = args.ids or (20_000 if q else 100_000)
    args.steps = args.steps or (3 if q else 20)
    args.dims = [16] if q else [16, 64]
    args.shards = [1, 2]
    args.ssd_cache_mb = 2 if q else 64
    rows_for_bytes = 200_000 if q else 2_000_000
    print(
        f"torch {torch.__version__}, {os.cpu_count()} cpus, torch threads "
        f"{torch.get_num_threads()}, {args.ids:,} ids/step, {args.steps} steps"
        f"{' (quick)' if q else ''}",
        flush=True,
    )
    bandwidth = memory_bandwidth(128 if q else 1024)
    figure("memory bandwidth (numpy copy, read+write)", bandwidth / 1e9, "GB/s")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="bench-emb-") as tmp:
        runs = {
            "transport": lambda: transport_round_trip(Path(tmp)),
            "speed": lambda: bench_speed(args, bandwidth, Path(tmp)),
            "bytes-per-row": lambda: (
                bench_bytes_per_row(rows_for_bytes),
                bench_compact_rows(args),
            ),
            "ssd-tier": lambda: bench_ssd(args, Path(tmp)),
            "trainer-shape": lambda: bench_trainer_shape(args, bandwidth),
        }
        for section in args.sections:
            run = runs[section]
            try:
                run()
            except Exception as exc:  # report and go on: the other figures still count
                failed += 1
                print(f"{section}: NOT MEASURED: {type(exc).__name__}: {exc}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(RESULTS, indent=1))
    if args.markdown:
        print(markdown_table(RESULTS))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
