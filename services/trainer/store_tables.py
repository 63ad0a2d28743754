"""The trainer's embedding store: one table per sparse slot, in-process or the store service.

``store.endpoints`` empty: an in-process ``EmbeddingStore`` (this rank only), in host memory,
or in GPU memory with ``store.tier: device`` (the trainer then pulls rows as CUDA tensors,
see :class:`~streamrec.trainer.sparse.SparseTables`); otherwise an ``EmbeddingStoreClient`` of
those shards, which every rank shares, in the job's own namespace of them (``store.namespace``,
the job id: its tables are made there, so it starts from fresh rows and shares none with
another job). The shards own their tier (``--tier`` when each was started); ``store.tier``
set, every shard is asked for it at start and a mismatch is a :class:`ConfigError` naming the
shard, before any pass runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamrec.control.trainer_config import TrainerConfig
from streamrec.trainer.errors import ConfigError

if TYPE_CHECKING:
    from streamrec.embedding_store import SparseStore, TableOptions

#: The sparse rule of every column: ``torch.optim.Adagrad``'s step (TorchAdaGradSGDRule, the
#: accumulator from 0 and taking the gradient before the step), so a key's first step is the
#: rate whatever the size of its gradient. PaddleRec's StdAdaGradSGDRule (0.05, initial_g2sum
#: 3) steps first by plain SGD on the gradient: a word of a mean-pooled bag of 20 gets a
#: twentieth of it and a rare key barely moves (Rotten Tomatoes' bags of words: 0.7522 against
#: 0.8242 here; BENCHMARKS.md, "Quality on real data sets"). The rate 0.03 is the best on the
#: four real data sets together (0.05: flights -0.0034) and keeps the planted stream
#: (0.8526 against 0.8530) (tests/trainer/test_table_defaults.py).
DEFAULT_RULE: dict[str, Any] = {
    "name": "TorchAdaGradSGDRule",
    "learning_rate": 0.03,
}

#: Table options the trainer uses unless ``table_parameters`` says otherwise: a plain
#: embedding table (every row trained from the start), :data:`DEFAULT_RULE` on every column,
#: small init (uniform +-0.005, about the reference's +-sqrt(1 / rows) for 40k-row tables),
#: rows kept by the shrink until unseen for a month.
DEFAULT_TABLE_PARAMETERS: dict[str, Any] = {
    "embedx_threshold": 0,
    # the day-end shrink deletes rows unseen for delete_after_unseen_days (30) only, not
    # rows scoring under PaddleRec's 0.8: on MovieLens that deleted most rows made each day
    # (0.004 mean predict AUC); a large stream sets 0.8 back to bound its tables
    "delete_threshold": 0.0,
    "initializer": {"type": "uniform", "low": -0.005, "high": 0.005},
    "embed_sgd_param": dict(DEFAULT_RULE),
    "embedx_sgd_param": dict(DEFAULT_RULE),
}


def build_table_options(config: TrainerConfig) -> list[TableOptions]:
    """One ``TableOptions`` per table (``slot_<k>``), at its dim: the schema's ``dim`` of
    the feature owning it, else arch_sparse_feature_size (``TrainerConfig.slot_dims``)."""
    from streamrec.embedding_store import TableOptions

    params = dict(DEFAULT_TABLE_PARAMETERS, **config.table_parameters)
    for bad in ("name", "dim", "embedx_dim"):
        if bad in config.table_parameters:
            raise ConfigError(
                f"table_parameters.{bad} is set by the trainer (one table per slot, dim = "
                f"the schema's dim of its feature, else arch_sparse_feature_size = "
                f"{config.hyper_parameters.arch_sparse_feature_size}); got "
                f"{config.table_parameters[bad]!r}"
            )
    dims = dict(zip(config.slot_tables, config.slot_dims, strict=True))
    return [
        TableOptions.parse(
            dict(params, name=name, dim=dims[name]), source=f"table_parameters (table {name})"
        )
        for name in config.table_names
    ]


def make_store(config: TrainerConfig, tables: list[TableOptions]) -> SparseStore:
    """The store ``config.store`` names, with ``tables``; its tier checked (:func:`check_tier`).

    The caller owns it (``close()``). Both stores are checked against ``SparseStore`` here
    (mypy).
    """
    sc = config.store
    store: SparseStore
    if sc.endpoints:
        from streamrec.embedding_store import EmbeddingStoreClient

        store = EmbeddingStoreClient(
            sc.endpoints,
            tables,
            timeout_s=sc.timeout_s,
            namespace=sc.namespace,
            generation=sc.generation,
        )
    else:
        from streamrec.embedding_store import EmbeddingStore
        from streamrec.errors import StreamRecError

        # in-process: host memory, or every row on this node's GPU (tier device); the store
        # is this job's alone, so store.namespace has nothing to keep apart here
        tier = "device" if sc.tier == "device" else "host"
        try:
            store = EmbeddingStore(tables, tier=tier, seed=config.hyper_parameters.numpy_rand_seed)
        except StreamRecError as exc:
            raise ConfigError(f"store.tier is 'device' with the store in-process: {exc}") from exc
    try:
        check_tier(store, sc.tier, sc.endpoints)
    except BaseException:
        store.close()
        raise
    return store


def check_tier(
    store: SparseStore, expected: str | None, endpoints: list[str] | None = None
) -> None:
    """Raises ConfigError unless every shard of ``store`` serves tier ``expected``.

    Args:
        store: an ``EmbeddingStore`` (one tier) or an ``EmbeddingStoreClient`` (its shards').
        expected: the tier the job needs; None checks nothing.
        endpoints: the shards' endpoints, to name the one that differs.
    """
    if expected is None:
        return
    stats = store.stats()
    tiers = [s.get("tier") for s in stats["shards"]] if "shards" in stats else [stats["tier"]]
    for k, tier in enumerate(tiers):
        if tier != expected:
            where = (
                f"shard {k} ({endpoints[k]})"
                if endpoints and k < len(endpoints)
                else "the in-process store"
            )
            raise ConfigError(
                f"store.tier is {expected!r} but {where} serves tier {tier!r} (shards own "
                f"their tier: start them with --tier {expected}, or change store.tier)"
            )
