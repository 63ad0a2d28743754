"""Serving export and the ``predict`` entry point.

An exported model directory::

    dense_int8.pt   the dense DLRM with every nn.Linear int8-dynamically quantized (as in DLRM:
                    ``quantize_dynamic(dlrm, {nn.Linear}, torch.qint8)``), as a state dict
    model.json      the architecture (hyper_parameters), the sparse tables' options and the
                    lineage: the splits the model was trained on (:mod:`.data_lineage`)
    sparse/         the embedding store's ``base`` save (rows with score >= base_threshold):
                    one directory, or ``shard-K-of-N/`` per shard of a job on N shards
    MANIFEST.json   written last, with checksums

:class:`Predictor` loads it (plus optional delta models saved later by the trainer, applied
in order) into one in-process store, every shard's rows of a sharded save, and scores files
of either data format, saying which of them the model was trained on (an AUC over those is
in-sample, not a held-out evaluation). Nothing is unpickled: the state dict is read with
``weights_only=True`` into a model rebuilt from model.json.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from streamrec.control.feature_schema import FeatureSchema
from streamrec.control.trainer_config import ModelConfig
from streamrec.save_modes import SaveMode
from streamrec.trainer.data.batches import ParseStats
from streamrec.trainer.data.reader import iter_batches
from streamrec.trainer.errors import CheckpointError
from streamrec.trainer.model.checkpoint_dirs import (
    SPARSE_NAME,
    fresh_dir,
    read_model_manifest,
    write_manifest,
)
from streamrec.trainer.model.data_lineage import lineage, trained_on
from streamrec.trainer.model.dlrm import DLRMDense
from streamrec.trainer.model.evaluation import AucAccumulator
from streamrec.trainer.model.pass_log import PASSES_FILE
from streamrec.trainer.sparse import SparseTables
from torch import nn

DENSE_INT8 = "dense_int8.pt"
MODEL_JSON = "model.json"


def quantize(model: nn.Module) -> nn.Module:
    """int8 dynamic quantization of the Linear layers (weights int8, activations on the fly)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization warns of its future move
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def build_dense(
    arch: ModelConfig, slot_dims: list[int] | None = None, schema: FeatureSchema | None = None
) -> DLRMDense:
    """The dense model of ``arch``; ``slot_dims``: each feature's dim (None: all the job's);
    its dense normalizer's flags from ``schema`` (None: the presets', all normalized; a
    loaded state brings its own)."""
    return DLRMDense(
        arch.dense_dim,
        arch.sparse_inputs_slots,
        arch.arch_sparse_feature_size,
        arch.arch_mlp_bot,
        arch.arch_mlp_top,
        arch.arch_interaction_op,
        arch.arch_interaction_itself,
        arch.loss_threshold,
        seed=arch.numpy_rand_seed,
        slot_dims=slot_dims,
        normalize=[True] * arch.dense_dim if schema is None else schema.normalized(),
        norm_window=arch.dense_norm_window,
    )


def export_serving(trainer: Any, out_dir: Path) -> Path:
    """Writes the serving model of ``trainer`` (an OnlineTrainer) into ``out_dir``."""
    from streamrec.trainer import distributed as ddp

    ddp.barrier()
    if trainer.rank == 0:
        fresh_dir(out_dir)
        q = quantize(trainer.dense_copy())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.save(q.state_dict(), out_dir / DENSE_INT8)
        (out_dir / MODEL_JSON).write_text(
            json.dumps(
                {
                    "hyper_parameters": trainer.config.hyper_parameters.model_dump(mode="json"),
                    "tables": [t.model_dump(mode="json") for t in trainer.tables],
                    "slot_tables": trainer.config.slot_tables,
                    "data_format": trainer.config.runner.data_format,
                    "schema": trainer.config.model_dump(mode="json")["runner"]["schema"],
                    "lineage": lineage(
                        trainer.model_root / PASSES_FILE,
                        trainer.last_pass,
                        trainer.config.runner.train_data_dir,
                    ),
                },
                indent=1,
            )
        )
        trainer.store.save(str(out_dir / SPARSE_NAME), mode=SaveMode.BASE)
        write_manifest(out_dir, {"mode": "serving", "last_pass": trainer.last_pass})
    ddp.barrier()
    return out_dir


class Predictor:
    """Scores samples with an exported model.

    Args:
        model_dir: a directory written by :func:`export_serving`.
        deltas: delta model directories (``model_root/DAY/delta_N``) to apply in order.
    """

    def __init__(self, model_dir: str | Path, deltas: list[str | Path] | None = None) -> None:
        from streamrec.embedding_store import EmbeddingStore, TableOptions

        self.dir = Path(model_dir)
        read_model_manifest(self.dir)
        try:
            spec = json.loads((self.dir / MODEL_JSON).read_text())
            self.arch = ModelConfig.parse(spec["hyper_parameters"], source=str(self.dir))
            tables = [TableOptions.parse(t) for t in spec["tables"]]
            slot_tables = [str(t) for t in spec.get("slot_tables", [t.name for t in tables])]
            self.data_format = str(spec.get("data_format", "generated"))
            raw = spec.get("schema")
            self.schema = None if raw is None else FeatureSchema.parse(raw, str(self.dir))
            self.lineage: dict[str, Any] | None = spec.get("lineage")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{self.dir / MODEL_JSON}: unusable: {exc}") from exc
        # a feature's own dim is its table's (the schema's); its projection is in the state
        job_dim = self.arch.arch_sparse_feature_size
        dims = None if self.schema is None else self.schema.slot_dims(job_dim)
        self.dense = quantize(build_dense(self.arch, dims, self.schema)).eval()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                state = torch.load(self.dir / DENSE_INT8, map_location="cpu", weights_only=True)
            self.dense.load_state_dict(state)
        except Exception as exc:
            raise CheckpointError(f"{self.dir / DENSE_INT8}: cannot load: {exc}") from exc
        self.store = EmbeddingStore(tables)
        self.store.load(str(self.dir / SPARSE_NAME))
        for d in deltas or []:
            read_model_manifest(Path(d))
            self.store.load(str(Path(d) / SPARSE_NAME))
        # the trainer's own sparse side: its pooling per feature, one-key and ragged batches
        pooling = None if self.schema is None else [f.pooling for f in self.schema.sparse]
        self.emb = SparseTables(
            self.store,
            slot_tables,
            job_dim,
            pooling=pooling,
            dims=dims,
        )

    def predict_batch(self, batch: Any) -> torch.Tensor:
        """A :class:`~streamrec.trainer.data.batches.Batch` -> click probabilities (B,) float32."""
        with torch.no_grad():
            pulled = self.emb.pull(self.emb.prepare(batch), create=False)
            return self.dense(batch.dense, self.emb.forward(pulled)).view(-1)

    def score_files(
        self,
        files: list[Path],
        out: Path | None = None,
        data_format: str | None = None,
        batch_size: int = 4096,
    ) -> dict[str, Any]:
        """Scores files; writes one probability per line to ``out``; returns AUC etc. and
        ``held_out``: True when the model was trained on none of ``files``, False when on
        some (listed in ``trained_on``), None when the model has no lineage."""
        acc = AucAccumulator()
        stats = ParseStats()
        fmt = data_format or self.data_format
        sink = out.open("w") if out is not None else None
        try:
            batches = iter_batches(
                files, fmt, self.arch.sparse_inputs_slots, batch_size, stats, schema=self.schema
            )
            for batch in batches:
                p = self.predict_batch(batch)
                acc.add(p, batch.labels)
                if sink is not None:
                    np.savetxt(sink, p.numpy(), fmt="%.6f")
        finally:
            if sink is not None:
                sink.close()
        res = acc.result()
        seen = trained_on(files, self.lineage)
        return {
            "samples": res["samples"],
            "auc": res["auc"],
            "logloss": res["logloss"],
            "malformed_lines": stats.malformed,
            "held_out": None if seen is None else not seen,
            "trained_on": seen,
            "model_last_pass": (self.lineage or {}).get("last_pass"),
        }

    def close(self) -> None:
        self.store.close()
