"""Errors of the embedding store, each with a wire ``code`` (see :mod:`streamrec.errors`)."""

from __future__ import annotations

from streamrec.errors import BadRequest, NotFound, StreamRecError
from streamrec.errors import CheckpointError as CheckpointError  # the shared one, re-exported


class EmbeddingStoreError(StreamRecError):
    """Base of the embedding store's own errors."""

    code = "embedding_store_error"


class UnknownTable(NotFound):
    """A table name the store does not hold."""

    code = "unknown_table"


class InvalidInput(BadRequest):
    """Keys, gradients, shows or clicks of the wrong dtype, shape or value."""

    code = "invalid_input"


class NonFiniteGradient(InvalidInput):
    """A push carried NaN or Inf; nothing of that push was written."""

    code = "non_finite_gradient"


class TierUnavailable(EmbeddingStoreError):
    """The requested storage tier cannot run here (the device tier without CUDA)."""

    code = "tier_unavailable"


class CapacityExceeded(EmbeddingStoreError):
    """A table would grow beyond its ``capacity``; nothing of that call was written."""

    code = "capacity_exceeded"


class NoSpace(EmbeddingStoreError, OSError):
    """A save ran out of disk space (or quota); the message names the path and the bytes
    left. Nothing of the save stays on disk, and saves to that filesystem back off. An
    ``OSError`` still, for in-process callers that handle disk errors as such."""

    code = "no_space"


class PathExists(BadRequest):
    """A path a save needs as a directory is taken by something else (a file)."""

    code = "exists"


class WrongShard(BadRequest):
    """A shard got keys that hash to another shard."""

    code = "wrong_shard"


class ShardCountMismatch(BadRequest):
    """A checkpoint saved by M shards is loaded into N."""

    code = "shard_mismatch"


class StoreClosed(EmbeddingStoreError):
    """The store was closed."""

    code = "store_closed"


class ShardRestarted(EmbeddingStoreError):
    """A shard answered from another process than the one the client trained against (it
    was restarted, empty, at the same address): its rows are gone. Data ops are refused until
    the job reloads its last checkpoint (``EmbeddingStoreClient.load``) or accepts the shards
    as they are (``accept_restarts``); see :mod:`~streamrec.embedding_store.service.incarnation`."""

    code = "shard_restarted"


class UnknownNamespace(ShardRestarted):
    """A namespace the shard does not hold: it was dropped, or the shard restarted empty
    (a job's tables live in its own namespace, see
    :mod:`~streamrec.embedding_store.service.namespaces`). Either way the job's rows are gone there,
    so it is a :class:`ShardRestarted`: the same recovery (reload a checkpoint, which makes
    the namespace's tables again, or ``accept_restarts``)."""

    code = "unknown_namespace"


class StaleGeneration(EmbeddingStoreError):
    """A request of a trainer group's generation older than the newest its namespace has
    seen: the group lost its job to a newer assignment, nothing was done
    (:mod:`~streamrec.embedding_store.service.generations`)."""

    code = "stale_generation"


class TableConflict(BadRequest):
    """``create_tables`` named a table its namespace already holds with other options."""

    code = "table_conflict"


class VersionConflict(CheckpointError):
    """A delta refused because it does not apply on the version loaded or served: applied
    twice, out of order, or after a base it does not follow. The message names the delta's
    ``model_version`` and ``applies_on`` and the version held
    (:mod:`~streamrec.embedding_store.persistence.versions`)."""

    code = "version_conflict"
