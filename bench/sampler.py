"""Sampler benchmark: negatives/s through the service, in-process, and numpy.

Table: ``--items`` items in ``--categories`` categories, Pareto(1.2) weights (a few items
carry most of each category's weight), plus a float and a ragged feature column. Batches:
``--batch`` positives x ``--negatives`` negatives, positives drawn at random from the table
(so own-id avoidance is in play). All figures come from this one run:

* service: ``--clients`` client processes at once against one server process
  (``--workers`` threads), ``sample_ids`` end to end (encode, ipc socket, decode);
* in-process: the same sampling core (``NegativeTable.sample``) called directly from one
  thread (its compiled kernel may use up to ``torch.get_num_threads()`` OpenMP threads,
  fewer on a loaded machine);
* numpy baseline: what a user would write, ``rng.choice(items, cnt, p=probs)`` per positive
  with each category's items and probabilities precomputed (and no own-id avoidance);
  also the stronger per-category variant (one ``rng.choice`` per category of the batch).

Full size (run alone on the machine, ~2-3 minutes)::

    .venv/bin/python bench/sampler.py

Quick::

    .venv/bin/python bench/sampler.py --items 100000 --batches 4 --baseline-batches 1
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import torch
from streamrec.ragged import RaggedTensor
from streamrec.sampler import LocalRpcDataSampler
from streamrec.sampler.client import stop_server
from streamrec.sampler.columns import to_columns
from streamrec.sampler.table import NegativeTable, Tags

TAGS = ("cat", "item", "w", "skey")


def make_table(items: int, categories: int, seed: int = 0) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    ids = rng.permutation(items).astype(np.int64) * 1_000_003 + 17
    cats = rng.integers(0, categories, items)
    weights = (rng.pareto(1.2, items) + 1e-3).astype(np.float32)
    tag_lens = rng.integers(1, 4, items)
    return {
        "item": torch.from_numpy(ids),
        "cat": RaggedTensor.from_lengths(
            torch.from_numpy(cats), torch.ones(items, dtype=torch.int64)
        ),
        "w": torch.from_numpy(weights),
        "skey": [""] * items,
        "price": torch.from_numpy(rng.random(items).astype(np.float32)),
        "tags": RaggedTensor.from_lengths(
            torch.from_numpy(rng.integers(0, 1 << 40, int(tag_lens.sum()))),
            torch.from_numpy(tag_lens),
        ),
    }


def make_batches(
    table: dict, batch: int, count: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    ids = table["item"].numpy()
    cats = table["cat"].values().numpy()
    out = []
    for _ in range(count):
        rows = rng.integers(0, len(ids), batch)
        out.append((ids[rows], cats[rows]))
    return out


def client_worker(endpoint: str, batches: list, negatives: int, barrier, results) -> None:
    sampler = LocalRpcDataSampler(*TAGS, endpoint=endpoint, auto_start=False)
    ids, cats = batches[0]  # one untimed warm-up call, as the in-process figure has
    sampler.sample_ids(torch.from_numpy(ids), negatives, torch.from_numpy(cats))
    barrier.wait()
    started = time.perf_counter()
    total = 0
    for ids, cats in batches:
        total += sampler.sample_ids(
            torch.from_numpy(ids), negatives, torch.from_numpy(cats)
        ).numel()
    results.put((total, started, time.perf_counter()))
    sampler.close()


def run_service(endpoint: str, batches_per_client: list[list], negatives: int) -> tuple[float, int]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(batches_per_client))
    results = ctx.Queue()
    procs = [
        ctx.Process(target=client_worker, args=(endpoint, b, negatives, barrier, results))
        for b in batches_per_client
    ]
    for p in procs:
        p.start()
    got = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    total = sum(g[0] for g in got)
    wall = max(g[2] for g in got) - min(g[1] for g in got)
    return wall, total


def numpy_baseline(table: dict, batches: list, negatives: int, grouped: bool) -> tuple[float, int]:
    ids = table["item"].numpy()
    cats = table["cat"].values().numpy()
    w = table["w"].numpy().astype(np.float64)
    order = np.argsort(cats, kind="stable")
    bounds = np.searchsorted(cats[order], np.arange(cats.max() + 2))
    items = {c: ids[order[bounds[c] : bounds[c + 1]]] for c in range(len(bounds) - 1)}
    probs = {
        c: w[order[bounds[c] : bounds[c + 1]]] / w[order[bounds[c] : bounds[c + 1]]].sum()
        for c in items
        if bounds[c + 1] > bounds[c]
    }
    rng = np.random.default_rng(1)
    total = 0
    started = time.perf_counter()
    for _, pcats in batches:
        out = np.empty(len(pcats) * negatives, np.int64)
        if grouped:
            pos_order = np.argsort(pcats, kind="stable")
            uniq, first, counts = np.unique(pcats[pos_order], return_index=True, return_counts=True)
            for c, f, k in zip(uniq, first, counts, strict=True):
                draws = rng.choice(items[c], k * negatives, p=probs[c]).reshape(k, negatives)
                rows = pos_order[f : f + k]
                out.reshape(-1, negatives)[rows] = draws
        else:
            for i, c in enumerate(pcats):
                out[i * negatives : (i + 1) * negatives] = rng.choice(
                    items[c], negatives, p=probs[c]
                )
        total += len(out)
    return time.perf_counter() - started, total


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--categories", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--negatives", type=int, default=100)
    parser.add_argument(
        "--batches", type=int, default=100, help="batches per client process (and in-process)"
    )
    parser.add_argument("--baseline-batches", type=int, default=3)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="server request threads")
    args = parser.parse_args()

    print(
        f"sampler benchmark: {args.items:,} items, {args.categories:,} categories, batches of "
        f"{args.batch:,} x {args.negatives} negatives, {args.clients} client processes, "
        f"server workers {args.workers}, cpus {os.cpu_count()}, "
        f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}"
    )
    table = make_table(args.items, args.categories)
    batches = [
        make_batches(table, args.batch, args.batches, seed=10 + k) for k in range(args.clients)
    ]

    # In-process: the same core, one thread.
    t0 = time.perf_counter()
    core = NegativeTable(to_columns(table), Tags(*TAGS))
    build_s = time.perf_counter() - t0
    rng = np.random.default_rng(2)
    counts = np.full(args.batch, args.negatives, np.int64)
    core.sample(batches[0][0][0], batches[0][0][1], counts, rng=rng)  # warm-up
    started = time.perf_counter()
    inproc_total = 0
    for ids, cats in batches[0]:
        inproc_total += len(core.sample(ids, cats, counts, rng=rng).ids)
    inproc_rate = inproc_total / (time.perf_counter() - started)
    print(f"table build (validate + alias tables): {build_s:.2f} s")
    print(f"in-process sample_ids:             {inproc_rate / 1e6:8.2f} M negatives/s")

    base_batches = batches[0][: args.baseline_batches]
    secs, total = numpy_baseline(table, base_batches, args.negatives, grouped=False)
    base_rate = total / secs
    print(f"numpy baseline (choice per positive): {base_rate / 1e6:8.2f} M negatives/s")
    secs, total = numpy_baseline(table, base_batches, args.negatives, grouped=True)
    grouped_rate = total / secs
    print(f"numpy per-category choice:         {grouped_rate / 1e6:8.2f} M negatives/s")

    # Service: a real server process and client processes over an ipc socket.
    directory = tempfile.mkdtemp(prefix="srbench-", dir="/tmp")
    endpoint = f"ipc://{directory}/sampler.sock"
    loader = LocalRpcDataSampler(
        *TAGS, endpoint=endpoint, auto_start=True, server_args=["--workers", str(args.workers)]
    )
    try:
        t0 = time.perf_counter()
        info = loader.reload(table)
        print(
            f"reload over the wire: {time.perf_counter() - t0:.2f} s "
            f"(server build {info['seconds']:.2f} s)"
        )
        run_service(endpoint, [b[:1] for b in batches], args.negatives)  # warm-up
        wall, total = run_service(endpoint, batches, args.negatives)
        service_rate = total / wall
        print(
            f"service, {args.clients} clients at once:      {service_rate / 1e6:8.2f} M negatives/s"
        )
        wall1, total1 = run_service(endpoint, batches[:1], args.negatives)
        print(f"service, 1 client:                 {total1 / wall1 / 1e6:8.2f} M negatives/s")

        # pack_feature + combine for one batch (RecIS's neg_sampling_fn after sample_ids).
        ids, cats = batches[0][0]
        ones = torch.ones(args.batch, dtype=torch.int64)
        batch = [
            {
                "item": RaggedTensor.from_lengths(torch.from_numpy(ids), ones),
                "cat": RaggedTensor.from_lengths(torch.from_numpy(cats), ones),
                "user": RaggedTensor.from_lengths(torch.arange(args.batch), ones),
            }
        ]
        cnts = torch.full((args.batch,), args.negatives)
        neg = loader.sample_ids(batch[0]["item"], cnts, batch[0]["cat"])
        reps = 5
        t0 = time.perf_counter()
        for _ in range(reps):
            pos_neg = loader.combine_vector_with_sample_counts(torch.from_numpy(ids), cnts, neg)
            packed = loader.pack_feature(pos_neg, default_value=0)
            combined = loader.combine(batch, packed, cnts)
        pack_s = (time.perf_counter() - t0) / reps
        rows = len(combined[0]["label"])
        print(
            f"pack_feature + combine, one batch: {pack_s * 1e3:8.1f} ms "
            f"({rows:,} rows, {rows / pack_s / 1e6:.2f} M rows/s)"
        )
    finally:
        stop_server(loader.server_pid)
        loader.close()
        shutil.rmtree(directory, ignore_errors=True)

    print()
    print(f"service / in-process:              {service_rate / inproc_rate:6.2f}x  (floor 0.75x)")
    print(f"in-process / numpy per positive:   {inproc_rate / base_rate:6.2f}x  (floor 20x)")
    print(f"in-process / numpy per category:   {inproc_rate / grouped_rate:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
