"""Errors of the trainer, under the shared :mod:`streamrec.errors` hierarchy."""

from __future__ import annotations

import errno

from streamrec.control.reports import ErrorClass, Phase
from streamrec.embedding_store import ShardRestarted
from streamrec.errors import BadRequest, RpcTimeout, ServiceUnavailable, StreamRecError
from streamrec.errors import CheckpointError as CheckpointError  # the shared one, re-exported


class TrainerError(StreamRecError):
    """Base of the trainer's own errors."""

    code = "trainer_error"


class ConfigError(BadRequest):
    """A trainer configuration value is invalid; the message names the field and value."""

    code = "bad_config"


class ModelShapeError(BadRequest):
    """The DLRM architecture is inconsistent (the reference's dimension checks)."""

    code = "bad_model_shape"


class DataError(BadRequest):
    """A data file cannot be used: too many malformed lines, unreadable, wrong columns.

    The message names the file and, where known, the first bad line (1-based).
    """

    code = "bad_data"


class ModelDirTaken(BadRequest):
    """The model directory belongs to another job (its owner file or a manifest says so): a
    trainer refuses to write into it (:mod:`streamrec.trainer.model.model_owner`); the agent
    reports it ``fatal``."""

    code = "model_path_taken"


class OnlinePublishError(TrainerError):
    """The serving Redis (``online.redis_url``) refused or could not be reached while a save
    was published; the message names the URL (password hidden) and the save, written."""

    code = "online_publish_failed"


class ServingOutOfStep(OnlinePublishError):
    """The serving Redis refused a delta: it does not hold the version the delta applies on
    (the trainer went back to an older checkpoint, or a publish failed half-way). The
    trainer publishes a base of the model as it is now instead (``online.publish_save``)."""

    code = "serving_out_of_step"


class GroupError(TrainerError):
    """Another rank of the group failed the step this rank was in (its message quoted):
    every rank stops the step together instead of waiting in a collective.

    Args:
        error_class: the failed ranks' class (exchanged with the outcomes, never read from
            the quoted text).
    """

    code = "group_error"

    def __init__(self, message: str, error_class: ErrorClass | str = ErrorClass.TRANSIENT) -> None:
        super().__init__(message)
        self.error_class = ErrorClass(error_class)


class PassFailed(TrainerError):
    """A pass failed on at least one rank; raised on every rank of the group alike.

    Args:
        kind: the failed ranks' :class:`ErrorClass`: ``data`` (a split's content is bad: a
            retry cannot pass), ``store_lost``, ``infra`` or ``transient`` (disk, network, a
            peer: a retry from the last checkpoint may).
        bad_splits: the splits a data error was found in.
        phase: ``"train"`` (predicting or training) or ``"save"`` (the saves due after the
            pass: the control plane counts those as checkpoint failures).
    """

    code = "pass_failed"

    def __init__(
        self,
        message: str,
        kind: ErrorClass | str,
        bad_splits: tuple[str, ...] = (),
        phase: Phase | str = Phase.TRAIN,
    ) -> None:
        super().__init__(message)
        self.kind = ErrorClass(kind)
        self.bad_splits = bad_splits
        self.phase = Phase(phase)


class BadSplits(PassFailed, DataError):
    """A pass failed on bad data (``kind`` "data"): still a :class:`DataError`, naming the
    file and line, with the splits it was found in (``bad_splits``)."""

    code = "bad_data"


class LineageLost(StreamRecError):
    """The model lacks passes the job counts done, and no checkpoint holds them."""

    code = "lineage_lost"


#: Errors that lost the job's state (a shard restarted empty, a namespace it no longer holds,
#: a model without the passes before the one it was given).
STORE_LOST: tuple[type[BaseException], ...] = (ShardRestarted, LineageLost)
#: Errors of an unreachable service (a shard or the sampler down or restarting, or a sampler
#: that refuses the peer token: started by someone else).
UNREACHABLE: tuple[type[BaseException], ...] = (RpcTimeout, ServiceUnavailable)
#: errnos of a full disk or quota (the model directory's filesystem, or a shard's).
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
#: The store's error code for a save into a full disk (``embedding_store.disk``).
DISK_FULL_CODE = "no_space"


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a full disk: the disk's state, not the pass's, so ``infra`` (a
    restart with backoff and budget, no failed attempt): the job goes on once space is
    freed instead of failing on its second full save."""
    if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
        return True
    return getattr(exc, "code", None) == DISK_FULL_CODE


#: The classes from the most to the least telling: a group's class is its failed ranks' first.
PRECEDENCE = (ErrorClass.DATA, ErrorClass.STORE_LOST, ErrorClass.INFRA, ErrorClass.TRANSIENT)


def own_class(exc: BaseException) -> ErrorClass:
    """The class of one exception by its type (its causes not looked at)."""
    if isinstance(exc, PassFailed):
        return exc.kind
    if isinstance(exc, GroupError):
        return exc.error_class
    if isinstance(exc, STORE_LOST):
        return ErrorClass.STORE_LOST
    if isinstance(exc, UNREACHABLE) or disk_full(exc):
        return ErrorClass.INFRA
    return ErrorClass.TRANSIENT


def first_class(classes: list[ErrorClass]) -> ErrorClass:
    """The most telling of ``classes`` (:data:`PRECEDENCE`; none: ``transient``)."""
    return next((c for c in PRECEDENCE if c in classes), ErrorClass.TRANSIENT)


def error_class(exc: BaseException) -> ErrorClass:
    """What kind of failure a pass had, for the control plane, from the types of ``exc``
    and its causes: ``data`` (the pass's own: ``data.on_bad_split``), ``store_lost`` (a
    shard lost the job's rows: the job goes back to a consistent start), ``infra`` (a shard
    or the sampler unreachable, a full disk: a restart with backoff, no failed attempt) or
    ``transient``
    (retried once from the checkpoint). Other ranks' failures arrive as a
    :class:`PassFailed` or :class:`GroupError` carrying their class."""
    found = []
    chain: BaseException | None = exc
    while chain is not None:
        found.append(own_class(chain))
        chain = chain.__cause__
    return first_class(found)
