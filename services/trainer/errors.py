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


class CheckpointError(TrainerError):
    """A checkpoint or exported model is missing, incomplete or inconsistent."""

    code = "bad_checkpoint"
