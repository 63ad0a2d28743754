"""The field names of a job's hash (``keys.job``) and of a pass record (``keys.pass_record``),
in one place: the API's repository writes them, the API and the trainers' channel read them.

Every value is a string; times are unix seconds (``"1764270000.123"``), counts decimal, lists
JSON. A field missing from an older record reads as its empty value.
"""

from __future__ import annotations

from enum import StrEnum


class JobField(StrEnum):
    """A field of a job's hash."""

    ID = "id"
    NAME = "name"
    #: the job as created (JobCreate JSON), paths resolved
    SPEC = "spec"
    #: the trainer config the job implies (JSON), fixed at create or first start
    TRAINER_CONFIG = "trainer_config"
    STATE = "state"
    CREATED_AT = "created_at"
    UPDATED_AT = "updated_at"
    STARTED_AT = "started_at"
    PASSES_TOTAL = "passes_total"
    PASSES_DONE = "passes_done"
    #: plan index of the next pass to hand out
    CURSOR = "cursor"
    #: key of the pass handed out and not yet done ("": none)
    IN_FLIGHT = "in_flight"
    LAST_CHECKPOINT = "last_checkpoint"
    ERROR = "error"
    #: the split the next pass waits for ("": none)
    WAITING_FOR = "waiting_for"
    #: how the job stands with the trainer pool (assigned, pinned, waiting_for_trainers)
    TRAINERS = "trainers"
    GROUP = "group"
    LAST_GROUP = "last_group"
    #: infrastructure restarts in a row, and in all
    RESTARTS = "restarts"
    RESTARTS_TOTAL = "restarts_total"
    #: no hand-out before this time (backoff after an infrastructure restart)
    NOT_BEFORE = "not_before"


class PassField(StrEnum):
    """A field of a pass record."""

    DAY = "day"
    PASS_ID = "pass_id"
    SPLITS = "splits"
    STATE = "state"
    #: the attempt handed out last, and the last attempt retired (requeued or failed)
    ATTEMPTS = "attempts"
    RETIRED = "retired"
    FAILURES = "failures"
    SKIPPED_SPLITS = "skipped_splits"
    RESUME_FROM = "resume_from"
    QUEUED_AT = "queued_at"
    STARTED_AT = "started_at"
    FINISHED_AT = "finished_at"
    ROLLED_BACK_AT = "rolled_back_at"
    RANKS = "ranks"
    ERROR = "error"
    PREDICT_AUC = "predict_auc"
    TRAIN_AUC = "train_auc"
    LOGLOSS = "logloss"
    BEST_AUC = "best_auc"
    SAMPLES = "samples"
    MALFORMED_LINES = "malformed_lines"
    SECONDS = "seconds"


#: The figures a trainer reports for a pass (its ``pass_done`` record) kept in its record.
PASS_METRICS = (
    PassField.PREDICT_AUC,
    PassField.TRAIN_AUC,
    PassField.LOGLOSS,
    PassField.BEST_AUC,
    PassField.SAMPLES,
    PassField.MALFORMED_LINES,
    PassField.SECONDS,
)
