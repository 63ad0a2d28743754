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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# bench/ is the script's directory, first on sys.path: the baseline shares its setups
from reference_dlrm import LR, SETUPS
from streamrec import layout
from streamrec.control.trainer_config import TrainerConfig
from streamrec.trainer.batches import ParseStats
from streamrec.trainer.data import iter_batches
from streamrec.trainer.datagen import StreamParams, generate
from streamrec.trainer.evaluation import AucAccumulator
from streamrec.trainer.model import DLRM
from streamrec.trainer.runner import OnlineTrainer
from streamrec.trainer.store import DEFAULT_TABLE_PARAMETERS, build_table_options
from streamrec.trainer.text_lines import to_criteo_text

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
    setup: dict, data_root: Path, model_root: Path, addresses: list[str], precision: str = "auto"
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
            "store": {"endpoints": addresses},
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
    kind: str, name: str, samples: int, root: Path, shards: int, precision: str = "auto"
) -> dict:
    """One figure in the current process (the parent runs each in a fresh process)."""
    setup = SETUPS[name]
    cfg = streamrec_config(setup, root / "data", root / f"model-{kind}-{precision}", [], precision)
    if kind == "inproc":
        return streamrec_rate(cfg)
    from streamrec.embedding_store import LocalShards

    tables = root / "tables.json"
    tables.write_text(
        json.dumps({"tables": [t.model_dump(mode="json") for t in build_table_options(cfg)]})
    )
    with LocalShards(tables, shards) as local:
        remote = streamrec_config(
            setup, root / "data", root / f"model-service-{precision}", local.endpoints, precision
        )
        return streamrec_rate(remote)


def run_measure(
    kind: str, name: str, samples: int, root: Path, shards: int, precision: str = "auto"
) -> dict:
    """Runs :func:`measure` in a fresh interpreter. In-process, the trainer owns the machine's
    cores, as a rank in its pod (``OMP_WAIT_POLICY=ACTIVE`` in the trainer images): its OpenMP
    threads run the step's gemms and spin between them, as the reference's do. Through the
    service the shards share the same 2 cores, so everything keeps StreamRec's default
    (PASSIVE, services/common/__init__.py), as on a node the trainer shares."""
    env = dict(os.environ)
    # set, not setdefault: `import streamrec` put PASSIVE in this process's environment
    env["OMP_WAIT_POLICY"] = "ACTIVE" if kind == "inproc" else "PASSIVE"
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


def run_baseline(name: str, steps: int) -> dict:
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
    name: str, samples: int, files: int, service_shards: int, precisions: list[str]
) -> dict:
    """The reference step, then StreamRec in-process at each of ``precisions`` and through
    the service at the first."""
    setup = SETUPS[name]
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        root = Path(tmp)
        write_pass(root / "data", make_data(setup, samples), files)
        out["baseline"] = run_baseline(name, samples // setup["batch"])
        for p in precisions:
            out[f"inproc/{p}"] = run_measure("inproc", name, samples, root, service_shards, p)
        if service_shards:
            out["service"] = run_measure(
                "service", name, samples, root, service_shards, precisions[0]
            )
    b = out["baseline"]["rate"]
    print(
        f"setup {name}: {len(setup['ln_emb'])} tables {setup['ln_emb'][0]}.. rows, dim "
        f"{setup['bot'][-1]}, bottom {'-'.join(map(str, setup['bot']))}, top "
        f"{'-'.join(map(str, setup['top']))}, batch {setup['batch']}, {samples} samples"
        + (f", {setup['lookups']} ids a lookup (Parquet lists)" if "lookups" in setup else "")
    )
    base = out["baseline"]
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


# -- quality ------------------------------------------------------------------------------
@dataclass
class QualityKnobs:
    """The quality run's settings (CLI flags of the same names).

    StreamRec's are None unless a flag sets them, and None keeps the trainer's own default
    (``ModelConfig`` for the dense optimizer, ``DEFAULT_TABLE_PARAMETERS`` for the tables): a run
    with no flags measures the product as a user gets it. The baseline's are the reference
    side's (torch Adagrad on dense and sparse parameters).
    """

    dense_optimizer: str | None = None
    dense_lr: float | None = None
    sparse_rule: str | None = None
    sparse_lr: float | None = None
    initial_g2sum: float | None = None
    #: StreamRec rows start uniform in +-init_range (None: the trainer's initializer)
    init_range: float | None = None
    embedx_threshold: float | None = None
    delete_threshold: float | None = None
    pipeline: bool = True
    vocab: int = 300
    #: Seeds the planted stream and both models' initial values (another draw of the same
    #: experiment, to see how much of a difference is luck); None: the fixed ones.
    seed: int | None = None
    baseline_dense_lr: float = 0.05
    baseline_sparse_lr: float = 0.05

    def hyper_parameters(self) -> dict:
        """The dense optimizer settings flagged (the others: ModelConfig's defaults)."""
        named = (("optimizer", self.dense_optimizer), ("learning_rate", self.dense_lr))
        return {k: v for k, v in named if v is not None}

    def table_parameters(self) -> dict:
        """The table settings flagged (the others: the trainer's DEFAULT_TABLE_PARAMETERS)."""
        out: dict = {}
        named = (
            ("name", self.sparse_rule),
            ("learning_rate", self.sparse_lr),
            ("initial_g2sum", self.initial_g2sum),
        )
        rule = {k: v for k, v in named if v is not None}
        if rule:
            for part in ("embed_sgd_param", "embedx_sgd_param"):
                out[part] = dict(DEFAULT_TABLE_PARAMETERS[part], **rule)
        if self.init_range is not None:
            r = self.init_range
            out["initializer"] = {"type": "uniform", "low": -r, "high": r}
        for name in ("embedx_threshold", "delete_threshold"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


def quality(
    days: int, samples_per_split: int, split_interval: int, slots: int, k: QualityKnobs
) -> dict:
    params = StreamParams(slots=slots, vocab=k.vocab, drift=0.05)
    if k.seed is not None:
        params.seed = k.seed
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
                    **k.hyper_parameters(),
                    **({} if k.seed is None else {"numpy_rand_seed": k.seed}),
                },
                "table_parameters": k.table_parameters(),
            }
        )
        recs = []
        with OnlineTrainer(cfg) as t:
            specs = t.passes_todo()
            for spec in specs:
                recs.append(t.run_pass(spec))
        base_recs = baseline_online(cfg, specs, 1 << 16, k.baseline_dense_lr, k.baseline_sparse_lr)
    last = [r for r in recs if r["day"] == end]
    last_base = [r for r in base_recs if r["day"] == end]
    w = np.array([r["samples"] for r in last], dtype=float)
    res = {
        "streamrec": float(np.average([r["predict_auc"] for r in last], weights=w)),
        "baseline": float(np.average([r["predict_auc"] for r in last_base], weights=w)),
        "best": float(np.average([r["best_auc"] for r in last], weights=w)),
    }
    hp, table = cfg.hyper_parameters, build_table_options(cfg)[0]
    rule, init = table.embedx_sgd_param, table.initializer
    source = "flags" if k.hyper_parameters() or k.table_parameters() else "trainer defaults"
    print(
        f"quality: planted stream, {days} days x {1440 // split_interval} passes x "
        f"{samples_per_split} samples, {slots} slots, vocab {params.vocab}, drift "
        f"{params.drift}/day; StreamRec ({source}): dense {hp.optimizer} lr "
        f"{hp.learning_rate}, sparse {rule.name} lr {rule.learning_rate} initial_g2sum "
        f"{rule.initial_g2sum}, init {init.model_dump() if init else rule.initial_range}; "
        f"baseline: torch Adagrad, dense lr {k.baseline_dense_lr}, sparse lr "
        f"{k.baseline_sparse_lr}"
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


def baseline_online(
    cfg: TrainerConfig, specs: list, rows: int, dense_lr: float, sparse_lr: float
) -> list[dict]:
    """The reference DLRM (keys hashed into `rows` rows per table), predict then train, with
    torch Adagrad at ``dense_lr`` / ``sparse_lr`` (not StreamRec's optimizer settings)."""
    hp = cfg.hyper_parameters
    model = DLRM(
        13,
        [rows] * hp.sparse_inputs_slots,
        hp.arch_sparse_feature_size,
        hp.arch_mlp_bot,
        hp.arch_mlp_top,
        seed=hp.numpy_rand_seed,
    )
    dense_opt = torch.optim.Adagrad(model.dense.parameters(), lr=dense_lr)
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
    ap.add_argument("--setup", choices=[*SETUPS, "all", "none"], default="all")
    ap.add_argument("--full", action="store_true", help="full size (run alone)")
    ap.add_argument("--samples", type=int, default=None, help="samples per throughput pass")
    ap.add_argument("--service-shards", type=int, default=1, help="0 skips the service run")
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
    torch.manual_seed(0)
    if args.measure:
        print(
            json.dumps(
                measure(
                    args.measure,
                    args.setup,
                    args.samples,
                    Path(args.root),
                    args.service_shards,
                    args.precision[0],
                )
            )
        )
        return
    names = ["a", "b"] if args.setup == "all" else [] if args.setup == "none" else [args.setup]
    for name in names:
        samples = args.samples or (SETUPS[name]["batch"] * (400 if args.full else 60))
        throughput(name, samples, 4, args.service_shards, args.precision)
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
