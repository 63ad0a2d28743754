"""Configuration of one embedding-store shard process (the service, not the tables).

The tables themselves are :class:`~streamrec.store_schema.TableOptions`, read from
a YAML or JSON file that holds either a list of tables or a mapping with a ``tables`` list::

    tables:
      - name: user
        dim: 9                  # 1 embed + 8 embedx
        embedx_threshold: 10
        embed_sgd_param: {name: adagrad, learning_rate: 0.05}
      - name: item
        dim: 17

Every shard of one store reads the same tables file; shard ``K`` of ``N`` serves only the keys
with ``streamrec.keyhash.shard_of(key, N) == K``. These tables are the default namespace's; a
shard may start with none and serve only the namespaces its clients create
(:mod:`~streamrec.embedding_store.service.namespaces`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, model_validator
from streamrec.config import StrictConfig
from streamrec.embedding_store.persistence.manifests import shard_dir_name
from streamrec.embedding_store.service.namespaces import DEFAULT_NAMESPACE, MAX_NAMESPACES
from streamrec.errors import BadRequest
from streamrec.store_schema import DEVICE_PATTERN, TableOptions, check_tier_options


class ShardConfig(StrictConfig):
    """One shard process: where it listens, which part of the key space it owns, its tier.

    ``persistent_path`` (ssd tier) is the root shared by all shards; each shard keeps its
    files under ``persistent_path/shard-K-of-N`` (OneEmbedding's per-rank sub-directory).
    """

    shard_id: int = Field(ge=0, description="this shard's index K in [0, num_shards)")
    num_shards: int = Field(ge=1, description="N, the number of shards of the store")
    endpoint: str = Field(
        min_length=1, description="ZeroMQ bind address, e.g. tcp://127.0.0.1:5555"
    )
    tables: list[TableOptions] = Field(
        default_factory=list, description="the default namespace's tables (may be none)"
    )
    max_namespaces: int = Field(
        default=MAX_NAMESPACES, ge=0, le=4096, description="namespaces held besides the default"
    )
    tier: Literal["host", "ssd", "device"] = "host"
    persistent_path: str | None = None
    cache_budget_mb: float | None = Field(
        default=None, gt=0, description="RAM cache of each ssd table, MiB"
    )
    gpu_cache_budget_mb: float | None = Field(
        default=None, gt=0, description="GPU cache of each host or ssd table's hot rows, MiB"
    )
    device: str | None = Field(
        default=None,
        pattern=DEVICE_PATTERN,
        description="tier device's or the GPU cache's device (None: the current CUDA device; "
        "'cpu': the CPU build of the kernels, for tests)",
    )
    capacity: int | None = Field(default=None, gt=0)
    seed: int = 0
    num_threads: int | None = Field(default=None, ge=1)
    workers: int = Field(default=2, ge=1, le=64, description="RPC worker threads")
    max_message_bytes: int = Field(default=1 << 30, ge=1 << 16)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    redis_url: str | None = Field(
        default=None, description="where base/delta saves with converter 'redis' go"
    )
    redis_prefix: str = Field(default="streamrec:emb", min_length=1)
    model_roots: list[str] = Field(
        default_factory=list,
        description="save/load paths must lie under one of these (none: save/load refused)",
    )
    auth_token_file: str | None = Field(
        default=None,
        description="peer token file (default: $STREAMREC_AUTH_TOKEN_FILE, else per-user)",
    )
    insecure_no_auth: bool = Field(
        default=False, description="serve requests without a token (local development only)"
    )

    @model_validator(mode="after")
    def _check(self) -> ShardConfig:
        if self.shard_id >= self.num_shards:
            raise ValueError(
                f"shard_id must be < num_shards, got shard_id={self.shard_id} "
                f"num_shards={self.num_shards}"
            )
        check_tier_options(self)
        if self.device is not None and self.tier != "device" and self.gpu_cache_budget_mb is None:
            raise ValueError(
                f"device {self.device!r} places the rows of tier 'device' or of the GPU cache; "
                f"tier is {self.tier!r} and gpu_cache_budget_mb is not set"
            )
        names = [t.name for t in self.tables]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate table names: {dupes}")
        return self

    def auth_token(self) -> str | None:
        """The token requests must carry; None with ``insecure_no_auth`` (no check)."""
        if self.insecure_no_auth:
            return None
        from streamrec.auth import load_token

        return load_token(self.auth_token_file)

    def shard_persistent_path(self, namespace: str = DEFAULT_NAMESPACE) -> str | None:
        """This shard's own directory under ``persistent_path`` (None without one):
        ``shard-K-of-N`` for the default namespace, ``namespace-<name>/shard-K-of-N`` for
        another (beside the shard directories, so no table name can collide with it)."""
        if self.persistent_path is None:
            return None
        root = Path(self.persistent_path)
        if namespace != DEFAULT_NAMESPACE:
            root = root / f"namespace-{namespace}"
        return str(root / shard_dir_name(self.shard_id, self.num_shards))


def read_tables_file(path: str | Path) -> list[dict[str, Any]]:
    """Reads a tables file (``.yaml``/``.yml``/``.json``) into plain table dicts.

    Raises:
        BadRequest: naming the file and what is wrong with it.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise BadRequest(f"tables file {str(p)!r}: cannot read: {exc}") from exc
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise BadRequest(f"tables file {str(p)!r}: not valid {p.suffix or 'YAML'}: {exc}") from exc
    if isinstance(data, dict) and set(data) == {"tables"}:
        data = data["tables"]
    if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
        raise BadRequest(
            f"tables file {str(p)!r}: expected a list of tables or {{tables: [...]}}, "
            f"got {type(data).__name__}"
        )
    return data
