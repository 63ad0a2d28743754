"""The trainer config's ``runner`` section (PaddleRec's online runner names).

:class:`DataFields` (where the stream lands, how it is cut into passes) and
:class:`CheckpointFields` (when the runner saves) are the fields a REST job's ``data`` and
``checkpoint`` sections set (``streamrec.api.models`` derives from them);
:class:`RunnerConfig` adds the rest.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from streamrec.config import StrictConfig
from streamrec.control.config_bounds import (
    MAX_BATCH,
    MAX_DATA_WAIT_S,
    MAX_EVERY_PASSES,
    MAX_PORT,
    MAX_READ_CHUNK_MB,
    MAX_SLEEP_S,
    MAX_SPLITS_PER_PASS,
)
from streamrec.control.feature_schema import FeatureSchema
from streamrec.layout import parse_day, split_names

#: criteo and generated: positional TSV (the schema's presets); parquet and slot: by the
#: names of runner.schema (PaddleRec's slot text: ``name:value`` tokens).
DataFormat = Literal["criteo", "generated", "parquet", "slot"]
#: ``runner.end_split`` value: end at the last split landed when the run starts.
END_LANDED = "landed"

#: Day names (YYYYMMDD).
Day = Annotated[str, Field(pattern=r"^\d{8}$", examples=["20190720"])]
#: A directory of the job (data root, model root): a path, bounded.
JobPath = Annotated[str, Field(min_length=1, max_length=4096)]
#: A donefile's name: one file name, never a path.
FILE_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,128}$"


class DataFields(StrictConfig):
    """Where the stream lands and how it is cut into passes: the runner's fields a REST job's
    ``data`` section sets (PaddleRec names). ``streamrec.api.models.DataSpec`` derives from
    this class, so each field, bound and check is written once, here."""

    # ``schema`` is the YAML/JSON name of ``feature_schema`` (pydantic's BaseModel has a
    # ``schema`` attribute); dumps use it too
    model_config = ConfigDict(
        validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )

    train_data_dir: JobPath = Field(
        "data", description="root of YYYYMMDD/HHMM/ splits, under a data root"
    )
    start_day: Day = "20190720"
    end_day: Day = "20190720"
    data_format: DataFormat = Field(
        "generated",
        description=(
            "generated (streamrec-datagen) or criteo text (positional), parquet or slot "
            "(PaddleRec's name:value text) read by data.schema"
        ),
    )
    #: The job's features by name (feature_schema.py); None: the format's preset (13 dense,
    #: sparse_inputs_slots one-key features).
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
    split_interval: int = Field(5, ge=1, le=1440, strict=True, description="minutes per split")
    split_per_pass: int = Field(
        1, ge=1, le=MAX_SPLITS_PER_PASS, strict=True, description="splits per pass"
    )
    #: Where the run ends: a split of end_day (HHMM; the pass holding it keeps only the
    #: splits up to it), "landed" (the last split, up to end_day, that has landed when the
    #: run starts: a bounded run over the data there is), or None (end_day's last split).
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
    data_donefile: str | None = Field(
        "to.hadoop.done",
        pattern=FILE_NAME_PATTERN,
        description="a split is ready when this file exists",
    )
    data_sleep_second: float = Field(1.0, gt=0, le=MAX_SLEEP_S, strict=True)

    @field_validator("start_day", "end_day", mode="before")
    @classmethod
    def _day(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):  # YAML reads 20190720 as an int
            v = str(v)
        if isinstance(v, str):
            parse_day(v)
        return v

    @field_validator("split_interval")
    @classmethod
    def _interval(cls, v: int) -> int:
        split_names(v)
        return v

    @field_validator("end_split", mode="before")
    @classmethod
    def _end_split(cls, v: Any) -> str | None:
        if v is None or v == END_LANDED:
            return v
        if not isinstance(v, str):  # YAML reads 0025 unquoted as octal 21: refuse numbers
            raise ValueError(
                f"end_split must be a quoted HHMM string (e.g. '0025'), {END_LANDED!r} or "
                f"null, got the number {v!r}"
            )
        if not (len(v) == 4 and v.isdigit()):
            raise ValueError(f"end_split must be HHMM (e.g. '0025') or {END_LANDED!r}, got {v!r}")
        return v

    @model_validator(mode="after")
    def _check_data(self) -> DataFields:
        if self.data_format in ("parquet", "slot") and self.feature_schema is None:
            raise ValueError(
                f"data_format {self.data_format!r} reads features by name: it needs "
                f"data.schema (a trainer config's runner.schema): label, dense, sparse"
            )
        if parse_day(self.end_day) < parse_day(self.start_day):
            raise ValueError(f"end_day {self.end_day!r} is before start_day {self.start_day!r}")
        if self.end_split not in (None, END_LANDED) and self.end_split not in split_names(
            self.split_interval
        ):
            raise ValueError(
                f"end_split {self.end_split!r} is not a split of the day at split_interval "
                f"{self.split_interval} (HHMM, a multiple of {self.split_interval} minutes)"
            )
        return self


class CheckpointFields(StrictConfig):
    """When the runner saves (PaddleRec names): the fields a REST job's ``checkpoint`` section
    sets (``streamrec.api.models.CheckpointSpec`` derives from this class)."""

    model_save_path: JobPath = Field(
        "output_model", description="model root; under a configured model root"
    )
    #: A full checkpoint every N passes (0: none, a run nothing resumes: tests, benchmarks;
    #: a REST job needs one: its CheckpointSpec refuses 0).
    checkpoint_per_pass: int = Field(
        1,
        ge=0,
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


class RunnerConfig(DataFields, CheckpointFields):
    """The streaming runner (PaddleRec names): the data and checkpoint fields, and the rest."""

    #: PaddleRec's reader name; here an alias of data_format (criteo | generated).
    reader_type: DataFormat | None = None
    #: Give up waiting for a pass's donefiles after this many seconds (None: wait forever).
    data_wait_timeout_second: float | None = Field(None, gt=0, le=MAX_DATA_WAIT_S, strict=True)
    #: Samples a step; "auto" (the default): each pass's batch follows the rows a rank has in
    #: it, about 64 steps a pass, a power of two in 32..2048 (streamrec.trainer.batch_rule:
    #: a pass must give each rank many steps, a large one full ones). A number: that batch.
    train_batch_size: Annotated[int, Field(ge=1, le=MAX_BATCH, strict=True)] | Literal["auto"] = (
        "auto"
    )
    #: A pass whose share of malformed lines exceeds this fails (DataError naming a line).
    max_malformed_ratio: float = Field(0.01, ge=0, le=1, strict=True)
    #: Parsed batches buffered ahead of compute by the prefetch thread.
    prefetch_batches: int = Field(4, ge=1, le=64, strict=True)
    #: Bytes read per parse chunk (whole lines; files are parsed chunk by chunk).
    read_chunk_mb: float = Field(16.0, gt=0, le=MAX_READ_CHUNK_MB, strict=True)
    #: PaddleRec's flag: sparse gradients of the mean batch loss are multiplied by the batch
    #: size before the push (per-sample gradients, what the store's AdaGrad rules expect).
    scale_sparse_gradient_with_batch_size: bool = True
    #: Pull batch i+1 while batch i computes (its rows are then one push older); False pulls
    #: after the previous push (no staleness, no overlap).
    sparse_pipeline: bool = True
    #: How the ranks' pushes of a step reach the store. ``arrival``: each rank pushes as
    #: soon as its step is done, beside the next step's compute, and a shard applies two
    #: ranks' updates of a row in the order they come (PaddleRec's parameter server): a run
    #: of several ranks does not repeat bit for bit, and a fault's replay of a pass takes
    #: another path than the first time. ``rank``: ranks push one after another in rank
    #: order and pull the next batch after every push (no overlap, no pipelining): a run,
    #: and a run with faults and restarts, repeats bit for bit. One rank: the same.
    sparse_push_order: Literal["arrival", "rank"] = "arrival"
    #: Where a batch's pull and push run: ``inline`` on the training thread between its
    #: steps, with every intra-op thread; ``thread`` on a thread of their own, beside the
    #: step; ``auto``: inline for a CPU model with its store in-process (on cores the gemms
    #: already fill, a second busy thread only slows them), else a thread (a GPU step leaves
    #: the host idle; a shard's reply is a wait). Figures: BENCHMARKS.md, the trainer's part.
    sparse_worker: Literal["auto", "inline", "thread"] = "auto"
    #: Threads that run one batch's per-table store pulls/pushes side by side (0: 1 for an
    #: in-process store, up to 8 for the store service, whose calls wait on round trips).
    sparse_threads: int = Field(0, ge=0, le=64, strict=True)
    #: Whether the predict phase runs before training (the honest online AUC).
    predict_before_train: bool = True
    #: Prometheus /metrics of local rank r on this port + r (0: any free port, None: none);
    #: the API also refuses one whose ranks' ports take a port of the stack (spec_checks).
    metrics_port: int | None = Field(None, ge=0, le=MAX_PORT, strict=True)
    #: Address /metrics binds (0.0.0.0 in a container).
    metrics_host: str = "127.0.0.1"
    #: Where the dense model trains: "cuda" (a CUDA GPU; refused at start where torch sees
    #: none), "cpu", or "auto" (cuda where torch sees a GPU, else cpu). The sparse rows stay
    #: in the store; on cuda each batch goes to the GPU through pinned host buffers
    #: (streamrec.trainer.staging). A REST job's model.device is an alias.
    device: Literal["auto", "cpu", "cuda"] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _alias(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("reader_type") is not None:
            fmt = data.get("data_format")
            if fmt is not None and fmt != data["reader_type"]:
                raise ValueError(
                    f"reader_type {data['reader_type']!r} contradicts data_format {fmt!r}"
                )
            data = dict(data, data_format=data["reader_type"])
        return data
