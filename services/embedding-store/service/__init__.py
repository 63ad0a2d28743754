"""The store as a sharded service over ZeroMQ.

- shard side: ``server`` (:class:`Shard`: store + handlers + RPC + metrics), ``handlers``
  (:class:`StoreService`: the wire ops and their checks), ``namespaces`` (one store per job),
  ``incarnation`` (restarts), ``config`` (a shard's settings), ``metrics``.
- client side: ``client`` (:class:`EmbeddingStoreClient`), ``routing`` (key -> shard,
  splitting and reassembling), ``shard_link`` (a socket per shard and thread), ``stats`` (the
  shards' statistics summed), ``local_shards`` (N shard processes for tests and benchmarks).
"""
