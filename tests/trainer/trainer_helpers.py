"""Helpers of the trainer tests: small planted streams and job configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamrec.control.trainer_config import TrainerConfig
from streamrec.datagen.planted import StreamParams, generate

SLOTS = 4


def small_config(data: Path, model: Path, **runner: Any) -> TrainerConfig:
    """A tiny DLRM over 4 slots, 2 splits a day (split_interval 720), one split per pass."""
    return TrainerConfig.parse(
        {
            "runner": {
                "train_data_dir": str(data),
                "model_save_path": str(model),
                "split_interval": 720,
                "split_per_pass": 1,
                "start_day": "20190720",
                "end_day": "20190721",
                "checkpoint_per_pass": 1,
                "save_delta_frequency": 0,
                "train_batch_size": 128,
                "data_sleep_second": 0.05,
                **runner,
            },
            "hyper_parameters": {
                "sparse_inputs_slots": SLOTS,
                "arch_sparse_feature_size": 4,
                "arch_mlp_bot": "13-16-4",
                "arch_mlp_top": "8-1",
                "optimizer": "adagrad",
                "learning_rate": 0.05,
            },
        }
    )


def write_stream(root: Path, days: int = 2, samples: int = 1500, **kw: Any) -> Path:
    generate(
        root,
        "20190720",
        days,
        720,
        samples,
        files_per_split=2,
        params=StreamParams(slots=SLOTS, vocab=300, seed=5),
        **kw,
    )
    return root
