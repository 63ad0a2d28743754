"""Errors of the trainer, under the shared :mod:`streamrec.errors` hierarchy."""

from __future__ import annotations

from streamrec.errors import BadRequest, StreamRecError


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
    trainer refuses to write into it (:mod:`.model_owner`); the agent reports it ``fatal``."""

    code = "model_path_taken"


class CheckpointError(TrainerError):
    """A checkpoint or exported model is missing, incomplete or inconsistent."""

    code = "bad_checkpoint"


class OnlinePublishError(TrainerError):
    """The serving Redis (``online.redis_url``) refused or could not be reached while a save
    was published; the message names the URL (password hidden) and the save, written."""

    code = "online_publish_failed"


class GroupError(TrainerError):
    """Another rank of the group failed the step this rank was in (its message quoted):
    every rank stops the step together instead of waiting in a collective."""

    code = "group_error"


class PassFailed(TrainerError):
    """A pass failed on at least one rank; raised on every rank of the group alike.

    Args:
        kind: ``"data"`` (a split's content is bad: a retry cannot pass) or ``"transient"``
            (disk, network, a peer: a retry from the last checkpoint may).
        bad_splits: the splits a data error was found in.
        phase: ``"train"`` (predicting or training) or ``"save"`` (the saves due after the
            pass: the control plane counts those as checkpoint failures).
    """

    code = "pass_failed"

    def __init__(
        self, message: str, kind: str, bad_splits: tuple[str, ...] = (), phase: str = "train"
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.bad_splits = bad_splits
        self.phase = phase


class BadSplits(PassFailed, DataError):
    """A pass failed on bad data (``kind`` "data"): still a :class:`DataError`, naming the
    file and line, with the splits it was found in (``bad_splits``)."""

    code = "bad_data"


class LineageLost(StreamRecError):
    """The model lacks passes the job counts done, and no checkpoint holds them."""

    code = "lineage_lost"


#: What an error that lost the job's state says of itself (a shard restarted empty, a model
#: without the passes before the one it was given).
STORE_LOST = ("ShardRestarted", "UnknownNamespace", "LineageLost")
#: What an unreachable service says of itself (a shard or the sampler down or restarting,
#: or a sampler that refuses the peer token: started by someone else).
UNREACHABLE = ("RpcTimeout", "ServiceUnavailable", "SamplerUnavailable", "SamplerRefused")


def error_class(exc: BaseException) -> str:
    """What kind of failure a pass had, for the control plane: ``data`` (the pass's own:
    ``data.on_bad_split``), ``store_lost`` (a shard lost the job's rows: the job goes back
    to a consistent start), ``infra`` (a shard or the sampler unreachable: a restart with
    backoff, no failed attempt) or ``transient`` (retried once from the checkpoint). Ranks
    quote each other's errors by type name, so the text is read too."""
    if isinstance(exc, PassFailed) and exc.kind == "data":
        return "data"
    for kind, names in (("store_lost", STORE_LOST), ("infra", UNREACHABLE)):
        chain: BaseException | None = exc
        while chain is not None:
            if type(chain).__name__ in names or any(f"{n}:" in str(chain) for n in names):
                return kind
            chain = chain.__cause__
    return "transient"
