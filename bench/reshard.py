"""Benchmark of resharding: a checkpoint of M shards loaded into N (``reshard.py``).

One table of ``--rows`` rows (dim 16, AdaGrad, every row trained once) is saved by M
in-process stores playing the shards; N fresh stores each load the keys of shard K of N
(``EmbeddingStore.load(path, shard=(K, N))``, the shard service's path), one after the other.
Prints per target shard the seconds, the MB of the save it read (every part, once to check,
once to import: twice the save's bytes) and MB/s of that, and the rise of the process's
resident memory over the load (the rows the shard ends with; the chunk it reads is freed).
Baseline: the same save loaded whole into one store (``load(path)``) in the same run.

    .venv/bin/python bench/reshard.py                    (1M rows, 2 -> 3)
    .venv/bin/python bench/reshard.py --rows 200000 --m 3 --n 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from streamrec.embedding_store import EmbeddingStore, TableOptions
from streamrec.keyhash import shard_of

TABLE = TableOptions(
    name="t",
    dim=16,
    embedx_threshold=0,
    embed_sgd_param={"name": "adagrad"},
    embedx_sgd_param={"name": "adagrad"},
)


def rss_mb() -> float:
    """Resident memory now (VmRSS), MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--m", type=int, default=2, help="shards that save")
    p.add_argument("--n", type=int, default=3, help="shards that load")
    a = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="reshard-bench-"))
    keys = np.random.default_rng(0).permutation(np.arange(a.rows, dtype=np.int64) * 7919 + 3)
    for j in range(a.m):
        mine = torch.from_numpy(keys[shard_of(keys, a.m) == j])
        with EmbeddingStore([TABLE]) as s:
            s.push("t", mine, torch.full((mine.numel(), 16), 0.01))
            s.save(str(root / f"shard-{j}-of-{a.m}"), "checkpoint", extra={"shard_id": j})
    saved_mb = sum(f.stat().st_size for f in root.rglob("*.npy")) / 2**20
    print(f"save: {a.rows} rows by {a.m} shard(s), {saved_mb:.1f} MB of .npy")
    rows = 0
    for k in range(a.n):
        with EmbeddingStore([TABLE]) as s:
            before, started = rss_mb(), time.perf_counter()
            out = s.load(str(root), shard=(k, a.n))
            took = time.perf_counter() - started
            mb = 2 * out["bytes_read"] / 2**20
            rows += s.size("t")
            print(
                f"shard {k} of {a.n} ({out['resharded']}): {s.size('t')} rows in {took:.2f} s, "
                f"read {mb:.1f} MB = {mb / took:.0f} MB/s; "
                f"RSS +{rss_mb() - before:.0f} MB (the shard's rows and index)"
            )
    assert rows == a.rows, (rows, a.rows)
    with EmbeddingStore([TABLE]) as s:
        started = time.perf_counter()
        s.load(str(root))
        took = time.perf_counter() - started
        print(f"baseline: the whole save into one store: {took:.2f} s, {saved_mb / took:.0f} MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
