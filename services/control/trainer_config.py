"""Trainer configuration: PaddleRec ``config_online.yaml`` shape, reference DLRM names.

A job file has up to eight sections; unknown keys anywhere are an error that names them (a
renamed one names its new name)::

    runner:                       # PaddleRec online runner names
      train_data_dir: data        # train_data_dir/YYYYMMDD/HHMM/part-*
      data_format: generated      # criteo | parquet | slot (reader_type is an alias)
      split_interval: 5           # minutes per split
      split_per_pass: 2
      start_day: "20190720"
      end_day: "20190720"
      end_split: null             # HHMM of end_day, "landed", or null (the day's last)
      data_donefile: to.hadoop.done
      data_sleep_second: 1
      checkpoint_per_pass: 2
      save_delta_frequency: 6
      model_save_path: output_model
      train_batch_size: 256
      schema: {label: click, dense: [...], sparse: [...]}   # feature_schema.py; none: preset
    hyper_parameters:             # reference DLRM names
      arch_sparse_feature_size: 16
      arch_mlp_bot: 13-512-256-64-16
      arch_mlp_top: 512-256-1
      arch_interaction_op: dot
      loss_function: bce
      learning_rate: 0.01
      optimizer: adagrad
    table_parameters: {...}       # embedding-store TableOptions for every sparse slot
    store: {endpoints: [tcp://127.0.0.1:7000], tier: host}   # none: the store in-process
    distributed: {backend: auto}
    resources: {trainer_ranks: 2, threads_per_rank: 4}       # checked / applied at start
    negative_sampling: {enabled: true, table_path: items.parquet, sample_size: 4}
    online: {redis_url: redis://127.0.0.1:6379/0, prefix: streamrec:emb}     # serving Redis

Every section has defaults, so ``TrainerConfig.parse({})`` is a small valid job. The sections
are defined by concept: ``runner_config`` (runner), ``model_config`` (hyper_parameters),
``runtime_config`` (store, distributed, resources, negative_sampling, online), with the numeric
bounds they share with the REST job in ``config_bounds``.
"""

from __future__ import annotations

import os
from enum import StrEnum
from typing import Any

from pydantic import Field, ValidationInfo, model_validator
from streamrec.config import StrictConfig
from streamrec.control.feature_schema import model_problems, sampling_problems
from streamrec.control.model_config import ModelConfig
from streamrec.control.runner_config import (
    END_LANDED,
    CheckpointFields,
    DataFields,
    DataFormat,
    RunnerConfig,
)
from streamrec.control.runtime_config import (
    DistributedConfig,
    NegativeSamplingConfig,
    OnlineConfig,
    OnlineSave,
    ResourcesConfig,
    StoreConfig,
)

# The sections live in their own modules; the whole config is importable from here.
__all__ = [
    "END_LANDED",
    "FLAG_SECTIONS",
    "CheckpointFields",
    "DataFields",
    "DataFormat",
    "DistributedConfig",
    "ModelConfig",
    "NegativeSamplingConfig",
    "OnlineConfig",
    "OnlineMode",
    "OnlineSave",
    "ResourcesConfig",
    "RunnerConfig",
    "StoreConfig",
    "TrainerConfig",
    "flag_fields",
]


class OnlineMode(StrEnum):
    """The export mode that publishes to the serving Redis (the REST trigger's ``mode``)."""

    ONLINE = "online"


class TrainerConfig(StrictConfig):
    """A whole trainer job. See the module docstring for the YAML shape."""

    runner: RunnerConfig = Field(default_factory=RunnerConfig)
    hyper_parameters: ModelConfig = Field(default_factory=ModelConfig)
    #: embedding-store TableOptions fields applied to every slot's table.
    table_parameters: dict[str, Any] = Field(default_factory=dict)
    store: StoreConfig = Field(default_factory=StoreConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    negative_sampling: NegativeSamplingConfig = Field(default_factory=NegativeSamplingConfig)
    online: OnlineConfig = Field(default_factory=OnlineConfig)

    @model_validator(mode="before")
    @classmethod
    def _alias(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        # a REST job's model.precision and model.device: hyper_parameters.precision and
        # runner.device
        for name, section in (("precision", "hyper_parameters"), ("device", "runner")):
            if name not in data:
                continue
            values = dict(data.get(section) or {})
            if values.get(name, data[name]) != data[name]:
                raise ValueError(
                    f"{name} {data[name]!r} contradicts {section}.{name} {values[name]!r}"
                )
            values[name] = data[name]
            data = {k: v for k, v in data.items() if k != name} | {section: values}
        hp, runner = data.get("hyper_parameters"), data.get("runner")
        mb = hp.get("mini_batch_size") if isinstance(hp, dict) else None
        if mb is None:
            return data
        runner = dict(runner) if isinstance(runner, dict) else {}
        if runner.get("train_batch_size", mb) != mb:
            raise ValueError(
                f"hyper_parameters.mini_batch_size {mb!r} contradicts "
                f"runner.train_batch_size {runner['train_batch_size']!r}"
            )
        runner["train_batch_size"] = mb
        return dict(data, runner=runner)

    @model_validator(mode="after")
    def _device(self) -> TrainerConfig:
        if self.distributed.backend == "nccl" and self.runner.device == "cpu":
            raise ValueError(
                "distributed.backend 'nccl' joins ranks on CUDA GPUs: it contradicts "
                "runner.device 'cpu' (set runner.device cuda or auto, or the backend gloo)"
            )
        return self

    @model_validator(mode="after")
    def _schema(self, info: ValidationInfo) -> TrainerConfig:
        """A schema's features against the model and the format (feature_schema.py); the
        slot count follows the schema. The API checks with ``{"schema_checks": False}`` in
        the context and names each problem by its job field itself."""
        schema = self.runner.feature_schema
        hp = self.hyper_parameters
        if schema is not None and "arch_mlp_bot" not in hp.model_fields_set:
            # the bottom MLP's input is the schema's dense count (none: no MLP, a vector)
            dense, dim = len(schema.dense), hp.arch_sparse_feature_size
            hp.arch_mlp_bot = [dense, *hp.arch_mlp_bot[1:-1], dim] if dense else [0, dim]
        if not (info.context and info.context.get("schema_checks") is False):
            # a schema's, and the model's shapes; without one, negative_sampling's names
            problems = sampling_problems(self) if schema is None else model_problems(self)
            if problems:
                raise ValueError(
                    "; ".join(f"{path}: {msg} (got {value!r})" for path, msg, value in problems)
                )
        if schema is None:
            return self
        if "sparse_inputs_slots" not in hp.model_fields_set:  # a set one is checked above
            hp.sparse_inputs_slots = len(schema.sparse)
        return self

    @property
    def slot_tables(self) -> list[str]:
        """The table of each sparse slot: ``slot_<k>``, k the slot, or for a schema feature
        whose ``table:`` shares another's, that feature's slot."""
        schema = self.runner.feature_schema
        if schema is None:
            return [f"slot_{i}" for i in range(self.hyper_parameters.sparse_inputs_slots)]
        return [f"slot_{k}" for k in schema.slot_tables()]

    @property
    def slot_dims(self) -> list[int]:
        """Each slot's table dim: the schema's ``dim`` of its table, else
        ``arch_sparse_feature_size`` (a slot of another dim is projected to that one)."""
        schema = self.runner.feature_schema
        dim = self.hyper_parameters.arch_sparse_feature_size
        if schema is None:
            return [dim] * self.hyper_parameters.sparse_inputs_slots
        return schema.slot_dims(dim)

    @property
    def table_names(self) -> list[str]:
        """The embedding tables: one per sparse slot (slot_0 .. slot_{S-1}) but the slots
        that share another's."""
        return list(dict.fromkeys(self.slot_tables))

    @property
    def pooling(self) -> list[str]:
        """Each slot's pooling (``sum`` or ``mean``): the schema's, else all ``sum``."""
        schema = self.runner.feature_schema
        if schema is None:
            return ["sum"] * self.hyper_parameters.sparse_inputs_slots
        return [s.pooling for s in schema.sparse]

    def world(self) -> tuple[int, int]:
        """(rank, world_size) from the environment (torchrun / Kubernetes env://)."""
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


#: CLI flags: --name (dashes) for every runner and hyper_parameters field.
FLAG_SECTIONS: dict[str, type[StrictConfig]] = {
    "runner": RunnerConfig,
    "hyper_parameters": ModelConfig,
}


def flag_fields() -> dict[str, tuple[str, str]]:
    """'arch-mlp-bot' -> ('hyper_parameters', 'arch_mlp_bot') for every flag."""
    out = {}
    for section, cls in FLAG_SECTIONS.items():
        for name, info in cls.model_fields.items():
            flag = info.alias or name  # --schema '{label: y, dense: [a], sparse: [...]}'
            out[flag.replace("_", "-")] = (section, flag)
    return out
