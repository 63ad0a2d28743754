"""One embedding-store shard served over ZeroMQ: store, handlers, RPC server and metrics.

:class:`Shard` wires an in-process :class:`~streamrec.embedding_store.EmbeddingStore` (built
from a :class:`~streamrec.embedding_store.service.config.ShardConfig`), its request handlers
(:class:`~streamrec.embedding_store.service.handlers.StoreService`, where the ops are described), a
:class:`~streamrec.wire.RpcServer` and, optionally, the Prometheus endpoint.
``streamrec-embedding-store serve`` (``__main__``) runs one;
:class:`~streamrec.embedding_store.LocalShards` runs N as processes on this machine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamrec.embedding_store.service.config import ShardConfig
from streamrec.embedding_store.service.handlers import StoreService
from streamrec.embedding_store.service.metrics import StoreMetrics
from streamrec.embedding_store.service.namespaces import DEFAULT_NAMESPACE, Namespaces
from streamrec.embedding_store.service.saves import ShardSaves
from streamrec.store_schema import TableOptions
from streamrec.wire import RpcServer

if TYPE_CHECKING:
    from streamrec.embedding_store.store import EmbeddingStore

__all__ = ["Shard", "build_store"]


def build_store(
    config: ShardConfig,
    namespace: str = DEFAULT_NAMESPACE,
    tables: list[TableOptions] | None = None,
) -> EmbeddingStore:
    """The in-process store of one namespace of a shard (``tables`` None: the config's)."""
    from streamrec.embedding_store.store import EmbeddingStore

    return EmbeddingStore(
        list(config.tables) if tables is None else tables,
        tier=config.tier,
        persistent_path=config.shard_persistent_path(namespace),
        cache_budget_mb=config.cache_budget_mb,
        gpu_cache_budget_mb=config.gpu_cache_budget_mb,
        gpu_cache_device=config.device or "cuda",
        device=config.device if config.tier == "device" else None,
        capacity=config.capacity,
        seed=config.seed,
        num_threads=config.num_threads,
    )


class Shard:
    """A running shard: store, handlers, RPC server and (optionally) the metrics endpoint.

    Args:
        config: the shard's settings (tables, tier, endpoint, workers, metrics port).
        store: the store to serve; None builds one from ``config``.
    """

    def __init__(self, config: ShardConfig, store: EmbeddingStore | None = None) -> None:
        self.config = config
        self.store = store if store is not None else build_store(config)
        self.namespaces = Namespaces(
            self.store, lambda ns, tables: build_store(config, ns, tables), config.max_namespaces
        )
        label = f"{config.shard_id}-of-{config.num_shards}"
        self.metrics = StoreMetrics(self.namespaces.stats, label, self.namespaces.dropped_rows)
        self.service = StoreService(
            self.store,
            config.shard_id,
            config.num_shards,
            self.metrics,
            saves=ShardSaves(
                config.shard_id,
                config.num_shards,
                self.metrics,
                redis_url=config.redis_url,
                redis_prefix=config.redis_prefix,
                model_roots=config.model_roots,
            ),
            namespaces=self.namespaces,
        )
        self.server = RpcServer(
            config.endpoint,
            self.service.handlers(),
            workers=config.workers,
            max_message_bytes=config.max_message_bytes,
            on_request=self.service.on_request,
            token=config.auth_token(),
        )
        self.metrics_port: int | None = None

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def start(self) -> Shard:
        if self.config.metrics_port is not None:
            self.metrics_port = self.metrics.serve(
                self.config.metrics_port, self.config.metrics_host
            )
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()
        self.namespaces.close()
