"""Trainer benchmark: StreamRec end to end against the reference DLRM step, and quality.

Throughput, for each setup (a: the reference DLRM's CPU table, b: Criteo-Kaggle-like,
multihot: b with 10 ids a lookup, read by StreamRec from Parquet list columns through a
data.schema, the reference with ``--num-indices-per-lookup 10``)::

    baseline     the reference's DLRM step (facebookresearch/dlrm ``DLRM_Net``: nn.EmbeddingBag
                 sparse=True + SGD, the same MLPs, dot interaction) as reproduced by
                 bench/reference_dlrm.py, in a process of its own with the reference's
                 defaults (none of StreamRec's process settings: OMP_WAIT_POLICY and
                 STREAMREC_* are taken out of its environment); batches built before timing
                 starts, only the step is timed
    in-process   StreamRec end to end: Criteo TSV files in the streaming layout read from disk,
                 parsed, pulled/pushed through the in-process embedding store, trained
    service      the same through embedding-store shard processes (ZeroMQ on 127.0.0.1)

Each StreamRec figure is printed as a ratio to the baseline measured in the same run. With
``--device cuda`` both run on the GPU: the reference with its model, tables and batches there
(its ``--use-gpu``, fp32), StreamRec with its dense model there (``runner.device: cuda``,
``auto`` precision: bf16) and its store in-process on the host; the service run is left out
unless ``--service-shards`` asks for it (its shards are CPU processes either way).

Quality (--quality, bench/trainer_quality.py): the planted stream (streamrec-datagen) over
several days, trained online (predict, then train, each pass) by StreamRec and by the baseline
model on the same batches (keys hashed into nn.EmbeddingBag tables); prints the last day's
predict AUC of both next to the best possible AUC.

    .venv/bin/python bench/trainer.py                      # reduced size (a shared machine)
    .venv/bin/python bench/trainer.py --full --quality     # the full-size run, alone
    python3 bench/trainer.py --device cuda --setup b --full  # on a GPU (tools/gpu_check.sh)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

# bench/ is the script's directory, first on sys.path: the baseline shares its setups
from reference_dlrm import LR, SETUPS, require_cuda
from streamrec import layout
from streamrec.control.trainer_config import TrainerConfig
from streamrec.datagen.text_lines import to_criteo_text
from streamrec.trainer.runner import OnlineTrainer
from streamrec.trainer.store_tables import build_table_options
from trainer_quality import QualityKnobs, quality

DAY = "20190720"


def make_data(setup: dict, samples: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Uniform ids (the reference generator with one index per lookup), Criteo-like ints."""
    rng = np.random.default_rng(seed)
    k = setup.get("lookups", 1)
    keys = np.stack(
        [np.round(rng.random(samples * k) * (n - 1)).astype(np.int64) for n in setup["ln_emb"]],
        axis=1,
    )
    if k > 1:  # (samples, S, k): k ids of each table a sample
        keys = keys.reshape(samples, k, -1).transpose(0, 2, 1)
    ints = np.floor(np.expm1(rng.gamma(1.5, 1.2, (samples, 13)))).astype(np.int64)
    return {"keys": keys, "ints": ints, "label": rng.integers(0, 2, samples)}


def write_pass(root: Path, data: dict[str, np.ndarray], files: int) -> None:
    """Criteo TSV files, or Parquet with list columns ``C1..`` for keys (samples, S, k)."""
    split = root / DAY / "0000"
    split.mkdir(parents=True)
    bounds = np.linspace(0, len(data["label"]), files + 1).astype(int)
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        part = split / f"part-{i:05d}"
        if data["keys"].ndim == 3:
            write_parquet(part, data["label"][a:b], data["ints"][a:b], data["keys"][a:b])
        else:
            part.write_bytes(
                to_criteo_text(data["label"][a:b], data["ints"][a:b], data["keys"][a:b])
            )
    (split / "to.hadoop.done").touch()


def write_parquet(path: Path, label: np.ndarray, ints: np.ndarray, keys: np.ndarray) -> None:
    """label, I1..I13, C1..CS as list<int64> of k ids each (keys: (n, S, k) int64)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n, s, k = keys.shape
    cols: dict[str, pa.Array] = {"label": pa.array(label)}
    cols |= {f"I{j + 1}": pa.array(ints[:, j].astype(np.float64)) for j in range(ints.shape[1])}
    offsets = pa.array(np.arange(0, n * k + 1, k, dtype=np.int32))
    for t in range(s):
        cols[f"C{t + 1}"] = pa.ListArray.from_arrays(offsets, pa.array(keys[:, t].reshape(-1)))
    pq.write_table(pa.table(cols), path, row_group_size=65536)


def schema_of(setup: dict) -> dict:
    """The data.schema of a setup's Parquet (log1p on the ints, as the Criteo parser)."""
    return {
        "label": "label",
        "dense": [{"name": f"I{j + 1}", "log1p": True} for j in range(setup["bot"][0])],
        "sparse": [{"name": f"C{t + 1}"} for t in range(len(setup["ln_emb"]))],
    }


def streamrec_config(
    setup: dict,
    data_root: Path,
    model_root: Path,
    addresses: list[str],
    precision: str = "auto",
    device: str = "cpu",
    store_tier: str = "host",
) -> TrainerConfig:
    multi = setup.get("lookups", 1) > 1
    return TrainerConfig.parse(
        {
            "runner": {
                "train_data_dir": str(data_root),
                "model_save_path": str(model_root),
                "data_format": "parquet" if multi else "criteo",
                "schema": schema_of(setup) if multi else None,
                "split_interval": 1440,
                "split_per_pass": 1,
                "start_day": DAY,
                "end_day": DAY,
                "checkpoint_per_pass": 0,
                "save_base_at_day_end": False,
                "predict_before_train": False,
                "train_batch_size": setup["batch"],
                "device": device,
            },
            "hyper_parameters": {
                "sparse_inputs_slots": len(setup["ln_emb"]),
                "arch_sparse_feature_size": setup["bot"][-1],
                "arch_mlp_bot": setup["bot"],
                "arch_mlp_top": setup["top"],
                "optimizer": "sgd",
                "learning_rate": LR,
                "precision": precision,
            },
            "table_parameters": {
                "initializer": {"type": "uniform", "low": -0.01, "high": 0.01},
                "embed_sgd_param": {"name": "naive", "learning_rate": LR},
                "embedx_sgd_param": {"name": "naive", "learning_rate": LR},
            },
            "store": {"endpoints": addresses, "tier": store_tier},
            # the rank times its first steps on 2 threads and on 1 and keeps the faster
            "resources": {"threads_per_rank": "auto"},
        }
    )


def streamrec_rate(config: TrainerConfig) -> dict:
    """Training samples/s over the pass's files, end to end: ``rate`` of the second pass,
    ``first`` of the first (which includes the thread count's trial), and the ``threads``
    the rank kept."""
    spec = next(layout.iter_passes(DAY, DAY, 1440, 1))
    with OnlineTrainer(config) as t:
        first = t.run_pass(spec)
        second = t.run_pass(spec)
    return {
        "rate": second["samples_per_second"],
        "first": first["samples_per_second"],
        "threads": second["intra_op_threads"],
        "precision": second["precision"],
    }


def measure(
    kind: str,
    name: str,
    samples: int,
    root: Path,
    shards: int,
    precision: str = "auto",
    device: str = "cpu",
    store_tier: str = "host",
) -> dict:
    """One figure in the current process (the parent runs each in a fresh process)."""
    setup = SETUPS[name]
    model = root / f"model-{kind}-{precision}"
    cfg = streamrec_config(setup, root / "data", model, [], precision, device, store_tier)
    if kind == "inproc":
        return streamrec_rate(cfg)
    from streamrec.embedding_store import LocalShards

    tables = root / "tables.json"
    tables.write_text(
        json.dumps({"tables": [t.model_dump(mode="json") for t in build_table_options(cfg)]})
    )
    with LocalShards(tables, shards) as local:
        remote = streamrec_config(setup, root / "data", model, local.endpoints, precision, device)
        return streamrec_rate(remote)


def run_measure(
    kind: str,
    name: str,
    samples: int,
    root: Path,
    shards: int,
    precision: str = "auto",
    device: str = "cpu",
    store_tier: str = "host",
) -> dict:
    """Runs :func:`measure` in a fresh interpreter. In-process, the trainer owns the machine's
    cores, as a rank in its pod (``OMP_WAIT_POLICY=ACTIVE`` in the trainer images): its OpenMP
    threads run the step's gemms and spin between them, as the reference's do. Through the
    service the shards share the same 2 cores, so everything keeps StreamRec's default
    (PASSIVE, services/common/__init__.py), as on a node the trainer shares. On cuda too: no
    gemm runs on the host's threads there, and the threads that do run (parse, pull, push,
    the gather) would each bring a team of spinning OpenMP threads."""
    env = dict(os.environ)
    # set, not setdefault: `import streamrec` put PASSIVE in this process's environment
    active = kind == "inproc" and device == "cpu"
    env["OMP_WAIT_POLICY"] = "ACTIVE" if active else "PASSIVE"
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--measure",
            kind,
            "--setup",
            name,
            "--samples",
            str(samples),
            "--root",
            str(root),
            "--service-shards",
            str(shards),
            "--precision",
            precision,
            "--device",
            device,
            "--store-tier",
            store_tier,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{kind} measurement failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def reference_env() -> dict[str, str]:
    """This environment without the process settings StreamRec makes (OMP_WAIT_POLICY, set by
    ``import streamrec``; STREAMREC_*): the reference runs with its own defaults."""
    return {
        k: v
        for k, v in os.environ.items()
        if k != "OMP_WAIT_POLICY" and not k.startswith("STREAMREC_")
    }


def run_baseline(name: str, steps: int, device: str = "cpu") -> dict:
    """The reference step's samples/s (bench/reference_dlrm.py) in a process of its own."""
    out = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("reference_dlrm.py")),
            "--setup",
            name,
            "--steps",
            str(steps),
            "--json",
            "--device",
            device,
        ],
        env=reference_env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if out.returncode != 0:
        raise RuntimeError(f"baseline measurement failed:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return {"rate": res["samples_per_s"], **res}


def throughput(
    name: str,
    samples: int,
    files: int,
    service_shards: int,
    precisions: list[str],
    device: str = "cpu",
    store_tier: str = "host",
) -> dict:
    """The reference step, then StreamRec in-process at each of ``precisions`` and through
    the service at the first, on ``device``."""
    setup = SETUPS[name]
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        root = Path(tmp)
        write_pass(root / "data", make_data(setup, samples), files)

        def note(key: str, res: dict) -> None:
            out[key] = res
            if device == "cuda":  # each figure as it comes (a lent GPU's time may run out)
                print(f"measured {key}: {json.dumps(res)}", file=sys.stderr, flush=True)

        note("baseline", run_baseline(name, samples // setup["batch"], device))
        for p in precisions:
            note(
                f"inproc/{p}",
                run_measure("inproc", name, samples, root, service_shards, p, device, store_tier),
            )
        if service_shards:
            res = run_measure("service", name, samples, root, service_shards, precisions[0], device)
            note("service", res)
    b = out["baseline"]["rate"]
    print(
        f"setup {name}: {len(setup['ln_emb'])} tables {setup['ln_emb'][0]}.. rows, dim "
        f"{setup['bot'][-1]}, bottom {'-'.join(map(str, setup['bot']))}, top "
        f"{'-'.join(map(str, setup['top']))}, batch {setup['batch']}, {samples} samples"
        + (f", {setup['lookups']} ids a lookup (Parquet lists)" if "lookups" in setup else "")
    )
    base = out["baseline"]
    if device == "cuda":
        print(
            f"  on {base['device']}: the reference's model, tables and batches; StreamRec's "
            f"dense model (its store in-process, tier {store_tier}: rows on the "
            f"{'GPU' if store_tier == 'device' else 'host'}, OMP_WAIT_POLICY PASSIVE)"
            + ("" if service_shards else "; store service left out (--service-shards N)")
        )
    print(
        f"  reference step alone         {b:10.0f} samples/s  ({base['steps']} steps, "
        f"{base['threads']} threads, OMP_WAIT_POLICY {base['omp_wait_policy'] or 'unset'}, "
        f"{base['loss']} loss, own process: bench/reference_dlrm.py)"
    )
    labels = [(f"inproc/{p}", f"in-process {p}") for p in precisions]
    for key, label in [*labels, ("service", "store service")]:
        if key in out:
            r = out[key]
            print(
                f"  StreamRec e2e, {label:16s}{r['rate']:10.0f} samples/s  "
                f"ratio {r['rate'] / b:.2f}  ({r['precision']}, {r['threads']} thread(s); "
                f"first pass "
                f"{r['first']:.0f}, "
                f"ratio {r['first'] / b:.2f})"
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setup", choices=[*SETUPS, "all", "none"], default="all")
    ap.add_argument("--full", action="store_true", help="full size (run alone)")
    ap.add_argument("--samples", type=int, default=None, help="samples per throughput pass")
    ap.add_argument(
        "--service-shards", type=int, default=None, help="0 skips the service run (cpu: 1, cuda: 0)"
    )
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where both train")
    ap.add_argument(
        "--store-tier",
        choices=["host", "device"],
        default="host",
        help="the in-process store's tier (device: its rows on the GPU, the CUDA library)",
    )
    ap.add_argument("--quality", action="store_true")
    ap.add_argument(
        "--precision",
        nargs="+",
        choices=["auto", "fp32", "bf16"],
        default=["auto", "fp32"],
        help="model.precision of the in-process runs (the service run takes the first)",
    )
    ap.add_argument("--measure", choices=["inproc", "service"], help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--quality-days", type=int, default=None)
    ap.add_argument("--quality-samples", type=int, default=None, help="samples per split")
    knobs = QualityKnobs()
    unset = "(quality; unset: the trainer's default)"
    ap.add_argument("--dense-optimizer", choices=["sgd", "adagrad", "adam"], help=unset)
    ap.add_argument("--dense-lr", type=float, help=unset)
    ap.add_argument("--sparse-rule", help=f"the store's rule {unset}")
    ap.add_argument("--sparse-lr", type=float, help=unset)
    ap.add_argument("--initial-g2sum", type=float, help=f"the store rule's {unset}")
    ap.add_argument("--init-range", type=float, help=f"rows start uniform in +-this {unset}")
    ap.add_argument("--embedx-threshold", type=float, help=unset)
    ap.add_argument("--delete-threshold", type=float, help=unset)
    ap.add_argument("--no-pipeline", action="store_true", help="pull after the last push")
    ap.add_argument("--vocab", type=int, default=knobs.vocab, help="ids per slot and day")
    ap.add_argument("--seed", type=int, help="stream and init seed (quality; unset: fixed)")
    ap.add_argument("--baseline-dense-lr", type=float, default=knobs.baseline_dense_lr)
    ap.add_argument("--baseline-sparse-lr", type=float, default=knobs.baseline_sparse_lr)
    args = ap.parse_args()
    if args.device == "cuda":
        require_cuda("bench/trainer.py")
        if args.quality:
            ap.error("--quality trains on the CPU: run it without --device cuda")
    shards = args.service_shards
    if shards is None:
        shards = 0 if args.device == "cuda" else 1
    torch.manual_seed(0)
    if args.measure:
        print(
            json.dumps(
                measure(
                    args.measure,
                    args.setup,
                    args.samples,
                    Path(args.root),
                    shards,
                    args.precision[0],
                    args.device,
                    args.store_tier,
                )
            )
        )
        return
    names = ["a", "b"] if args.setup == "all" else [] if args.setup == "none" else [args.setup]
    for name in names:
        samples = args.samples or (SETUPS[name]["batch"] * (400 if args.full else 60))
        throughput(name, samples, 4, shards, args.precision, args.device, args.store_tier)
    knobs = QualityKnobs(
        dense_optimizer=args.dense_optimizer,
        dense_lr=args.dense_lr,
        sparse_lr=args.sparse_lr,
        sparse_rule=args.sparse_rule,
        initial_g2sum=args.initial_g2sum,
        init_range=args.init_range,
        pipeline=not args.no_pipeline,
        vocab=args.vocab,
        seed=args.seed,
        baseline_dense_lr=args.baseline_dense_lr,
        baseline_sparse_lr=args.baseline_sparse_lr,
        embedx_threshold=args.embedx_threshold,
        delete_threshold=args.delete_threshold,
    )
    if args.quality:
        days = args.quality_days or (5 if args.full else 2)
        quality(
            days,
            args.quality_samples or (30000 if args.full else 8000),
            240,
            26 if args.full else 8,
            knobs,
        )


if __name__ == "__main__":
    main()
