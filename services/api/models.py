"""REST request bodies: ``JobCreate`` (a job spec) and ``TriggerCreate``; what the API returns
(``JobPublic`` one, ``JobsPublic`` a page, ...) is in :mod:`streamrec.api.public`.

The job spec keeps PaddleRec's knob names (``train_data_dir``, ``split_interval``,
``split_per_pass``, ``checkpoint_per_pass``, ``data_donefile``, ``data_sleep_second``,
``model_save_path``), the same as the trainer's config, so a PaddleRec user finds them where
they expect. Every field does what it names or is refused: :meth:`JobCreate.trainer_config`
carries each one to the trainer (:data:`JOB_OWNED`), which checks what only it can see (its
world size, the shards' tier).

Every number has bounds where its field is defined (a field the trainer's config defines too
takes its ``MAX_*`` from :mod:`streamrec.control.trainer_config`, so the two agree) and is
strict: ``"30"``, ``true`` or ``3.0`` for an int is a 422 naming the field; a JSON int is a
float.
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from streamrec.control.channel import CommandType
from streamrec.control.feature_schema import FeatureSchema
from streamrec.control.trainer_config import (
    END_LANDED,
    MAX_ENDPOINTS,
    MAX_EVERY_PASSES,
    MAX_RANKS,
    MAX_SAMPLE_SIZE,
    MAX_SLEEP_S,
    MAX_SPLITS_PER_PASS,
    MAX_THREADS,
    OnlineMode,
)
from streamrec.layout import (
    count_passes,
    day_count,
    iter_passes,
    landed_end,
    parse_day,
    passes_per_day,
    split_names,
)
from streamrec.save_modes import SaveMode

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_FILE_NAME = r"^[A-Za-z0-9_.-]{1,128}$"
_ENDPOINT = r"^(tcp://[A-Za-z0-9_.\-\[\]:]+:\d{1,5}|ipc://[^\s]{1,200})$"


#: Validation context of a spec read back from Redis: names renamed since it was stored are
#: carried over instead of refused (a REST body with an old name is a 422 naming the new one).
STORED: dict[str, Any] = {"stored": True}


#: Longest span of a job, start_day..end_day inclusive (ten years of daily data).
MAX_JOB_DAYS = 3660
#: Most passes in a job (days x passes a day): the scheduler keeps the job's plan in memory
#: (about 0.2 KB a pass); a year of 5-minute passes is 105,120.
MAX_JOB_PASSES = 200_000


def plain_json(value: Any, where: str) -> None:
    """Refuses what JSON text can carry but no field can use, naming the field: a NaN or an
    infinity (Python's JSON parser accepts them), a NUL byte (no path or name holds one) and
    a lone surrogate (``"\\ud800"``: not UTF-8, so Redis could not store it).

    Walks dicts (keys too) and lists, so a free-form section is checked to the leaf.
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: {value!r} is not a finite number")
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"{where}: a NUL byte is not allowed")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{where}: not valid UTF-8 text (a lone surrogate)") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            plain_json(k, f"{where} key")
            plain_json(v, f"{where}.{k}" if isinstance(k, str) else where)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            plain_json(v, f"{where}[{i}]")


class Spec(BaseModel):
    """Base of the request models: unknown fields are errors (422 naming them), and so are
    non-finite floats, NUL bytes and lone surrogates anywhere (:func:`plain_json`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _plain(cls, v: Any, info: ValidationInfo) -> Any:
        plain_json(v, info.field_name or "value")
        return v


def _stored(info: ValidationInfo) -> bool:
    """Whether a spec is read back from Redis (limits added since it was stored not applied)."""
    return bool(info.context and info.context.get("stored"))


def _renamed(
    data: Any, info: ValidationInfo, section: str, names: dict[str, str]
) -> dict[str, Any] | Any:
    """Carries ``names`` (old -> new) over in a stored spec; refuses them in a request."""
    if not isinstance(data, dict):
        return data
    stored = bool(info.context and info.context.get("stored"))
    for old, new in names.items():
        if old not in data:
            continue
        if not stored:
            raise ValueError(f"{section}.{old} was renamed {section}.{new}")
        data = {new: data[old], **{k: v for k, v in data.items() if k != old}}
    return data


class DataSpec(Spec):
    """Where the streaming data lands and how it is cut into passes (PaddleRec names, the
    same as the trainer's ``runner`` section)."""

    # ``schema`` is the JSON name of ``feature_schema`` (BaseModel has a ``schema``)
    model_config = ConfigDict(
        validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )

    train_data_dir: str = Field(
        min_length=1,
        max_length=4096,
        description="root of YYYYMMDD/HHMM/ splits, under a data root",
    )
    start_day: str = Field(pattern=r"^\d{8}$", examples=["20190720"])
    end_day: str = Field(pattern=r"^\d{8}$", examples=["20190721"])
    split_interval: int = Field(5, ge=1, le=1440, strict=True, description="minutes per split")
    split_per_pass: int = Field(
        1, ge=1, le=MAX_SPLITS_PER_PASS, strict=True, description="splits per pass"
    )
    data_donefile: str | None = Field(
        "to.hadoop.done", pattern=_FILE_NAME, description="a split is ready when this file exists"
    )
    data_sleep_second: float = Field(1.0, gt=0, le=MAX_SLEEP_S, strict=True)
    data_format: Literal["generated", "criteo", "parquet", "slot"] = Field(
        "generated",
        description=(
            "generated (streamrec-datagen) or criteo text (positional), parquet or slot "
            "(PaddleRec's name:value text) read by data.schema"
        ),
    )
    end_split: str | None = Field(
        None,
        examples=["0025"],
        description=(
            "the split of end_day (HHMM) the job ends with: the pass holding it keeps only "
            "the splits up to it, and the job succeeds after it; 'landed': the last split "
            "landed (in order, up to end_day) when the job is created, stored as that day "
            "and HHMM; None: end_day's last split"
        ),
    )
    feature_schema: FeatureSchema | None = Field(
        None,
        alias="schema",
        description=(
            "the data's features by name: label, dense [names or {name, log1p}], sparse "
            "[{name, dim?, pooling: sum|mean, table?}] (streamrec.control.feature_schema); "
            "None: the format's preset (13 dense, model.hyper_parameters.sparse_inputs_slots "
            "one-key features). Checked against the model at create: a 422 naming the field"
        ),
    )
    on_bad_split: Literal["fail", "skip"] = Field(
        "fail",
        description=(
            "a pass whose data is bad (DataError: too many malformed lines, unreadable): fail "
            "the job at once (a retry cannot pass), or skip the bad split (the pass is trained "
            "again from the last checkpoint without it; listed in skipped_splits and an event)"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any, info: ValidationInfo) -> Any:
        data = _renamed(data, info, "data", DATA_RENAMED)
        if isinstance(data, dict) and data.get("data_format") == "streamrec":
            if not (info.context and info.context.get("stored")):
                raise ValueError("data.data_format 'streamrec' was renamed 'generated'")
            data = dict(data, data_format="generated")
        return data

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

    @field_validator("end_split")
    @classmethod
    def _end_split(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None or v == END_LANDED:
            return v
        interval = info.data.get("split_interval")
        if interval is not None and v not in split_names(interval):
            raise ValueError(
                f"end_split {v!r} is not a split of the day at split_interval {interval} "
                f"(HHMM, a multiple of {interval} minutes)"
            )
        return v

    @field_validator("end_day")
    @classmethod
    def _span(cls, v: str, info: ValidationInfo) -> str:
        start = info.data.get("start_day")
        if start is None or _stored(info) or v < start:
            return v  # a bad start_day is its own error; the order is checked below
        days = day_count(start, v)
        if days > MAX_JOB_DAYS:
            raise ValueError(
                f"start_day {start} to end_day {v} is {days} days, more than MAX_JOB_DAYS "
                f"({MAX_JOB_DAYS}): split the stream into several jobs"
            )
        return v

    @field_validator("split_per_pass")
    @classmethod
    def _bounded(cls, v: int, info: ValidationInfo) -> int:
        d = info.data
        if _stored(info) or not {"start_day", "end_day", "split_interval"} <= d.keys():
            return v
        if d["end_day"] < d["start_day"]:
            return v
        n = count_passes(d["start_day"], d["end_day"], d["split_interval"], v)
        if n > MAX_JOB_PASSES:
            per_day = passes_per_day(d["split_interval"], v)
            raise ValueError(
                f"the job would have {n} passes ({n // per_day} days x {per_day} a day), more "
                f"than MAX_JOB_PASSES ({MAX_JOB_PASSES}): raise split_per_pass or "
                f"split_interval, or end the job earlier (end_day)"
            )
        return v

    def landed_end(self) -> tuple[str, str] | None:
        """(day, HHMM) of the last split landed under train_data_dir, walking the job's
        splits in order up to the first one without its donefile (None: none has)."""
        plan = iter_passes(self.start_day, self.end_day, self.split_interval, 1)
        return landed_end(self.train_data_dir, plan, self.data_donefile)

    @model_validator(mode="after")
    def _order(self) -> DataSpec:
        if self.data_format in ("parquet", "slot") and self.feature_schema is None:
            raise ValueError(
                f"data_format {self.data_format!r} reads features by name: it needs "
                f"data.schema (label, dense, sparse)"
            )
        if self.end_day < self.start_day:
            raise ValueError(f"end_day {self.end_day!r} is before start_day {self.start_day!r}")
        return self


class CheckpointSpec(Spec):
    """Checkpoint and export policy (PaddleRec: checkpoints per pass, base/delta/batch models)."""

    model_save_path: str = Field(
        min_length=1, max_length=4096, description="model root; under a configured model root"
    )
    checkpoint_per_pass: int = Field(
        1,
        ge=1,
        le=MAX_EVERY_PASSES,
        strict=True,
        description="a full checkpoint every N passes (a job is resumed from one: not 0)",
    )
    save_delta_frequency: int = Field(
        0,
        ge=0,
        le=MAX_EVERY_PASSES,
        strict=True,
        description="a delta model every N passes (0: none)",
    )
    save_base_at_day_end: bool = Field(
        True, description="shrink, then base and batch models after the last pass of a day"
    )


class SamplerSpec(Spec):
    """Negative sampling (RecIS): ``neg_num`` negatives per positive from the sampler.

    Becomes the trainer's ``negative_sampling`` section (``enabled``, ``sample_size =
    neg_num + 1``, ``endpoint``); the negative table comes from
    ``model.negative_sampling.table_path``.
    """

    endpoint: str | None = Field(
        None,
        pattern=_ENDPOINT,
        description=(
            "the node-local sampler; None: STREAMREC_SAMPLER_ENDPOINT or the per-user socket "
            "(started on demand). Only with neg_num > 0"
        ),
    )
    neg_num: int = Field(
        0,
        ge=0,
        le=MAX_SAMPLE_SIZE - 1,
        strict=True,
        description="negatives per positive (0: none)",
    )

    @model_validator(mode="after")
    def _endpoint_needs_negatives(self) -> SamplerSpec:
        if self.endpoint is not None and self.neg_num == 0:
            raise ValueError(
                f"endpoint {self.endpoint!r} is set but neg_num is 0 (no negatives are "
                f"sampled): set neg_num > 0 or remove endpoint"
            )
        return self


class StoreSpec(Spec):
    """The embedding store: shard endpoints (empty: in-process) and its table options."""

    endpoints: list[str] = Field(default_factory=list, max_length=MAX_ENDPOINTS)
    tier: Literal["host", "ssd", "device"] | None = Field(
        None,
        description=(
            "tier the shards must have been started with (shards own their tier): the trainer "
            "asks every shard and fails the job on a mismatch; None: not checked"
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

    @model_validator(mode="after")
    def _in_process_is_host(self) -> StoreSpec:
        if not self.endpoints and self.tier not in (None, "host"):
            raise ValueError(
                f"tier {self.tier!r} needs endpoints: without them the trainer keeps the "
                f"store in-process, in host memory"
            )
        return self


class ResourcesSpec(Spec):
    """What the trainer group that takes the job must look like."""

    trainer_ranks: int | None = Field(
        None,
        ge=1,
        le=MAX_RANKS,
        strict=True,
        description=(
            "ranks (WORLD_SIZE) of the trainer group; a group of another size fails the job. "
            "None: any"
        ),
    )
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="cuda: the dense model on a GPU, ranks joined with nccl"
    )
    threads_per_rank: int | None = Field(
        None,
        ge=1,
        le=MAX_THREADS,
        strict=True,
        description="torch intra-op threads of each rank; None: torch's",
    )
    restart_budget: int | None = Field(
        None,
        ge=0,
        le=10_000,  # the API's own restart_budget bound
        strict=True,
        description=(
            "infrastructure restarts of the trainer group (a process killed, evicted, "
            "OOM-killed or stuck) allowed in a row without a pass done before the job fails; "
            "None: the API's restart_budget"
        ),
    )
    restart_backoff_s: float | None = Field(
        None,
        ge=0,
        le=3600,  # the API's own restart_backoff_s bound
        strict=True,
        description=(
            "wait before handing a pass out again after the first restart, doubled after each "
            "further one in a row (up to the API's restart_backoff_max_s); None: the API's"
        ),
    )


class JobCreate(Spec):
    """A job: a model trained pass by pass over one stream of days."""

    name: str = Field(pattern=_NAME, examples=["ctr-demo"])
    data: DataSpec
    checkpoint: CheckpointSpec
    model: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "trainer settings (streamrec.control.trainer_config.TrainerConfig fields); what "
            "the job's "
            "other sections set (data, checkpoint, sampler, store, resources) may not be set here"
        ),
    )
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    store: StoreSpec = Field(default_factory=StoreSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)

    def trainer_config(self) -> dict[str, Any]:
        """The trainer config (``streamrec.control.trainer_config.TrainerConfig``) of the job.

        ``model`` gives the sections; every field of :data:`JOB_OWNED` is written over it from
        the job's own sections; the job's table options are merged over ``model``'s.
        """
        cfg = copy.deepcopy(self.model)
        d, c, smp, st, res = self.data, self.checkpoint, self.sampler, self.store, self.resources
        owned: dict[str, dict[str, Any]] = {
            "runner": {
                "train_data_dir": d.train_data_dir,
                "data_format": d.data_format,
                "schema": (
                    None if d.feature_schema is None else d.feature_schema.model_dump(mode="json")
                ),
                "split_interval": d.split_interval,
                "split_per_pass": d.split_per_pass,
                "start_day": d.start_day,
                "end_day": d.end_day,
                "end_split": d.end_split,
                "data_donefile": d.data_donefile,
                "data_sleep_second": d.data_sleep_second,
                "model_save_path": c.model_save_path,
                "checkpoint_per_pass": c.checkpoint_per_pass,
                "save_delta_frequency": c.save_delta_frequency,
                "save_base_at_day_end": c.save_base_at_day_end,
            },
            "store": {"endpoints": list(st.endpoints), "tier": st.tier},
            "negative_sampling": {
                "enabled": smp.neg_num > 0,
                "sample_size": smp.neg_num + 1 if smp.neg_num > 0 else 2,
                "endpoint": smp.endpoint,
            },
            "resources": {
                "trainer_ranks": res.trainer_ranks,
                "threads_per_rank": res.threads_per_rank,
            },
        }
        for section, values in owned.items():
            cfg[section] = {**(cfg.get(section) or {}), **values}
        if st.table_parameters:
            cfg["table_parameters"] = {**(cfg.get("table_parameters") or {}), **st.table_parameters}
        if res.device == "cuda":
            cfg["distributed"] = {**(cfg.get("distributed") or {}), "backend": "nccl"}
        return cfg

    @field_validator("model")
    @classmethod
    def _no_shadowing(cls, model: dict[str, Any]) -> dict[str, Any]:
        for section in sorted({s for s, _ in JOB_OWNED}):
            values = model.get(section) or {}
            if not isinstance(values, dict):
                raise ValueError(f"model.{section} must be a mapping, got {type(values).__name__}")
            for name in sorted(values):
                if (section, name) in JOB_OWNED:
                    raise ValueError(
                        f"model.{section}.{name} is set by the job's {JOB_OWNED[section, name]}; "
                        f"remove it (got {values[name]!r})"
                    )
        return model


#: REST names renamed to the trainer's (old -> new), refused with a message naming the new one.
DATA_RENAMED = {"data_root": "train_data_dir", "format": "data_format"}

#: Trainer config fields the job spec owns, (section, field) -> the job field that sets them;
#: ``model`` may not set them.
JOB_OWNED: dict[tuple[str, str], str] = {
    **{
        ("runner", f): f"data.{f}"
        for f in (
            "train_data_dir",
            "data_format",
            "split_interval",
            "split_per_pass",
            "start_day",
            "end_day",
            "end_split",
            "data_donefile",
            "data_sleep_second",
        )
    },
    ("runner", "reader_type"): "data.data_format",
    ("runner", "schema"): "data.schema",
    ("runner", "feature_schema"): "data.schema",
    **{
        ("runner", f): f"checkpoint.{f}"
        for f in (
            "model_save_path",
            "checkpoint_per_pass",
            "save_delta_frequency",
            "save_base_at_day_end",
        )
    },
    ("store", "endpoints"): "store.endpoints",
    ("store", "tier"): "store.tier",
    ("store", "namespace"): "the job id (each job's tables are its own in the store)",
    ("negative_sampling", "enabled"): "sampler.neg_num",
    ("negative_sampling", "sample_size"): "sampler.neg_num",
    ("negative_sampling", "endpoint"): "sampler.endpoint",
    ("resources", "trainer_ranks"): "resources.trainer_ranks",
    ("resources", "threads_per_rank"): "resources.threads_per_rank",
}


def stored_spec(raw: str) -> JobCreate:
    """A job spec read back from Redis (names renamed since it was stored carried over)."""
    return JobCreate.model_validate_json(raw, context=STORED)


TriggerKind = Literal[CommandType.CHECKPOINT, CommandType.EXPORT, CommandType.SHRINK]
#: The save modes an export writes (a checkpoint is its own trigger kind); ``online``: a base
#: published to the job's serving Redis (its trainer config's ``online.redis_url``).
ExportMode = Literal[SaveMode.BASE, SaveMode.DELTA, SaveMode.BATCH, OnlineMode.ONLINE]


class TriggerCreate(Spec):
    kind: TriggerKind
    mode: ExportMode | None = Field(
        None, description="export only: base, delta, batch or online (to the serving Redis)"
    )

    @model_validator(mode="after")
    def _mode(self) -> TriggerCreate:
        if self.kind == CommandType.EXPORT and self.mode is None:
            raise ValueError("mode: export needs mode base, delta, batch or online (got None)")
        if self.kind != CommandType.EXPORT and self.mode is not None:
            raise ValueError(f"mode: only export takes a mode (got {self.mode!r} for {self.kind})")
        return self
