"""Host pipeline benchmark: a batch's parse, key dedup and staging, no model, no store.

What a trainer rank does on the host for every batch around a GPU step, by itself, on
setup b of bench/trainer.py (Criteo TSV files in the streaming layout, 26 tables, batch
2,048)::

    read + parse   iter_batches: files from disk, the compiled parser     reader thread
    prepare        SparseTables.prepare: the fused per-table key dedup     prefetch worker(s)
    stage          the sparse forward's gather of the pooled rows (B, S, d) from stand-in
                   pulled rows (no store), then the rows and the dense features through the
                   trainer's Staging (its buffers, then a host copy where a GPU takes the H2D)
                                                                            consumer thread

Two pipelines, measured in the same run, alternating rep by rep:

    today   the Prefetcher with one thread (read, parse and prepare on it), staging
            single-buffered: the trainer before its prefetch pool
    pool N  the reader plus N prepare workers (``Prefetcher(workers=N)``, as a GPU rank's
            ``prefetch_workers``), staging double-buffered

Each prints samples/s on the wall clock and samples per CPU-second (the process's CPU time
over every thread: the rate one core sustains, "per core"), medians of ``--reps``; then each
stage alone on one thread, ms per batch. The figures are the host's: a GPU step (the
reference's on an H200: 6.5 ms a batch, BENCHMARKS.md) runs beside them, not counted.

    .venv/bin/python bench/host_pipeline.py                       # pools of 2 and 4
    .venv/bin/python bench/host_pipeline.py --workers 1 2 4 --reps 7 --samples 409600
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

# bench/ is the script's directory, first on sys.path: the trainer bench's data
from reference_dlrm import SETUPS
from streamrec import layout
from streamrec.sampler import Prefetcher
from streamrec.trainer.data.batches import Batch, ParseStats
from streamrec.trainer.data.reader import iter_batches
from streamrec.trainer.model.staging import Staging
from streamrec.trainer.sparse import SparseBatch, SparseTables
from streamrec.trainer.sparse_worker import host_cores, prefetch_workers
from trainer import DAY, make_data, write_pass

CPU = torch.device("cpu")


class _NoStore:
    """What SparseTables asks of a store before a pull: nothing is pulled here."""

    def resident_device(self) -> None:
        return None


class HostPipeline:
    """Setup b's batches from ``files``, prepared and staged as a trainer rank does.

    Args:
        files: the pass's Criteo files.
        setup: bench/reference_dlrm.py's setup (tables, dim, batch).
    """

    def __init__(self, files: list[Path], setup: dict) -> None:
        self.files = files
        self.slots = len(setup["ln_emb"])
        self.batch = setup["batch"]
        self.dim = setup["bot"][-1]
        names = [f"t{k}" for k in range(self.slots)]
        self.sparse = SparseTables(_NoStore(), names, self.dim)  # type: ignore[arg-type]
        # the pulled rows' stand-in: every batch's U distinct keys take its first U rows
        self.rows = torch.randn(self.slots * self.batch, self.dim)

    def batches(self) -> Iterator[Batch]:
        return iter_batches(self.files, "criteo", self.slots, self.batch, ParseStats())

    def prepare(self, batch: Batch) -> tuple[Batch, SparseBatch]:
        return batch, self.sparse.prepare(batch)

    def stage(self, staging: Staging, batch: Batch, sb: SparseBatch) -> None:
        sb.weights = self.rows[: sb.bounds[-1]]
        staging.rows(self.sparse.forward(sb))
        staging.to_device("dense", batch.dense)

    def run(self, workers: int | None, depth: int = 4) -> tuple[int, float, float]:
        """One pass over the files: (samples, wall seconds, CPU seconds of the process).
        ``workers`` None: today's pipeline (one thread, staging single-buffered)."""
        staging = Staging(CPU, stage=True, pin=False, slots=1 if workers is None else 2)
        samples = 0
        wall, cpu = time.perf_counter(), time.process_time()
        with torch.no_grad(), Prefetcher(self.batches(), self.prepare, depth, workers or 1) as p:
            for batch, sb in p:
                self.stage(staging, batch, sb)
                samples += len(batch)
        return samples, time.perf_counter() - wall, time.process_time() - cpu

    def stages_ms(self, reps: int) -> dict[str, float]:
        """Each stage alone on this thread, ms per batch (the best of ``reps``)."""
        parsed = list(self.batches())
        prepared = [self.prepare(b) for b in parsed]
        staging = Staging(CPU, stage=True, pin=False, slots=2)
        stages: dict[str, Callable[[], object]] = {
            "read + parse": lambda: sum(1 for _ in self.batches()),
            "prepare (dedup)": lambda: [self.prepare(b) for b in parsed],
            "stage (gather, copies)": lambda: [self.stage(staging, b, sb) for b, sb in prepared],
        }
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            out = self._time(stages, reps, len(parsed))
        finally:
            torch.set_num_threads(threads)
        return out

    @staticmethod
    def _time(stages: dict[str, Callable[[], object]], reps: int, n: int) -> dict[str, float]:
        out = {}
        with torch.no_grad():
            for name, fn in stages.items():
                times = []
                for _ in range(reps):
                    started = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - started)
                out[name] = min(times) / n * 1e3
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=2048 * 200, help="samples in the pass")
    ap.add_argument("--files", type=int, default=4, help="files the pass is written in")
    ap.add_argument("--reps", type=int, default=5, help="runs of each pipeline (medians)")
    ap.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[2, 4],
        help="pool sizes measured beside today's (a GPU rank here would take "
        f"{prefetch_workers('cuda')})",
    )
    args = ap.parse_args()
    setup = SETUPS["b"]
    with tempfile.TemporaryDirectory(prefix="bench-host-") as tmp:
        root = Path(tmp)
        write_pass(root / "data", make_data(setup, args.samples), args.files)
        spec = next(layout.iter_passes(DAY, DAY, 1440, 1))
        files = layout.pass_files(root / "data", spec, "to.hadoop.done")
        mb = sum(f.stat().st_size for f in files) / 1e6
        pipe = HostPipeline(files, setup)
        kinds: list[int | None] = [None, *args.workers]
        for kind in kinds:  # warm: the page cache, the buffers, the threads' first calls
            pipe.run(kind)
        runs: dict[int | None, list[tuple[int, float, float]]] = {k: [] for k in kinds}
        for rep in range(args.reps):  # each in turn, first in turn: the host's drift shared
            for kind in kinds[rep % len(kinds) :] + kinds[: rep % len(kinds)]:
                runs[kind].append(pipe.run(kind))
        stages = pipe.stages_ms(args.reps)
    print(
        f"setup b: {args.samples} samples in {args.files} Criteo files ({mb:.0f} MB read from "
        f"the page cache), batch {setup['batch']}, {len(setup['ln_emb'])} tables, dim "
        f"{setup['bot'][-1]}; {host_cores()} cores, torch {torch.get_num_threads()} threads; "
        f"medians of {args.reps}"
    )
    base_wall = base_core = 0.0
    for kind in kinds:
        n = runs[kind][0][0]
        walls = sorted(n / w for _, w, _ in runs[kind])
        wall = statistics.median(walls)
        core = statistics.median(n / c for _, _, c in runs[kind])
        cpus = statistics.median(c / w for _, w, c in runs[kind])
        if kind is None:
            base_wall, base_core = wall, core
            label, vs = "today (1 thread, 1 buffer)", ""
        else:
            label = f"pool {kind} (+ reader, 2 buffers)"
            vs = f"  wall {wall / base_wall:.2f}x, per core {core / base_core:.2f}x"
        print(
            f"  {label:32s}{wall:9.0f} samples/s ({walls[0]:.0f}-{walls[-1]:.0f})  "
            f"{core:9.0f} per core  ({cpus:.2f} cores busy){vs}"
        )
    print("  each stage alone, 1 thread, ms per batch:")
    for name, ms in stages.items():
        print(f"    {name:24s}{ms:8.3f}")


if __name__ == "__main__":
    main()
