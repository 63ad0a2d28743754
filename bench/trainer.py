"""Trainer benchmark: StreamRec end to end against a plain-PyTorch DLRM step, and quality.

Throughput, for each setup (a: the seed 004 CPU table, b: Criteo-Kaggle-like)::

    baseline     the reference DLRM step (nn.EmbeddingBag sparse=True + SGD, the same MLPs,
                 dot interaction) on batches built before timing starts: only the step is timed
    in-process   StreamRec end to end: Criteo TSV files in the streaming layout read from disk,
                 parsed, pulled/pushed through the in-process embedding store, trained
    service      the same through embedding-store shard processes (ZeroMQ on 127.0.0.1)

Each StreamRec figure is printed as a ratio to the baseline measured in the same run.

Quality (--quality): the planted stream (streamrec-datagen) over several days, trained online
(predict, then train, each pass) by StreamRec and by the baseline model on the same batches
(keys hashed into nn.EmbeddingBag tables); prints the last day's predict AUC of both next to
the best possible AUC.

    .venv/bin/python bench/trainer.py                      # reduced size (a shared machine)
    .venv/bin/python bench/trainer.py --full --quality     # the full-size run, alone
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from streamrec import layout
from streamrec.trainer.config import TrainerConfig
from streamrec.trainer.data import ParseStats, iter_batches
from streamrec.trainer.datagen import StreamParams, generate, to_criteo_text
from streamrec.trainer.evaluation import AucAccumulator
from streamrec.trainer.model import DLRM
from streamrec.trainer.runner import OnlineTrainer
from streamrec.trainer.store import build_table_options

SETUPS = {
    "a": {
        "ln_emb": [100] * 12 + [1000] * 3,
        "bot": [13, 512, 256, 64, 16],
        "top": [512, 256, 1],
        "batch": 128,
    },
    "b": {
        "ln_emb": [100_000] * 26,
        "bot": [13, 512, 256, 64, 16],
        "top": [512, 256, 1],
        "batch": 2048,
    },
}
LR = 0.01
DAY = "20190720"


def make_data(setup: dict, samples: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Uniform ids (the reference generator with one index per lookup), Criteo-like ints."""
    rng = np.random.default_rng(seed)
    keys = np.stack(
        [np.round(rng.random(samples) * (n - 1)).astype(np.int64) for n in setup["ln_emb"]], axis=1
    )
    ints = np.floor(np.expm1(rng.gamma(1.5, 1.2, (samples, 13)))).astype(np.int64)
    return {"keys": keys, "ints": ints, "label": rng.integers(0, 2, samples)}


def write_pass(root: Path, data: dict[str, np.ndarray], files: int) -> None:
    split = root / DAY / "0000"
    split.mkdir(parents=True)
    bounds = np.linspace(0, len(data["label"]), files + 1).astype(int)
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        (split / f"part-{i:05d}").write_bytes(
            to_criteo_text(data["label"][a:b], data["ints"][a:b], data["keys"][a:b])
        )
    (split / "to.hadoop.done").touch()


def baseline_step_rate(setup: dict, data: dict[str, np.ndarray], steps: int) -> float:
    """Samples/s of the reference training step alone, batches prepared beforehand."""
    bs = setup["batch"]
    model = DLRM(13, setup["ln_emb"], setup["bot"][-1], setup["bot"], setup["top"])
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = torch.nn.BCELoss()
    batches = []
    n_tables = len(setup["ln_emb"])
    for i in range(min(steps, len(data["label"]) // bs)):
        sl = slice(i * bs, (i + 1) * bs)
        dense = torch.log1p(torch.from_numpy(data["ints"][sl].astype(np.float32)))
        idx = [torch.from_numpy(np.ascontiguousarray(data["keys"][sl, j])) for j in range(n_tables)]
        offs = [torch.arange(bs, dtype=torch.int64)] * n_tables
        y = torch.from_numpy(data["label"][sl].astype(np.float32)).view(-1, 1)
        batches.append((dense, offs, idx, y))

    def step(b):
        opt.zero_grad()
        loss = loss_fn(model(b[0], b[1], b[2]), b[3])
        loss.backward()
        opt.step()

    for b in batches[:3]:
        step(b)
    started = time.perf_counter()
    for b in batches:
        step(b)
    return len(batches) * bs / (time.perf_counter() - started)


def streamrec_config(
    setup: dict, data_root: Path, model_root: Path, addresses: list[str]
) -> TrainerConfig:
    return TrainerConfig.parse(
        {
            "runner": {
                "train_data_dir": str(data_root),
                "model_save_path": str(model_root),
                "data_format": "criteo",
                "split_interval": 1440,
                "split_per_pass": 1,
                "start_day": DAY,
                "end_day": DAY,
                "checkpoint_per_pass": 0,
                "save_base_at_day_end": False,
                "predict_before_train": False,
                "train_batch_size": setup["batch"],
            },
            "hyper_parameters": {
                "sparse_inputs_slots": len(setup["ln_emb"]),
                "arch_sparse_feature_size": setup["bot"][-1],
                "arch_mlp_bot": setup["bot"],
                "arch_mlp_top": setup["top"],
                "optimizer": "sgd",
                "learning_rate": LR,
            },
            "table_parameters": {
                "initializer": {"type": "uniform", "low": -0.01, "high": 0.01},
                "embed_sgd_param": {"name": "naive", "learning_rate": LR},
                "embedx_sgd_param": {"name": "naive", "learning_rate": LR},
            },
            "store": {"endpoints": addresses},
        }
    )


def streamrec_rate(config: TrainerConfig) -> tuple[float, float]:
    """(first pass, second pass) training samples/s over the pass's files, end to end."""
    spec = next(layout.iter_passes(DAY, DAY, 1440, 1))
    with OnlineTrainer(config) as t:
        first = t.run_pass(spec)
        second = t.run_pass(spec)
    return first["samples_per_second"], second["samples_per_second"]


def measure(kind: str, name: str, samples: int, root: Path, shards: int) -> dict:
    """One figure in the current process (the parent runs each in a fresh process)."""
    setup = SETUPS[name]
    if kind == "baseline":
        data = make_data(setup, samples)
        return {"rate": baseline_step_rate(setup, data, samples // setup["batch"])}
    cfg = streamrec_config(setup, root / "data", root / f"model-{kind}", [])
    if kind == "inproc":
        first, second = streamrec_rate(cfg)
        return {"rate": second, "first": first}
    from streamrec.embedding_store import LocalShards

    tables = root / "tables.json"
    tables.write_text(
        json.dumps({"tables": [t.model_dump(mode="json") for t in build_table_options(cfg)]})
    )
    with LocalShards(tables, shards) as local:
        remote = streamrec_config(setup, root / "data", root / "model-service", local.endpoints)
        first, second = streamrec_rate(remote)
    return {"rate": second, "first": first}


def run_measure(kind: str, name: str, samples: int, root: Path, shards: int) -> dict:
    """Runs :func:`measure` in a fresh interpreter. Baseline and StreamRec get the same
    OpenMP setting (OMP_WAIT_POLICY=PASSIVE unless set, as every StreamRec process has, see
    services/common/__init__.py), so the comparison is like for like."""
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
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
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{kind} measurement failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def throughput(name: str, samples: int, files: int, service_shards: int) -> dict:
    setup = SETUPS[name]
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        root = Path(tmp)
        write_pass(root / "data", make_data(setup, samples), files)
        kinds = ["baseline", "inproc"] + (["service"] if service_shards else [])
        for kind in kinds:
            out[kind] = run_measure(kind, name, samples, root, service_shards)
    b = out["baseline"]["rate"]
    print(
        f"setup {name}: {len(setup['ln_emb'])} tables {setup['ln_emb'][0]}.. rows, dim "
        f"{setup['bot'][-1]}, bottom {'-'.join(map(str, setup['bot']))}, top "
        f"{'-'.join(map(str, setup['top']))}, batch {setup['batch']}, {samples} samples"
    )
    print(f"  baseline step alone          {b:10.0f} samples/s")
    for key, label in (("inproc", "in-process store"), ("service", "store service")):
        if key in out:
            r = out[key]
            print(
                f"  StreamRec e2e, {label:16s}{r['rate']:10.0f} samples/s  "
                f"ratio {r['rate'] / b:.2f}  (first pass {r['first']:.0f}, "
                f"ratio {r['first'] / b:.2f})"
            )
    return out


# -- quality ------------------------------------------------------------------------------
@dataclass
class QualityKnobs:
    """The quality run's training settings (CLI flags of the same names)."""

    dense_lr: float = 0.05
    sparse_lr: float = 0.05
    sparse_rule: str = "std_adagrad"
    initial_g2sum: float = 3.0
    init_range: float = 0.005
    pipeline: bool = True
    vocab: int = 300
    baseline_sparse_lr: float = 0.05
    #: None keeps the table defaults (PaddleRec's: embedx_threshold 10, delete_threshold 0.8)
    embedx_threshold: float | None = None
    delete_threshold: float | None = None


def quality(
    days: int, samples_per_split: int, split_interval: int, slots: int, k: QualityKnobs
) -> dict:
    params = StreamParams(slots=slots, vocab=k.vocab, drift=0.05)
    rule = {"name": k.sparse_rule, "learning_rate": k.sparse_lr, "initial_g2sum": k.initial_g2sum}
    with tempfile.TemporaryDirectory(prefix="bench-quality-") as tmp:
        root = Path(tmp)
        generate(root / "data", DAY, days, split_interval, samples_per_split, 2, params)
        end = layout.format_day(
            layout.parse_day(DAY) + __import__("datetime").timedelta(days=days - 1)
        )
        cfg = TrainerConfig.parse(
            {
                "runner": {
                    "train_data_dir": str(root / "data"),
                    "model_save_path": str(root / "model"),
                    "split_interval": split_interval,
                    "split_per_pass": 1,
                    "start_day": DAY,
                    "end_day": end,
                    "checkpoint_per_pass": 0,
                    "save_base_at_day_end": False,
                    "train_batch_size": 512,
                    "sparse_pipeline": k.pipeline,
                },
                "hyper_parameters": {
                    "sparse_inputs_slots": slots,
                    "arch_sparse_feature_size": 16,
                    "arch_mlp_bot": "13-64-16",
                    "arch_mlp_top": "64-1",
                    "optimizer": "adagrad",
                    "learning_rate": k.dense_lr,
                },
                "table_parameters": {
                    "initializer": {"type": "uniform", "low": -k.init_range, "high": k.init_range},
                    "embed_sgd_param": rule,
                    "embedx_sgd_param": rule,
                    **{
                        name: value
                        for name, value in (
                            ("embedx_threshold", k.embedx_threshold),
                            ("delete_threshold", k.delete_threshold),
                        )
                        if value is not None
                    },
                },
            }
        )
        recs = []
        with OnlineTrainer(cfg) as t:
            specs = t.passes_todo()
            for spec in specs:
                recs.append(t.run_pass(spec))
        base_recs = baseline_online(cfg, specs, 1 << 16, k.baseline_sparse_lr)
    last = [r for r in recs if r["day"] == end]
    last_base = [r for r in base_recs if r["day"] == end]
    w = np.array([r["samples"] for r in last], dtype=float)
    res = {
        "streamrec": float(np.average([r["predict_auc"] for r in last], weights=w)),
        "baseline": float(np.average([r["predict_auc"] for r in last_base], weights=w)),
        "best": float(np.average([r["best_auc"] for r in last], weights=w)),
    }
    print(
        f"quality: planted stream, {days} days x {1440 // split_interval} passes x "
        f"{samples_per_split} samples, {slots} slots, vocab {params.vocab}, drift "
        f"{params.drift}/day; dense adagrad lr {k.dense_lr}, sparse {k.sparse_rule} lr "
        f"{k.sparse_lr} initial_g2sum {k.initial_g2sum}, init +-{k.init_range}; baseline: "
        f"torch Adagrad, sparse lr {k.baseline_sparse_lr}"
    )
    for i, (r, b) in enumerate(zip(recs, base_recs, strict=True)):
        if i % max(1, len(recs) // 8) == 0 or i == len(recs) - 1:
            print(
                f"  {r['day']}/{r['pass_id']:<3d} predict AUC streamrec {r['predict_auc']:.4f}"
                f"  baseline {b['predict_auc']:.4f}  best {r['best_auc']:.4f}"
            )
    print(
        f"  last day predict AUC: streamrec {res['streamrec']:.4f}, baseline "
        f"{res['baseline']:.4f}, best possible {res['best']:.4f}; gap to best "
        f"{res['best'] - res['streamrec']:.4f}, streamrec - baseline "
        f"{res['streamrec'] - res['baseline']:+.4f}"
    )
    return res


def baseline_online(cfg: TrainerConfig, specs: list, rows: int, sparse_lr: float) -> list[dict]:
    """The reference DLRM (keys hashed into `rows` rows per table), predict then train."""
    hp = cfg.hyper_parameters
    model = DLRM(
        13,
        [rows] * hp.sparse_inputs_slots,
        hp.arch_sparse_feature_size,
        hp.arch_mlp_bot,
        hp.arch_mlp_top,
        seed=hp.numpy_rand_seed,
    )
    dense_opt = torch.optim.Adagrad(model.dense.parameters(), lr=hp.learning_rate)
    sparse_opt = torch.optim.Adagrad(model.emb_l.parameters(), lr=sparse_lr)
    loss_fn = torch.nn.BCELoss()
    out = []
    for spec in specs:
        files = layout.pass_files(cfg.runner.train_data_dir, spec, cfg.runner.data_donefile)
        batches = list(
            iter_batches(
                files,
                "generated",
                hp.sparse_inputs_slots,
                cfg.runner.train_batch_size,
                ParseStats(),
            )
        )
        pred, best = AucAccumulator(), AucAccumulator()
        model.eval()
        with torch.no_grad():
            for b in batches:
                pred.add(_baseline_forward(model, b, rows), b.labels)
                best.add(b.ptrue, b.labels)
        model.train()
        for b in batches:
            dense_opt.zero_grad()
            sparse_opt.zero_grad()
            loss = loss_fn(_baseline_forward(model, b, rows).view(-1, 1), b.labels.view(-1, 1))
            loss.backward()
            dense_opt.step()
            sparse_opt.step()
        out.append(
            {
                "day": spec.day,
                "pass_id": spec.pass_id,
                "predict_auc": pred.auc(),
                "best_auc": best.auc(),
            }
        )
    return out


def _baseline_forward(model: DLRM, b, rows: int) -> torch.Tensor:
    n = len(b)
    idx = [torch.remainder(b.keys[:, j], rows) for j in range(b.keys.shape[1])]
    offs = [torch.arange(n, dtype=torch.int64)] * len(idx)
    return model(b.dense, offs, idx).view(-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setup", choices=["a", "b", "all", "none"], default="all")
    ap.add_argument("--full", action="store_true", help="full size (run alone)")
    ap.add_argument("--samples", type=int, default=None, help="samples per throughput pass")
    ap.add_argument("--service-shards", type=int, default=1, help="0 skips the service run")
    ap.add_argument("--quality", action="store_true")
    ap.add_argument("--measure", choices=["baseline", "inproc", "service"], help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--quality-days", type=int, default=None)
    ap.add_argument("--quality-samples", type=int, default=None, help="samples per split")
    knobs = QualityKnobs()
    ap.add_argument("--dense-lr", type=float, default=knobs.dense_lr)
    ap.add_argument("--sparse-lr", type=float, default=knobs.sparse_lr)
    ap.add_argument(
        "--initial-g2sum",
        type=float,
        default=knobs.initial_g2sum,
        help="the store rule's initial_g2sum (quality)",
    )
    ap.add_argument("--no-pipeline", action="store_true", help="pull after the last push")
    ap.add_argument("--sparse-rule", default=knobs.sparse_rule, help="the store's rule (quality)")
    ap.add_argument("--baseline-sparse-lr", type=float, default=knobs.baseline_sparse_lr)
    ap.add_argument(
        "--init-range",
        type=float,
        default=knobs.init_range,
        help="StreamRec rows start uniform in +-this",
    )
    ap.add_argument("--vocab", type=int, default=knobs.vocab, help="ids per slot and day")
    ap.add_argument("--embedx-threshold", type=float, default=None, help="table default if unset")
    ap.add_argument("--delete-threshold", type=float, default=None, help="table default if unset")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.measure:
        print(
            json.dumps(
                measure(
                    args.measure, args.setup, args.samples, Path(args.root), args.service_shards
                )
            )
        )
        return
    names = ["a", "b"] if args.setup == "all" else [] if args.setup == "none" else [args.setup]
    for name in names:
        samples = args.samples or (SETUPS[name]["batch"] * (400 if args.full else 60))
        throughput(name, samples, 4, args.service_shards)
    knobs = QualityKnobs(
        dense_lr=args.dense_lr,
        sparse_lr=args.sparse_lr,
        sparse_rule=args.sparse_rule,
        initial_g2sum=args.initial_g2sum,
        init_range=args.init_range,
        pipeline=not args.no_pipeline,
        vocab=args.vocab,
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
