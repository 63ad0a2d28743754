"""Trainer benchmark, quality: the planted stream trained online by StreamRec and the baseline.

The planted stream (streamrec-datagen) over several days, trained online (predict, then train,
each pass) by StreamRec and by the baseline model on the same batches (keys hashed into
nn.EmbeddingBag tables); prints the last day's predict AUC of both next to the best possible
AUC. Run through ``bench/trainer.py --quality`` (its flags set :class:`QualityKnobs`).
"""

from __future__ import annotations

import datetime as dt
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from streamrec import layout
from streamrec.control.trainer_config import TrainerConfig
from streamrec.datagen.planted import StreamParams, generate
from streamrec.trainer.data.batches import ParseStats
from streamrec.trainer.data.reader import iter_batches
from streamrec.trainer.model.dlrm import DLRM
from streamrec.trainer.model.evaluation import AucAccumulator
from streamrec.trainer.runner import OnlineTrainer
from streamrec.trainer.store_tables import DEFAULT_TABLE_PARAMETERS, build_table_options

#: the planted stream's first day
START_DAY = "20190720"


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
        generate(root / "data", START_DAY, days, split_interval, samples_per_split, 2, params)
        end = layout.format_day(layout.parse_day(START_DAY) + dt.timedelta(days=days - 1))
        cfg = TrainerConfig.parse(
            {
                "runner": {
                    "train_data_dir": str(root / "data"),
                    "model_save_path": str(root / "model"),
                    "split_interval": split_interval,
                    "split_per_pass": 1,
                    "start_day": START_DAY,
                    "end_day": end,
                    "checkpoint_per_pass": 0,
                    "save_base_at_day_end": False,
                    "train_batch_size": 512,
                    "sparse_pipeline": k.pipeline,
                    "device": "cpu",  # its baseline trains on the CPU
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
