"""The trainer config's sections on where a job runs and what it talks to: the store shards
(``store``), the trainer group (``distributed``, ``resources``), the node-local negative
sampler (``negative_sampling``) and the serving Redis (``online``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import Field, field_validator, model_validator
from streamrec.config import StrictConfig
from streamrec.control.config_bounds import (
    MAX_ENDPOINTS,
    MAX_KEY,
    MAX_RANKS,
    MAX_SAMPLE_SIZE,
    MAX_STORE_TIMEOUT_S,
    MAX_THREADS,
    MIN_KEY,
)
from streamrec.control.feature_schema import FEATURE_NAME, MAX_SLOTS
from streamrec.store_schema import NAMESPACE_PATTERN

#: The saves ``online`` may publish (the serving models: base and delta).
OnlineSave = Literal["base", "delta"]


class StoreFields(StrictConfig):
    """The store fields a REST job's ``store`` section sets (``streamrec.api.models.StoreSpec``
    derives from this class, so each field and bound is written once, here)."""

    #: Shard endpoints in shard order; empty: in-process.
    endpoints: list[str] = Field(default_factory=list, max_length=MAX_ENDPOINTS)
    tier: Literal["host", "ssd", "device"] | None = Field(
        None,
        description=(
            "tier the shards must have been started with (shards own their tier): the trainer "
            "asks every shard and fails the job on a mismatch; None: not checked"
        ),
    )


class StoreConfig(StoreFields):
    """Where the sparse parameters live: in-process (no endpoints) or store shards.

    The shards' peer token is not part of a job: it is a deployment secret, read by the
    trainer's store client from ``$STREAMREC_AUTH_TOKEN_FILE`` (else the per-user file, see
    ``streamrec.auth``), so a REST job cannot make the trainer read a file and send it.
    """

    timeout_s: float = Field(60.0, gt=0, le=MAX_STORE_TIMEOUT_S, strict=True)
    #: The shards' namespace of this job's tables (the control plane sets the job id), so
    #: jobs share no rows; None: the shards' default namespace (their ``--tables``). The
    #: pattern is the store's own (``streamrec.store_schema.NAMESPACE_PATTERN``).
    namespace: str | None = Field(None, pattern=NAMESPACE_PATTERN)
    #: The pooled trainer group's assignment generation (set by the group, never by a job):
    #: sent with the namespace, so a group that lost the job to a newer assignment is refused
    #: by the shards (``streamrec.embedding_store.service.generations``); None: not fenced.
    generation: int | None = Field(None, ge=0, le=2**63 - 1, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "addresses" in data:
            raise ValueError("store.addresses was renamed store.endpoints")
        return data


class ResourcesFields(StrictConfig):
    """The resources fields a REST job's ``resources`` section shares with the trainer
    (``streamrec.api.models.ResourcesSpec`` derives from this class)."""

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


class ResourcesConfig(ResourcesFields):
    """What this trainer group must look like (the REST job's ``resources``)."""

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
    #: Which saves are published. A delta is taken only on the version it was saved after
    #: (the previous base or delta): with "delta" alone, the deltas after the first
    #: unpublished base are refused until a base is published (``export`` mode online).
    modes: list[OnlineSave] = Field(default_factory=lambda: list(get_args(OnlineSave)))

    @field_validator("redis_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"online.redis_url must be a redis:// URL, got {v!r}")
        return v
