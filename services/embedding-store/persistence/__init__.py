"""Saves and loads of a store's tables: checkpoints, batch, base and delta models.

- ``save_load``: ``save_store``/``load_store`` (the directory layout, crash safety).
- ``manifests``: a save's manifests, parts (``shard-K-of-N``), checksums and checks.
- ``reshard``: a save of M shards loaded into shard K of N, streaming.
- ``converters`` and ``redis_converter``: where base/delta rows go (files, a serving Redis).
- ``tables``: :class:`TablesOnTiers`, what a save or a load needs of a store.

Persistence reads and writes tables through :class:`~streamrec.embedding_store.tiers.
table_tier.TableTier` only and imports nothing of the service (import contract
``store-layers``).
"""
