"""Benchmark of the ssd tier against the host tier on the same table and the same skewed stream.

The stream: each step looks up 106,496 keys, 90% drawn uniform from a hot set
of 10% of the rows, 10% uniform over all rows; a step is a pull then an AdaGrad push (dim
16). Each tier runs in a process of its own (its peak memory its own): each creates its table in
turn (creation rows/s) and warms it, then the parent alternates their steps (so that both
see the same load on a shared machine) and reports each tier's median and the median of the
per-step ratios. Printed per tier: pull +
push keys/s, creation rows/s, and for the ssd tier its ratio to the host tier, cache hit rate,
evictions and disk bytes read/written per step; peak RssAnon and RssFile of each process
(/proc/self/status, sampled every 50 ms: file-backed pages are the page cache's, not the
cache budget's).

    .venv/bin/python bench/ssd_tier.py --rows 10_000_000
    .venv/bin/python bench/ssd_tier.py --rows 30_000_000 --cache-share 0.125
    .venv/bin/python bench/ssd_tier.py --rows 30_000_000 --tiers ssd --cold
    .venv/bin/python bench/ssd_tier.py --rows 30_000_000 --tiers ssd --dtype fp16
        (the same cache bytes as fp32's: more rows fit; compare the hit rates)
    .venv/bin/python bench/ssd_tier.py --rows 300_000_000 --tiers ssd --checkpoint --dir D
        (file ~29 GB, its checkpoint ~29 GB more)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import torch
from streamrec.embedding_store import EmbeddingStore, TableOptions
from streamrec.keyhash import mix64

LOOKUPS = 106_496
DIM = 16
#: a row of the table in RAM: the row (show, click, unseen, flags, dim weights, 2 AdaGrad
#: g2sums), its key and about 16 bytes of hash index; "cache 1/8 of the table" is of these
ROW_BYTES = 4 * (4 + DIM + 2) + 8 + 16


def memory_kib() -> dict[str, int]:
    """RssAnon and RssFile of this process, KiB."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("RssAnon", "RssFile"):
            out[name] = int(value.split()[0])
    return out


class PeakMemory:
    """Peak RssAnon and RssFile, sampled in a thread every ``every`` seconds."""

    def __init__(self, every: float = 0.05) -> None:
        self.peak = {"RssAnon": 0, "RssFile": 0}
        self._stop = threading.Event()
        self._every = every
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.sample()

    def sample(self) -> None:
        for k, v in memory_kib().items():
            self.peak[k] = max(self.peak[k], v)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        self.sample()
        return {k: v / 2**20 for k, v in self.peak.items()}  # GiB


def table(dtype: str = "fp32") -> TableOptions:
    sgd = {"name": "adagrad", "learning_rate": 0.05, "initial_range": 0.01}
    return TableOptions.parse(
        {
            "name": "t",
            "dim": DIM,
            "embedx_threshold": 0,
            "embed_sgd_param": sgd,
            "embedx_sgd_param": sgd,
            "dtype": dtype,
        }
    )


def keys_of(ranks: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(mix64(ranks.astype(np.uint64)).view(np.int64))


def skewed_step(rows: int, rng: np.random.Generator) -> torch.Tensor:
    """One step's keys: 90% from the hot 10% of the rows, 10% uniform."""
    hot = int(0.9 * LOOKUPS)
    ranks = np.concatenate(
        [rng.integers(0, max(rows // 10, 1), hot), rng.integers(0, rows, LOOKUPS - hot)]
    )
    rng.shuffle(ranks)
    return keys_of(ranks)


def disk_read_bytes() -> int:
    """Bytes this process has read from storage (/proc/self/io read_bytes: not the page
    cache's)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def drop_file_cache(path: Path) -> None:
    """Writes the file's dirty pages and drops its pages from the page cache (later reads go
    to the disk)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def checkpoint_round_trip(store: EmbeddingStore, rows: int, cache_mb: float, path: str) -> dict:
    """Saves the table, closes ``store`` (one table in memory at a time), loads the save into
    a fresh ssd-tier store and checks a sample of 100,000 rows bit identical; seconds, GB/s
    and the peak RssAnon/RssFile rise (GiB) of the save and of the load."""
    out: dict = {}
    options = list(store.tables.values())
    ck = Path(path) / "checkpoint"
    sample = keys_of(np.random.default_rng(3).integers(0, rows, 100_000))
    for what in ("save", "load"):
        if what == "load":
            want = store.inspect("t", sample)
            store.close()
            kw = {"persistent_path": str(Path(path) / "loaded"), "cache_budget_mb": cache_mb}
            store = EmbeddingStore(options, tier="ssd", capacity=rows, **kw)
        base = memory_kib()
        mem = PeakMemory(every=0.02)
        t = time.perf_counter()
        if what == "save":
            store.save(str(ck), "checkpoint")
        else:
            store.load(str(ck))
        seconds = time.perf_counter() - t
        peak = mem.stop()
        size = sum(f.stat().st_size for f in ck.iterdir())
        out[what] = {
            "seconds": seconds,
            "GB_s": size / seconds / 1e9,
            "bytes": size,
            "rss_anon_rise_gib": peak["RssAnon"] - base["RssAnon"] / 2**20,
            "rss_file_rise_gib": peak["RssFile"] - base["RssFile"] / 2**20,
            # a load's rise includes the fresh table's own index filling up: its peak beside
            # the steps' peak (the table at work) says what the load needs beyond the table
            "rss_anon_peak_gib": peak["RssAnon"],
        }
    got = store.inspect("t", sample)
    out["sample_identical"] = all(torch.equal(want[k], got[k]) for k in want)
    store.close()
    shutil.rmtree(ck)
    return out


def serve_tier(
    conn: Connection,
    tier: str,
    rows: int,
    cache_mb: float,
    steps: int,
    path: str,
    cold: bool = False,
    checkpoint: bool = False,
    dtype: str = "fp32",
) -> None:
    """One tier in this (fresh) process: creates the table (creation rows/s), warms it, then
    runs one step of the stream per "step" message (its seconds back) until "done" (its
    figures back). The parent alternates the tiers' steps, so both see the same load.
    ``cold``: the ssd file's pages dropped from the page cache before the timed steps;
    ``checkpoint``: a save and load round trip after them (ssd)."""
    mem = PeakMemory()
    kw = {}
    if tier == "ssd":
        kw = {"persistent_path": path, "cache_budget_mb": cache_mb, "capacity": rows}
    store = EmbeddingStore([table(dtype)], tier=tier, **kw)
    chunk = 1 << 20
    t = time.perf_counter()
    for a in range(0, rows, chunk):
        store.pull("t", keys_of(np.arange(a, min(a + chunk, rows))))
    create = rows / (time.perf_counter() - t)
    rng = np.random.default_rng(7)
    batches = [skewed_step(rows, rng) for _ in range(steps + 5)]
    grads = torch.full((LOOKUPS, DIM), 1e-3)
    # warm-up, as a long run would have it: the hot set read once (into the ssd tier's
    # cache), then a few steps of the stream
    hot = max(rows // 10, 1)
    for a in range(0, hot, chunk // 4):
        store.pull("t", keys_of(np.arange(a, min(a + chunk // 4, hot))))
    for b in batches[steps:]:
        store.pull("t", b)
        store.push("t", b, grads)
    if cold and tier == "ssd":
        store.tier("t").file.sync()
        drop_file_cache(store.tier("t").path)
    s0 = store.stats()["tables"]["t"]
    io0 = disk_read_bytes()
    conn.send("ready")
    times = []
    while (msg := conn.recv()) != "done":
        b = batches[int(msg)]
        t = time.perf_counter()
        store.pull("t", b)
        store.push("t", b, grads)
        times.append(time.perf_counter() - t)
        conn.send(times[-1])
    s1 = store.stats()["tables"]["t"]
    io1 = disk_read_bytes()
    ck = None
    if checkpoint and tier == "ssd":
        ck = checkpoint_round_trip(store, rows, cache_mb, path)  # closes the store
    else:
        store.close()
    out = {
        "tier": tier,
        "rows": rows,
        "create_rows_s": create,
        "keys_s": LOOKUPS / float(np.median(times)),
        "keys_s_mean": LOOKUPS * len(times) / float(np.sum(times)),
        **mem.stop(),
    }
    if tier == "ssd":
        hits = s1["cache_hits"] - s0["cache_hits"]
        misses = s1["cache_misses"] - s0["cache_misses"]
        out["hit_rate"] = hits / max(hits + misses, 1)
        for k in ("cache_evictions", "cache_disk_read_bytes", "cache_disk_written_bytes"):
            out[k + "_per_step"] = (s1.get(k, 0) - s0.get(k, 0)) / len(times)
        out["device_read_bytes_per_step"] = (io1 - io0) / len(times)
        if ck is not None:
            out["checkpoint"] = ck
    conn.send(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=lambda s: int(s.replace("_", "")), default=10_000_000)
    p.add_argument(
        "--cache-share",
        type=float,
        default=0.125,
        help="the ssd cache budget as a share of the table's row bytes",
    )
    p.add_argument(
        "--cache-mb",
        type=float,
        default=None,
        help="the ssd cache budget, MiB (over --cache-share)",
    )
    p.add_argument(
        "--cold", action="store_true", help="drop the ssd file from the page cache before the steps"
    )
    p.add_argument(
        "--checkpoint",
        action="store_true",
        help="after the steps: save the ssd table, load it into a fresh ssd store, compare",
    )
    p.add_argument(
        "--dtype",
        choices=("fp32", "fp16", "bf16"),
        default="fp32",
        help="the table's row dtype; the cache budget stays that of fp32 rows (--cache-share)",
    )
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tiers", default="host,ssd")
    p.add_argument("--dir", default=None, help="directory of the ssd file (default: a temp)")
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args(argv)
    cache_mb = args.cache_mb or args.rows * ROW_BYTES * args.cache_share / 2**20
    spawn = multiprocessing.get_context("spawn")
    results = {}
    tiers = args.tiers.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-ssd-", dir=args.dir) as tmp:
        conns, procs = [], []
        for tier in tiers:  # one after the other: each creates its table alone
            here, there = spawn.Pipe()
            proc = spawn.Process(
                target=serve_tier,
                args=(
                    there,
                    tier,
                    args.rows,
                    cache_mb,
                    args.steps,
                    tmp,
                    args.cold,
                    args.checkpoint,
                    args.dtype,
                ),
            )
            proc.start()
            while not here.poll(1.0):  # a process that died says nothing
                if not proc.is_alive():
                    raise RuntimeError(f"tier {tier} exited with code {proc.exitcode}")
            if here.recv() != "ready":
                raise RuntimeError(f"tier {tier} did not start")
            conns.append(here)
            procs.append(proc)
        ratios = []
        for i in range(args.steps):  # alternating: both tiers under the same load
            took = []
            for c in conns:
                c.send(i)
                took.append(c.recv())
            ratios.append(took[0] / took[-1])
        for tier, c, proc in zip(tiers, conns, procs, strict=True):
            c.send("done")
            results[tier] = c.recv()
            proc.join()
            print(json.dumps(results[tier]), flush=True)
        if len(tiers) == 2:  # the second tier's speed over the first's, step by step
            results[tiers[1]]["ratio_median"] = float(np.median(ratios))
    print(
        f"{args.rows:,} rows dim {DIM} adagrad {args.dtype}, {LOOKUPS:,} lookups/step, ssd cache "
        f"{cache_mb:,.0f} MiB"
        + ("" if args.cache_mb else f" ({args.cache_share:g} of the fp32 rows)")
    )
    for tier, r in results.items():
        line = (
            f"  {tier}: pull+push {r['keys_s'] / 1e6:.2f}M keys/s, create "
            f"{r['create_rows_s'] / 1e6:.2f}M rows/s, peak RssAnon {r['RssAnon']:.2f} GiB, "
            f"RssFile {r['RssFile']:.2f} GiB"
        )
        if tier == "ssd":
            line += (
                f", hit rate {r['hit_rate']:.3f}, evictions/step "
                f"{r['cache_evictions_per_step']:,.0f}, disk read/step "
                f"{r['cache_disk_read_bytes_per_step'] / 2**20:.1f} MiB, written/step "
                f"{r['cache_disk_written_bytes_per_step'] / 2**20:.1f} MiB"
            )
            line += f", device read/step {r['device_read_bytes_per_step'] / 2**20:.1f} MiB"
            if "ratio_median" in r:
                line += f", {r['ratio_median']:.2f}x host (median of the steps' ratios)"
        print(line)
        for what, c in r.get("checkpoint", {}).items():
            if isinstance(c, dict):
                print(
                    f"  ssd checkpoint {what}: {c['seconds']:.1f} s, {c['GB_s']:.2f} GB/s "
                    f"({c['bytes'] / 1e9:.2f} GB), peak RssAnon {c['rss_anon_peak_gib']:.2f} GiB, "
                    f"peak rise RssAnon {c['rss_anon_rise_gib']:.2f} "
                    f"GiB, RssFile {c['rss_file_rise_gib']:.2f} GiB"
                )
        if "checkpoint" in r:
            print(f"  ssd checkpoint sample bit-identical: {r['checkpoint']['sample_identical']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
