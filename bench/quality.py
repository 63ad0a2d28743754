"""Predict-then-train AUC of StreamRec at its defaults against a plain torch model, pass by
pass over the same laid-out stream.

StreamRec: the trainer in-process (``OnlineTrainer``) with a job that sets only where the
data is and the schema (``arch_mlp_bot`` starts at the schema's dense count: its only
required model setting); everything else at its default, day-end shrink and all. ``--set``
changes one setting (``--set runner.train_batch_size=256``, ``--set
table_parameters.delete_threshold=0.8``) to measure what a default costs.

Baseline: ``nn.EmbeddingBag`` per feature (sum or mean as the schema says, shared where it
shares; keys taken modulo ``2^18`` rows, with no collision on the data sets here), the same
DLRM MLPs and interaction (``DLRMDense``), all parameters with ``torch.optim.Adagrad``,
predicting each pass before training on it, over the very batches StreamRec reads (its own
reader). Its batch size and learning rate are tuned on the same stream (``--grid``): the
best mean is reported, and every cell.

The figure is the mean predict AUC over the passes whose predict AUC is defined (both
classes present), and the same passes for both.

    python bench/quality.py --data /tmp/ml100k/data --schema /tmp/ml100k/schema.yaml --grid
    streamrec-datagen --out /tmp/planted --start-day 20190720 --days 4 \
        --split-interval 240 --samples-per-split 20000
    python bench/quality.py --data /tmp/planted --baseline-lr 0.01   # the planted stream
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from streamrec import layout
from streamrec.control.feature_schema import FeatureSchema
from streamrec.control.trainer_config import TrainerConfig
from streamrec.trainer.batches import ParseStats
from streamrec.trainer.data import iter_batches
from streamrec.trainer.evaluation import AucAccumulator
from streamrec.trainer.model import DLRMDense
from streamrec.trainer.runner import OnlineTrainer
from torch import nn

BASELINE_ROWS = 1 << 18
GRID = {"batch": (64, 256, 1024), "lr": (0.003, 0.01, 0.03)}


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


def job(
    data: Path, schema: dict[str, Any] | None, sets: list[str], model_dir: Path
) -> TrainerConfig:
    """The defaults' job over ``data``, with ``sets`` (``section.key=yaml``) applied; no
    schema: the format's preset."""
    dense = 13 if schema is None else len(schema.get("dense", []))
    spec: dict[str, Any] = {
        "runner": {
            **stream_bounds(data),
            **({} if schema is None else {"schema": schema}),
            "model_save_path": str(model_dir),
            "data_sleep_second": 0.01,
        },
        "hyper_parameters": {"arch_mlp_bot": [dense, 512, 256, 64, 16]},
    }
    for item in sets:
        path, _, value = item.partition("=")
        *parents, key = path.split(".")
        node = spec
        for p in parents:
            node = node.setdefault(p, {})
        node[key] = yaml.safe_load(value)
    return TrainerConfig.parse(spec)


def streamrec_aucs(config: TrainerConfig) -> list[float | None]:
    with OnlineTrainer(config) as t:
        return [t.run_pass(spec)["predict_auc"] for spec in t.passes_todo()]


class Baseline(nn.Module):
    """``nn.EmbeddingBag`` per table + ``DLRMDense`` (the same MLPs as StreamRec's)."""

    def __init__(self, config: TrainerConfig, schema: FeatureSchema) -> None:
        super().__init__()
        hp = config.hyper_parameters
        dim = hp.arch_sparse_feature_size
        self.tables = nn.ModuleDict()
        self.table_of: list[str] = []
        for f in schema.sparse:
            name = f.table or f.name
            if name not in self.tables:
                self.tables[name] = nn.EmbeddingBag(BASELINE_ROWS, dim, mode="sum", sparse=True)
                nn.init.uniform_(self.tables[name].weight, -0.05, 0.05)
            self.table_of.append(name)
        self.pooling = [f.pooling for f in schema.sparse]
        self.dense = DLRMDense(
            len(schema.dense), len(schema.sparse), dim, hp.arch_mlp_bot, hp.arch_mlp_top
        )

    def forward(self, batch: Any) -> torch.Tensor:
        pooled = []
        for bag, name, pooling in zip(batch.features(), self.table_of, self.pooling, strict=True):
            values, offsets = bag.values(), bag.offsets()
            rows = torch.remainder(values, BASELINE_ROWS)
            out = self.tables[name](rows, offsets[:-1])
            if pooling == "mean":
                lengths = (offsets[1:] - offsets[:-1]).clamp(min=1).unsqueeze(1)
                out = out / lengths
            pooled.append(out)
        return self.dense(batch.dense, pooled).reshape(-1)


def baseline_aucs(config: TrainerConfig, batch: int, lr: float) -> list[float | None]:
    torch.manual_seed(0)
    r = config.runner
    schema = r.feature_schema or FeatureSchema.preset(
        r.data_format, config.hyper_parameters.sparse_inputs_slots
    )
    model = Baseline(config, schema)
    opt = torch.optim.Adagrad(model.parameters(), lr=lr)
    loss_fn = nn.BCELoss()
    root = Path(r.train_data_dir)
    out: list[float | None] = []
    for spec in layout.iter_passes(
        r.start_day, r.end_day, r.split_interval, r.split_per_pass, r.end_split
    ):
        files = layout.pass_files(root, spec, r.data_donefile)
        batches = list(
            iter_batches(
                files, r.data_format, len(schema.sparse), batch, ParseStats(), schema=schema
            )
        )
        acc = AucAccumulator()
        with torch.no_grad():
            for b in batches:
                acc.add(model(b), b.labels)
        out.append(acc.result()["auc"])
        for b in batches:
            opt.zero_grad()
            loss_fn(model(b), b.labels).backward()
            opt.step()
    return out


def mean_over(aucs: list[float | None], passes: list[int]) -> float:
    return statistics.fmean(float(aucs[i]) for i in passes)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", type=Path, required=True, help="a stream laid out by --from-events")
    ap.add_argument(
        "--schema", type=Path, help="the data.schema (YAML or JSON); none: a planted stream"
    )
    ap.add_argument("--set", action="append", default=[], help="section.key=value (repeatable)")
    ap.add_argument("--grid", action="store_true", help=f"tune the baseline over {GRID}")
    ap.add_argument("--baseline-batch", type=int, default=256)
    ap.add_argument("--baseline-lr", type=float, default=0.01)
    ap.add_argument("--no-baseline", action="store_true")
    args = ap.parse_args(argv)
    schema = None if args.schema is None else yaml.safe_load(args.schema.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        config = job(args.data, schema, args.set, Path(tmp) / "model")
        t0 = time.monotonic()
        ours = streamrec_aucs(config)
        seconds = time.monotonic() - t0
    print(json.dumps({"streamrec_per_pass": ours}), file=sys.stderr)
    cells = (
        [(b, lr) for b in GRID["batch"] for lr in GRID["lr"]]
        if args.grid
        else [(args.baseline_batch, args.baseline_lr)]
    )
    theirs = {} if args.no_baseline else {c: baseline_aucs(config, *c) for c in cells}
    passes = [
        i
        for i, a in enumerate(ours)
        if a is not None and all(t[i] is not None for t in theirs.values())
    ]
    result: dict[str, Any] = {
        "passes": len(ours),
        "passes_scored": len(passes),
        "streamrec": round(mean_over(ours, passes), 4),
        "streamrec_seconds": round(seconds, 1),
        "set": args.set,
    }
    if theirs:
        scores = {c: mean_over(a, passes) for c, a in theirs.items()}
        best = max(scores, key=scores.__getitem__)
        result |= {
            "baseline": round(scores[best], 4),
            "baseline_batch": best[0],
            "baseline_lr": best[1],
            "streamrec_minus_baseline": round(result["streamrec"] - scores[best], 4),
            "grid": {f"{b}/{lr}": round(s, 4) for (b, lr), s in scores.items()},
        }
    first = passes[: max(1, len(passes) // 7)]
    result["streamrec_first_seventh"] = round(mean_over(ours, first), 4)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
