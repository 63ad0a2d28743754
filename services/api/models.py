"""REST models, named by role: ``JobCreate`` (body), ``JobPublic`` (one), ``JobsPublic`` (page).

The job spec keeps the seed-002 knob names (``split_interval``, ``split_per_pass``,
``checkpoint_per_pass``, ``data_donefile``, ``data_sleep_second``, ``model_save_path``) so a
PaddleRec user finds them where they expect.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from streamrec.api.state import JobState, PassState, TriggerState
from streamrec.layout import parse_day, split_names

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_FILE_NAME = r"^[A-Za-z0-9_.-]{1,128}$"
_ENDPOINT = r"^(tcp://[A-Za-z0-9_.\-\[\]:]+:\d{1,5}|ipc://[^\s]{1,200})$"


class Spec(BaseModel):
    """Base of the request models: unknown fields are errors (422 naming them)."""

    model_config = ConfigDict(extra="forbid")


class DataSpec(Spec):
    """Where the streaming data lands and how it is cut into passes (seed 002)."""

    data_root: str = Field(
        min_length=1,
        max_length=4096,
        description="root of YYYYMMDD/HHMM/ splits, under a data root",
    )
    start_day: str = Field(pattern=r"^\d{8}$", examples=["20190720"])
    end_day: str = Field(pattern=r"^\d{8}$", examples=["20190721"])
    split_interval: int = Field(5, ge=1, le=1440, description="minutes per split")
    split_per_pass: int = Field(1, ge=1, le=1440, description="splits per pass")
    data_donefile: str | None = Field(
        "to.hadoop.done", pattern=_FILE_NAME, description="a split is ready when this file exists"
    )
    data_sleep_second: float = Field(1.0, gt=0, le=3600)
    format: Literal["streamrec", "criteo"] = "streamrec"

    @field_validator("start_day", "end_day")
    @classmethod
    def _day(cls, v: str) -> str:
        parse_day(v)
        return v

    @field_validator("split_interval")
    @classmethod
    def _interval(cls, v: int) -> int:
        split_names(v)
        return v

    @model_validator(mode="after")
    def _order(self) -> DataSpec:
        if self.end_day < self.start_day:
            raise ValueError(f"end_day {self.end_day!r} is before start_day {self.start_day!r}")
        return self


class CheckpointSpec(Spec):
    """Checkpoint and export policy (seed 002: checkpoints per pass, base/delta/batch models)."""

    model_save_path: str = Field(
        min_length=1, max_length=4096, description="model root; under a configured model root"
    )
    checkpoint_per_pass: int = Field(
        1, ge=1, le=10_000, description="a full checkpoint every N passes"
    )
    save_delta_frequency: int = Field(
        0, ge=0, le=10_000, description="a delta model every N passes (0: none)"
    )
    save_base_at_day_end: bool = Field(
        True, description="shrink, then base and batch models after the last pass of a day"
    )


class SamplerSpec(Spec):
    endpoint: str | None = Field(None, pattern=_ENDPOINT, description="None: no negatives")
    neg_num: int = Field(0, ge=0, le=1000)


class StoreSpec(Spec):
    """The embedding store: shard endpoints (empty: in-process) and its table options."""

    endpoints: list[str] = Field(default_factory=list, max_length=1024)
    tier: Literal["host", "ssd", "device"] = Field(
        "host",
        description=(
            "storage tier the shards were started with (informational; shards own their tier)"
        ),
    )
    table_parameters: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "embedding-store TableOptions fields applied to every slot's table "
            "(embedx_threshold, embed_sgd_param, ...)"
        ),
    )

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, v: list[str]) -> list[str]:
        for i, e in enumerate(v):
            if not re.match(_ENDPOINT, e):
                raise ValueError(f"endpoints[{i}]: not a tcp:// or ipc:// address: {e!r}")
        return v


class ResourcesSpec(Spec):
    trainer_ranks: int = Field(1, ge=1, le=1024)
    device: Literal["cpu", "cuda"] = "cpu"
    threads_per_rank: int = Field(1, ge=1, le=256)


class JobCreate(Spec):
    """A job: a model trained pass by pass over one stream of days."""

    name: str = Field(pattern=_NAME, examples=["ctr-demo"])
    data: DataSpec
    checkpoint: CheckpointSpec
    model: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "trainer settings (streamrec.trainer.config.TrainerConfig fields); data and model "
            "paths come from `data` and `checkpoint`"
        ),
    )
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    store: StoreSpec = Field(default_factory=StoreSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)

    def trainer_config(self) -> dict[str, Any]:
        """The trainer's config (``streamrec.trainer.config.TrainerConfig`` shape) of this job.

        ``model`` gives the sections; the data layout, checkpoint policy, store endpoints and
        table options of the job are written over it (see :data:`JOB_RUNNER_FIELDS`).
        """
        cfg = copy.deepcopy(self.model)
        runner = dict(cfg.get("runner") or {})
        d, c = self.data, self.checkpoint
        runner.update(
            train_data_dir=d.data_root,
            data_format="generated" if d.format == "streamrec" else "criteo",
            split_interval=d.split_interval,
            split_per_pass=d.split_per_pass,
            start_day=d.start_day,
            end_day=d.end_day,
            data_donefile=d.data_donefile,
            data_sleep_second=d.data_sleep_second,
            model_save_path=c.model_save_path,
            checkpoint_per_pass=c.checkpoint_per_pass,
            save_delta_frequency=c.save_delta_frequency,
            save_base_at_day_end=c.save_base_at_day_end,
        )
        cfg["runner"] = runner
        if self.store.table_parameters:
            cfg["table_parameters"] = {
                **(cfg.get("table_parameters") or {}),
                **self.store.table_parameters,
            }
        if self.store.endpoints:
            cfg["store"] = {**(cfg.get("store") or {}), "addresses": list(self.store.endpoints)}
        if self.resources.device == "cuda":
            cfg["distributed"] = {**(cfg.get("distributed") or {}), "backend": "nccl"}
        return cfg

    @field_validator("model")
    @classmethod
    def _no_shadowing(cls, model: dict[str, Any]) -> dict[str, Any]:
        runner = model.get("runner")
        if runner is not None and not isinstance(runner, dict):
            raise ValueError(f"model.runner must be a mapping, got {type(runner).__name__}")
        clash = sorted(set(runner or {}) & JOB_RUNNER_FIELDS)
        if clash:
            raise ValueError(
                f"model.runner.{clash[0]} is set by the job's data/checkpoint "
                f"sections; remove it (got {runner[clash[0]]!r})"
            )
        return model


#: Trainer runner fields the job spec owns (model.runner may not set them).
JOB_RUNNER_FIELDS = frozenset(
    {
        "train_data_dir",
        "data_format",
        "reader_type",
        "split_interval",
        "split_per_pass",
        "start_day",
        "end_day",
        "data_donefile",
        "data_sleep_second",
        "model_save_path",
        "checkpoint_per_pass",
        "save_delta_frequency",
        "save_base_at_day_end",
    }
)


class JobPublic(BaseModel):
    id: str
    name: str
    state: JobState
    spec: JobCreate
    created_at: float
    updated_at: float
    passes_total: int
    passes_done: int
    in_flight: str | None = Field(None, description="the pass handed out, as 'YYYYMMDD/<id>'")
    last_checkpoint: str | None = None
    error: str | None = None


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


class PassPublic(BaseModel):
    day: str
    pass_id: int
    splits: list[str]
    state: PassState
    attempts: int
    resume_from: str | None = Field(None, description="checkpoint the last attempt resumed from")
    predict_auc: float | None = None
    train_auc: float | None = None
    logloss: float | None = None
    best_auc: float | None = None
    samples: int | None = None
    malformed_lines: int | None = None
    seconds: float | None = None
    ranks: int | None = None
    queued_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None


class PassesPublic(BaseModel):
    data: list[PassPublic]
    count: int


TriggerKind = Literal["checkpoint", "export", "shrink"]
ExportMode = Literal["base", "delta", "batch"]


class TriggerCreate(Spec):
    kind: TriggerKind
    mode: ExportMode | None = Field(None, description="export only: base, delta or batch")

    @model_validator(mode="after")
    def _mode(self) -> TriggerCreate:
        if self.kind == "export" and self.mode is None:
            raise ValueError("mode: export needs mode base, delta or batch (got None)")
        if self.kind != "export" and self.mode is not None:
            raise ValueError(f"mode: only export takes a mode (got {self.mode!r} for {self.kind})")
        return self


class TriggerPublic(BaseModel):
    id: str
    kind: TriggerKind
    mode: ExportMode | None = None
    state: TriggerState
    created_at: float
    finished_at: float | None = None
    result: dict[str, Any] | None = None
    error: str | None = None


class TriggersPublic(BaseModel):
    data: list[TriggerPublic]
    count: int


class EventPublic(BaseModel):
    id: str = Field(description="stream id; pass it as `after` to read the next page")
    type: str
    message: str
    ts: float
    data: dict[str, Any]


class EventsPublic(BaseModel):
    data: list[EventPublic]
    next: str | None = Field(None, description="`after` for the next page; None at the end")


class WorkerPublic(BaseModel):
    alive: bool
    heartbeat: dict[str, Any] | None = None
    ttl_s: float | None = None


class ErrorPublic(BaseModel):
    """Body of every error other than 422: what went wrong, a code, the job's state on 409."""

    detail: str
    code: str | None = None
    state: str | None = None


class HealthPublic(BaseModel):
    status: Literal["ok", "unavailable"]
    redis: bool | None = None
