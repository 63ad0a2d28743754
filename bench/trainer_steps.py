"""Where a training step's time goes: each phase of StreamRec's step alone, per batch.

For setup a and b of bench/trainer.py, on the trainer's own objects (an ``OnlineTrainer`` with
the in-process store, batches of Criteo text parsed by the trainer's parser):

    parse       text -> Batch (the prefetch thread), CPU ms per batch
    prepare     the fused per-table key dedup (the prefetch thread)
    pull        one pull_many of every table (the sparse worker thread)
    push        one push_many of every table's gradients, shows and clicks (the sparse worker)
    step        forward, backward and the dense optimizer step (the main thread), with 1
                thread and with torch's default threads
    end to end  a training pass's seconds per batch (bench/trainer.py's in-process run: files
                read from disk, all of the above overlapped on their threads)

``overlap cost`` = end to end - step (default threads): what the other threads' work and the
hand-offs cost the main thread. The reference step (bench/reference_dlrm.py, its own process
and defaults) is measured in the same run. Parse, prepare, pull and push run with 1 thread.

    .venv/bin/python bench/trainer_steps.py [--setup a|b|all] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# the in-process trainer owns its cores (as bench/trainer.py's in-process run and the trainer
# images): set before torch loads libgomp
os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")

import torch  # noqa: E402

# bench/ is the script's directory, first on sys.path
from reference_dlrm import SETUPS  # noqa: E402
from streamrec.datagen.text_lines import to_criteo_text
from streamrec.trainer.data.reader import parse_chunk
from streamrec.trainer.runner import OnlineTrainer
from trainer import make_data, run_baseline, run_measure, streamrec_config, write_pass

BATCHES = 40


def best_ms(fn: Callable[[], object], reps: int) -> float:
    """The fastest of ``reps`` runs of ``fn`` (which does BATCHES batches), ms per batch."""
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times) / BATCHES * 1e3


def phases(name: str, reps: int, threads: int) -> dict[str, float]:
    """ms per batch of each phase alone (see the module doc)."""
    setup = SETUPS[name]
    size = setup["batch"]
    data = make_data(setup, size * BATCHES)
    text = to_criteo_text(data["label"], data["ints"], data["keys"])
    slots = len(setup["ln_emb"])
    out: dict[str, float] = {}
    torch.set_num_threads(1)
    out["parse"] = best_ms(lambda: parse_chunk(text, "criteo", slots), reps)
    batch, _ = parse_chunk(text, "criteo", slots)
    batches = [batch.slice(i * size, (i + 1) * size) for i in range(BATCHES)]
    with tempfile.TemporaryDirectory(prefix="bench-steps-") as tmp:
        config = streamrec_config(setup, Path(tmp), Path(tmp) / "model", [])
        with OnlineTrainer(config) as t:
            out["prepare"] = best_ms(lambda: [t.sparse.prepare(b) for b in batches], reps)
            prepared = [t.sparse.prepare(b) for b in batches]
            out["pull"] = best_ms(lambda: [t.sparse.pull(sb, True) for sb in prepared], reps)

            def step() -> None:
                for b, sb in zip(batches, prepared, strict=True):
                    t.optimizer.zero_grad(set_to_none=True)
                    z = t._logits(b, sb)
                    t.loss_fn(z.view(-1, 1), b.labels.view(-1, 1)).backward()
                    t.optimizer.step()

            def push() -> None:
                for b, sb in zip(batches, prepared, strict=True):
                    sb.weights.grad = torch.full_like(sb.weights, 1e-4)
                    t._push(sb, b.labels)

            out["step, 1 thread"] = best_ms(step, reps)
            torch.set_num_threads(threads)
            out[f"step, {threads} threads"] = best_ms(step, reps)
            torch.set_num_threads(1)
            out["push"] = best_ms(push, reps)
    torch.set_num_threads(threads)
    return out


def end_to_end_ms(name: str, reps: int) -> float:
    """The in-process run's ms per batch (second pass), median of ``reps`` runs."""
    setup = SETUPS[name]
    samples = setup["batch"] * (400 if name == "a" else 200)
    rates = []
    for _ in range(reps):
        with tempfile.TemporaryDirectory(prefix="bench-steps-e2e-") as tmp:
            root = Path(tmp)
            write_pass(root / "data", make_data(setup, samples), 4)
            rates.append(run_measure("inproc", name, samples, root, 0)["rate"])
    return setup["batch"] / statistics.median(rates) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setup", choices=["a", "b", "all"], default="all")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    threads = torch.get_num_threads()
    names = ["a", "b"] if args.setup == "all" else [args.setup]
    # the runs in processes of their own first: once this process has run a parallel op, its
    # OpenMP thread spins (ACTIVE) and would take a core from them
    e2e = {name: end_to_end_ms(name, args.reps) for name in names}
    ref = {
        name: SETUPS[name]["batch"] / run_baseline(name, 400 if name == "a" else 200)["rate"] * 1e3
        for name in names
    }
    for name in names:
        setup = SETUPS[name]
        ms = phases(name, args.reps, threads)
        step = ms[f"step, {threads} threads"]
        print(f"setup {name}: batch {setup['batch']}, {len(setup['ln_emb'])} tables, ms per batch")
        for phase, value in ms.items():
            print(f"  {phase:18s}{value:8.2f}")
        side = ms["parse"] + ms["prepare"] + ms["pull"] + ms["push"]
        print(f"  {'other threads, CPU':18s}{side:8.2f}  (parse + prepare + pull + push)")
        print(f"  {'end to end':18s}{e2e[name]:8.2f}  (median of {args.reps} in-process passes)")
        cost = e2e[name] - step
        print(f"  {'overlap cost':18s}{cost:8.2f}  (end to end - step, {threads} threads)")
        print(
            f"  {'reference step':18s}{ref[name]:8.2f}  (bench/reference_dlrm.py, its defaults); "
            f"step {ref[name] / step:.2f}x, end to end {ref[name] / e2e[name]:.2f}x"
        )


if __name__ == "__main__":
    main()
