"""REST request bodies: ``JobCreate`` (a job spec) and ``TriggerCreate``; what the API returns
(``JobPublic`` one, ``JobsPublic`` a page, ...) is in :mod:`streamrec.api.public`.

The job spec keeps PaddleRec's knob names (``train_data_dir``, ``split_interval``,
``split_per_pass``, ``checkpoint_per_pass``, ``data_donefile``, ``data_sleep_second``,
``model_save_path``), the same as the trainer's config, so a PaddleRec user finds them where
they expect. Every field does what it names or is refused: :meth:`JobCreate.trainer_config`
carries each one to the trainer (:data:`JOB_OWNED`), which checks what only it can see (its
world size, the shards' tier).

Every number has bounds where its field is defined (a field the trainer's config defines too
takes its ``MAX_*`` from :mod:`streamrec.control.config_bounds`, so the two agree) and is
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
from streamrec.control.config_bounds import (
    MAX_EVERY_PASSES,
    MAX_SAMPLE_SIZE,
    MAX_THREADS,
)
from streamrec.control.runner_config import CheckpointFields, DataFields, Day, JobPath
from streamrec.control.runtime_config import ResourcesFields, StoreFields
from streamrec.control.trainer_config import OnlineMode
from streamrec.layout import (
    count_passes,
    day_count,
    iter_passes,
    landed_end,
    passes_per_day,
)
from streamrec.save_modes import SaveMode

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
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


def _described(fields: type[BaseModel], name: str) -> str | None:
    """The description of a field the job spec takes over from the trainer's config (a
    field made required here keeps its text)."""
    return fields.model_fields[name].description


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


class DataSpec(Spec, DataFields):
    """Where the streaming data lands and how it is cut into passes: the trainer's own
    ``runner`` fields (:class:`~streamrec.control.runner_config.DataFields`, their bounds and
    checks), of which a job must name the data directory and its days, and the job's own
    limits (its span, its pass count) and bad-data policy."""

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )

    # required in a job (the runner's defaults are for a config file's small runs)
    train_data_dir: JobPath = Field(description=_described(DataFields, "train_data_dir"))
    start_day: Day
    end_day: Day
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
        d = info.data  # the days and split_interval come before split_per_pass (DataFields)
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


class CheckpointSpec(Spec, CheckpointFields):
    """Checkpoint and export policy (PaddleRec: checkpoints per pass, base/delta/batch
    models): the trainer's own fields (:class:`~streamrec.control.runner_config.
    CheckpointFields`); a job names its model root and resumes from checkpoints, so it needs
    one every N >= 1 passes."""

    model_save_path: JobPath = Field(description=_described(CheckpointFields, "model_save_path"))
    # narrowed: 0 (no checkpoint) is for the runner's own runs, a job must be resumable
    checkpoint_per_pass: int = Field(
        1,
        ge=1,
        le=MAX_EVERY_PASSES,
        strict=True,
        description=_described(CheckpointFields, "checkpoint_per_pass"),
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


class StoreSpec(Spec, StoreFields):
    """The embedding store: shard endpoints (empty: in-process) and its table options."""

    # the trainer's own fields (endpoints, tier: StoreFields), then the job's
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


class ResourcesSpec(Spec, ResourcesFields):
    """What the trainer group that takes the job must look like."""

    # the trainer's trainer_ranks (ResourcesFields), then the job's own fields
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="cuda: the dense model on a GPU, ranks joined with nccl"
    )
    # narrowed: the trainer's ResourcesConfig also takes "auto" (a REST job does not, yet)
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
            # the runner's fields the job's data and checkpoint sections take over, by name
            "runner": {
                **d.model_dump(mode="json", include=set(DataFields.model_fields)),
                **c.model_dump(mode="json", include=set(CheckpointFields.model_fields)),
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
        ("runner", f.alias or name): f"data.{f.alias or name}"
        for name, f in DataFields.model_fields.items()
    },
    ("runner", "feature_schema"): "data.schema",
    ("runner", "reader_type"): "data.data_format",
    **{("runner", name): f"checkpoint.{name}" for name in CheckpointFields.model_fields},
    ("store", "endpoints"): "store.endpoints",
    ("store", "tier"): "store.tier",
    ("store", "namespace"): "the job id (each job's tables are its own in the store)",
    ("store", "generation"): "trainer group that runs it (its pool assignment's generation)",
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
