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

Every section has defaults, so ``TrainerConfig.parse({})`` is a small valid job.
"""

from __future__ import annotations

import os
from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator
from streamrec.config import StrictConfig
from streamrec.control.feature_schema import (
    FEATURE_NAME,
    MAX_EMBEDDING_DIM,
    MAX_SLOTS,
    FeatureSchema,
    model_problems,
    sampling_problems,
)
from streamrec.layout import parse_day, split_names
from streamrec.store_schema import NAMESPACE_PATTERN

#: criteo and generated: positional TSV (the schema's presets); parquet and slot: by the
#: names of runner.schema (PaddleRec's slot text: ``name:value`` tokens).
DataFormat = Literal["criteo", "generated", "parquet", "slot"]
#: The saves ``online`` may publish (the serving models: base and delta).
OnlineSave = Literal["base", "delta"]
#: ``runner.end_split`` value: end at the last split landed when the run starts.
END_LANDED = "landed"

# Bounds of the numeric settings, used where each field is defined below and by the REST job
# (streamrec.api.models) where it defines the same field, so the two agree. Every number is
# strict (``"30"`` or ``true`` is refused; an int is a float). A bound is what one trainer
# machine can hold or wait for: past it a job fails later, or never ends.
#: Splits per pass: a day of 1-minute splits.
MAX_SPLITS_PER_PASS = 1440
#: Seconds between two looks for a split's donefile.
MAX_SLEEP_S = 3600.0
#: Seconds to wait for a pass's donefiles (a week; None waits forever).
MAX_DATA_WAIT_S = 7 * 86400.0
#: checkpoint_per_pass, save_delta_frequency: a save every N passes.
MAX_EVERY_PASSES = 10_000
#: Rows a batch: parsed, pulled and computed at once (26 slots x dim 16 of 2^20 rows is
#: 1.7 GiB of embeddings, each 512-wide layer 2 GiB of activations).
MAX_BATCH = 1 << 20
#: MiB a parse chunk: held as text and as parsed arrays, one per prefetched batch.
MAX_READ_CHUNK_MB = 1024.0
#: TCP's port range (0: any free port).
MAX_PORT = 65535
#: Width of an MLP layer (a 16384 x 16384 layer is 1 GiB of float32, its optimizer state more).
MAX_LAYER_WIDTH = 16384
#: Layers of an MLP.
MAX_LAYERS = 64
#: Dense learning rate: a larger step diverges with every optimizer here.
MAX_LEARNING_RATE = 100.0
#: Scheduler steps (warmup, decay): 10^12 steps is 30 years at 1000 steps a second.
MAX_STEPS = 10**12
#: A wbce label weight (>= 0: a negative one would invert the loss).
MAX_LOSS_WEIGHT = 1e6
#: numpy's RandomState takes 0 .. 2^32-1, and the top MLP is seeded with seed + 1.
MAX_SEED = 2**32 - 2
#: Seconds a store request waits for a shard (a save of many GiB too): a day, as
#: distributed.checkpoint_timeout_s.
MAX_STORE_TIMEOUT_S = 86400.0
#: Store shards a job lists.
MAX_ENDPOINTS = 1024
#: Ranks of a trainer group.
MAX_RANKS = 1024
#: torch intra-op threads of a rank.
MAX_THREADS = 256
#: 1 positive + negatives a sample.
MAX_SAMPLE_SIZE = 1024
#: Feature ids are 64-bit (PaddleRec's uint64 feasigns kept as int64 bit patterns).
MIN_KEY, MAX_KEY = -(2**63), 2**63 - 1


class OnlineMode(StrEnum):
    """The export mode that publishes to the serving Redis (the REST trigger's ``mode``)."""

    ONLINE = "online"


def parse_dims(value: Any, field: str, min_len: int = 2) -> list[int]:
    """'13-512-256' or [13, 512, 256] -> [13, 512, 256] (the reference's dash format)."""
    if isinstance(value, str):
        parts = value.strip().split("-")
        try:
            dims = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"{field} must look like '13-512-256', got {value!r}") from None
    elif isinstance(value, list | tuple):
        dims = list(value)
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
            raise ValueError(f"{field} must be a list of integers, got {value!r}")
    else:
        raise ValueError(f"{field} must be a dash string or a list, got {value!r}")
    # arch_mlp_bot's input may be 0: a model without dense features (no bottom MLP)
    first = 0 if field == "arch_mlp_bot" else 1
    if len(dims) < min_len or any(d < 1 for d in dims[1:]) or (dims and dims[0] < first):
        raise ValueError(f"{field} needs >= {min_len} positive sizes, got {value!r}")
    if len(dims) > MAX_LAYERS or max(dims) > MAX_LAYER_WIDTH:
        raise ValueError(
            f"{field} may have at most MAX_LAYERS ({MAX_LAYERS}) sizes of at most "
            f"MAX_LAYER_WIDTH ({MAX_LAYER_WIDTH}) each, got {value!r}"
        )
    return dims


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
    #: Where a batch's pull and push run: ``inline`` on the training thread between its
    #: steps, with every intra-op thread; ``thread`` on a thread of their own, beside the
    #: step; ``auto``: inline for a CPU model with its store in-process (on cores the gemms
    #: already fill, a second busy thread only slows them: setup b +14% samples/s in bf16),
    #: else a thread (a GPU step leaves the host idle; a shard's reply is a wait).
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


class ModelConfig(StrictConfig):
    """The DLRM model and dense optimizer (reference DLRM names)."""

    arch_sparse_feature_size: int = Field(16, ge=1, le=MAX_EMBEDDING_DIM, strict=True)
    arch_mlp_bot: list[int] = Field(default_factory=lambda: [13, 512, 256, 64, 16])
    #: Top MLP after its input, which is fitted to the interaction (as the reference does).
    arch_mlp_top: list[int] = Field(default_factory=lambda: [512, 256, 1])
    arch_interaction_op: Literal["dot", "cat"] = "dot"
    arch_interaction_itself: bool = False
    #: Number of sparse features (embedding tables): 26 for Criteo (PaddleRec's name).
    sparse_inputs_slots: int = Field(26, ge=1, le=MAX_SLOTS, strict=True)
    loss_function: Literal["mse", "bce", "wbce"] = "bce"
    #: wbce weights for label 0 and 1, the reference's '1.0-1.0' format.
    loss_weights: list[Annotated[float, Field(ge=0, le=MAX_LOSS_WEIGHT, strict=True)]] = Field(
        default_factory=lambda: [1.0, 1.0]
    )
    loss_threshold: float = Field(0.0, ge=0, lt=1, strict=True)
    #: The online dense normalizer's window: the values a feature's running statistics
    #: hold at most (its decay, as PaddleRec's data_norm's summary_decay_rate; 1e7 values
    #: weigh about the last 1e7 samples). streamrec.trainer.dense_norm.
    dense_norm_window: int = Field(10_000_000, ge=1, le=MAX_STEPS, strict=True)
    #: The dense optimizer and rate. Not the reference's sgd at 0.01: with the default tables
    #: that trails the reference model trained by torch Adagrad (0.05) by 0.010 AUC on the
    #: 26-slot planted stream (0.020 on the 8-slot one). Adagrad at 0.01, not 0.02: on
    #: MovieLens laid out a day a pass, 0.02 lost 0.029 mean predict AUC (0.666 against
    #: 0.695, batch 256), while on the planted stream 0.01 still leads torch's Adagrad
    #: (BENCHMARKS.md, "Defaults on a real stream").
    optimizer: Literal["sgd", "adagrad", "adam"] = "adagrad"
    learning_rate: float = Field(0.01, gt=0, le=MAX_LEARNING_RATE, strict=True)
    lr_num_warmup_steps: int = Field(0, ge=0, le=MAX_STEPS, strict=True)
    lr_decay_start_step: int = Field(0, ge=0, le=MAX_STEPS, strict=True)
    lr_num_decay_steps: int = Field(0, ge=0, le=MAX_STEPS, strict=True)
    #: The reference's mini_batch_size; an alias of runner.train_batch_size.
    mini_batch_size: int | None = Field(None, ge=1, le=MAX_BATCH, strict=True)
    numpy_rand_seed: int = Field(123, ge=0, le=MAX_SEED, strict=True)
    #: The dense model's arithmetic: "bf16" runs the MLPs and the interaction under bf16
    #: autocast (fp32 weights and optimizer state), "fp32" as the reference, "auto" bf16 only
    #: where the hardware runs it fast (a CPU with AMX or AVX512-BF16, a GPU of compute
    #: capability 8.0+; streamrec.trainer.precision). The pass log says which ran.
    precision: Literal["auto", "fp32", "bf16"] = "auto"

    @field_validator("arch_mlp_bot", "arch_mlp_top", mode="before")
    @classmethod
    def _dims(cls, v: Any, info: Any) -> list[int]:
        return parse_dims(v, info.field_name, 2 if info.field_name == "arch_mlp_bot" else 1)

    @field_validator("loss_weights", mode="before")
    @classmethod
    def _weights(cls, v: Any) -> list[float]:
        if isinstance(v, str):
            try:
                v = [float(p) for p in v.split("-")]
            except ValueError:
                raise ValueError(f"loss_weights must look like '1.0-1.0', got {v!r}") from None
        if not (isinstance(v, list | tuple) and len(v) == 2):
            raise ValueError(f"loss_weights needs 2 values (label 0, label 1), got {v!r}")
        return list(v)

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.lr_num_decay_steps > 0 and self.lr_decay_start_step < self.lr_num_warmup_steps:
            raise ValueError(
                f"lr_decay_start_step {self.lr_decay_start_step} is before the end of warmup "
                f"(lr_num_warmup_steps {self.lr_num_warmup_steps}): warmup must finish first"
            )
        return self

    @property
    def dense_dim(self) -> int:
        return self.arch_mlp_bot[0]


class StoreConfig(StrictConfig):
    """Where the sparse parameters live: in-process (no endpoints) or store shards.

    The shards' peer token is not part of a job: it is a deployment secret, read by the
    trainer's store client from ``$STREAMREC_AUTH_TOKEN_FILE`` (else the per-user file, see
    ``streamrec.auth``), so a REST job cannot make the trainer read a file and send it.
    """

    #: Shard endpoints in shard order (the REST job's ``store.endpoints``); empty: in-process.
    endpoints: list[str] = Field(default_factory=list, max_length=MAX_ENDPOINTS)
    #: The tier the shards must serve (they own it: ``--tier`` of each shard); the trainer
    #: asks every shard at start and refuses a mismatch. None: not checked.
    tier: Literal["host", "ssd", "device"] | None = None
    timeout_s: float = Field(60.0, gt=0, le=MAX_STORE_TIMEOUT_S, strict=True)
    #: The shards' namespace of this job's tables (the control plane sets the job id), so
    #: jobs share no rows; None: the shards' default namespace (their ``--tables``). The
    #: pattern is the store's own (``streamrec.store_schema.NAMESPACE_PATTERN``).
    namespace: str | None = Field(None, pattern=NAMESPACE_PATTERN)

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "addresses" in data:
            raise ValueError("store.addresses was renamed store.endpoints")
        return data


class ResourcesConfig(StrictConfig):
    """What this trainer group must look like (the REST job's ``resources``)."""

    #: Ranks (WORLD_SIZE) the job needs; a group of another size refuses it. None: any.
    trainer_ranks: int | None = Field(None, ge=1, le=MAX_RANKS, strict=True)
    #: torch intra-op threads per rank (torch.set_num_threads). None: torch's default (runs
    #: repeat to the last bit). "auto": a single CPU rank times its first steps with torch's
    #: default and with 1 thread and keeps the faster (thread_tuner.py; more threads help big
    #: batches, 1 helps small ones beside a store shard on the same cores).
    threads_per_rank: (
        Annotated[int, Field(ge=1, le=MAX_THREADS, strict=True)] | Literal["auto"] | None
    ) = None


class DistributedConfig(StrictConfig):
    """torch.distributed settings; ranks come from env:// (torchrun or Kubernetes)."""

    backend: Literal["auto", "gloo", "nccl"] = "auto"
    #: How long a collective waits for the other ranks before it raises. A rank that fails
    #: tells the others at once (distributed.exchange_outcomes); this bounds the wait for a
    #: rank gone silent (killed, stuck), so keep it well under a minute.
    timeout_s: float = Field(30.0, gt=0, le=3600, strict=True)
    #: How long the ranks wait for each other at the end of a phase, a checkpoint save or
    #: load above all (rank 0 may write or read many GiB of store shards meanwhile; the
    #: wait is in the group's store, not a collective), and how long the watchdog lets a
    #: save or load run without progress. The rendezvous of a group is torchrun's (``--rdzv-conf
    #: timeout=``, 600 s in ``streamrec up`` and the manifests).
    checkpoint_timeout_s: float = Field(1800.0, gt=0, le=86400, strict=True)


class NegativeSamplingConfig(StrictConfig):
    """Negative sampling through the node-local sampler (RecIS); see negsampling.py.

    The item-side features (what a negative replaces) are named by slot in a job without a
    schema (``item_slot``, ``item_slots``, ``category_slot``: table columns ``slot_<k>``) and
    by feature name in a schema job (``item_features``, ``category_feature``: table columns
    of those names); each kind of job refuses the other's (feature_schema.py).
    """

    enabled: bool = False
    #: Parquet negative table, loaded by local rank 0 (LOCAL_RANK) at start.
    table_path: str | None = None
    reload: bool = True
    item_slot: int = Field(0, ge=0, lt=MAX_SLOTS, strict=True)
    category_slot: int | None = Field(None, ge=0, lt=MAX_SLOTS, strict=True)
    #: More item-side slots taken from the negative table (columns slot_<k>).
    item_slots: list[Annotated[int, Field(ge=0, lt=MAX_SLOTS, strict=True)]] = Field(
        default_factory=list, max_length=MAX_SLOTS
    )
    #: A schema job's item-side features, the first the item id (the sampler's dedup_tag:
    #: one id a row), the others packed from the negative table (lists allowed); empty:
    #: the schema's first sparse feature (what item_slot 0 is to a job without one).
    item_features: list[Annotated[str, Field(pattern=FEATURE_NAME)]] = Field(
        default_factory=list, max_length=MAX_SLOTS
    )
    #: A schema job's category feature (the sampler's sample_tag, one id a row; packed from
    #: the table too); None: the table's ``category`` column, not a feature.
    category_feature: str | None = Field(None, pattern=FEATURE_NAME)
    #: 1 positive + (sample_size - 1) negatives, the seed's name.
    sample_size: int = Field(2, ge=2, le=MAX_SAMPLE_SIZE, strict=True)
    weight_tag: str = "weight"
    skey_name: str = "skey"
    put_back: bool = True
    #: Item for positives missing from the table; None: the sampler's MISSING_ITEM_ID (the
    #: seed's murmurhash(0)), read where the sampler is (this module stays torch-free).
    default_value: int | None = Field(None, ge=MIN_KEY, le=MAX_KEY, strict=True)
    #: Keep only label-1 rows as positives (a stream of clicks); False samples for every row.
    positives_only: bool = True
    endpoint: str | None = None
    auto_start: bool = True

    @model_validator(mode="after")
    def _check(self) -> NegativeSamplingConfig:
        if self.enabled and self.reload and not self.table_path:
            raise ValueError(
                "negative_sampling.enabled needs table_path (or reload: false "
                "with a table already loaded in the sampler)"
            )
        return self


class OnlineConfig(StrictConfig):
    """Online serving: base and delta saves also published to Redis (``online.py``).

    Every base (end of day) and delta save the trainer writes is read back from its files
    and written through the embedding store's ``RedisConverter`` (a base replaces the
    table, a delta updates it), then ``{prefix}:version`` is bumped for readers to watch.
    """

    #: The serving Redis (``redis://host:port/db``); None: nothing is published.
    redis_url: str | None = None
    #: Prefix of every key written (the converter's key layout, see the trainer README).
    prefix: str = Field("streamrec:emb", min_length=1, max_length=200)
    #: Which saves are published.
    modes: list[OnlineSave] = Field(default_factory=lambda: list(get_args(OnlineSave)))

    @field_validator("redis_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"online.redis_url must be a redis:// URL, got {v!r}")
        return v


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
