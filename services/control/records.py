"""A job's hash (``keys.job``), a pass record (``keys.pass_record``) and a trigger
(``keys.trigger``): their field names in one place (:class:`JobField`, :class:`PassField`;
a trigger's are its record's) and one codec each (:class:`JobRecord`, :class:`PassRecord`,
:class:`TriggerRecord`, modelled on rq's ``Job.to_dict``/``Job.restore``). The API's
repository writes them, the API and the trainers' channel read them.

Every value is a string; times are unix seconds (``"1764270000.123"``), counts decimal,
other figures their ``repr``, flags ``"true"`` or ``"false"``, lists JSON, "" for none. A
field missing from an older record reads as its empty value. Reading a record is one
``from_fields`` of its HGETALL; an update writes the fields of :meth:`PassRecord.patch` (the
typed values it is given)::

    PassRecord.from_fields(redis.hgetall(key)).attempts
    redis.hset(key, mapping=PassRecord.patch(state=PassState.RUNNING, ranks=4))
    # {"state": "running", "ranks": "4"}
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Self

from streamrec.control import codec
from streamrec.control.commands import CommandType
from streamrec.control.states import JobState, PassState, TriggerState


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
    #: the collapse figures (the trainer's ``evaluation.collapse_figures``)
    PREDICT_TOP_SHARE = "predict_top_share"
    PREDICT_COLLAPSED = "predict_collapsed"
    TRAIN_TOP_SHARE = "train_top_share"
    TRAIN_COLLAPSED = "train_collapsed"
    PREDICTIONS_COLLAPSED = "predictions_collapsed"
    #: the training batch the pass ran
    BATCH_SIZE = "batch_size"


#: The figures a trainer reports for a pass (its ``pass_done`` record) kept in its record.
PASS_METRICS = (
    PassField.PREDICT_AUC,
    PassField.TRAIN_AUC,
    PassField.LOGLOSS,
    PassField.BEST_AUC,
    PassField.SAMPLES,
    PassField.MALFORMED_LINES,
    PassField.SECONDS,
    PassField.PREDICT_TOP_SHARE,
    PassField.PREDICT_COLLAPSED,
    PassField.TRAIN_TOP_SHARE,
    PassField.TRAIN_COLLAPSED,
    PassField.PREDICTIONS_COLLAPSED,
    PassField.BATCH_SIZE,
)


def pass_figures(record: Mapping[str, Any]) -> dict[PassField, int | float]:
    """The :data:`PASS_METRICS` of a trainer's pass record that its pass record keeps: each
    one of its field's kind (a flag ``true`` or ``false``, any other figure a number), the
    others (absent, None, a value of another kind: a newer or older trainer's) left out."""
    return {
        name: value
        for name in PASS_METRICS
        if (value := record.get(name)) is not None
        and (
            isinstance(value, bool)
            if name in _FLAGS
            else isinstance(value, int | float) and not isinstance(value, bool)
        )
    }


def _time() -> Any:
    """A time field (unix seconds, written with 3 decimals), None when not set."""
    return field(default=None, metadata=codec.TIME)


class HashRecord:
    """A record dataclass kept as one Redis hash, a field each: its codec."""

    #: what errors call the record ("pass record")
    RECORD: ClassVar[str]

    def to_fields(self) -> dict[str, str]:
        """The whole record as hash fields (None as "")."""
        return codec.to_text(self)

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        """The record of a hash; ContractError names a field that does not parse."""
        return codec.from_text(cls, fields, cls.RECORD)

    @classmethod
    def patch(cls, **values: Any) -> dict[str, str]:
        """The hash fields that set ``values`` (typed, by field name) and leave the others:
        an update's HSET. TypeError for a name that is no field, ContractError for a value
        of the wrong type."""
        return codec.to_text(cls(**values), values)


@dataclass(frozen=True)
class PassRecord(HashRecord):
    """A pass record, every :class:`PassField` typed (an absent one: its empty value)."""

    RECORD: ClassVar[str] = "pass record"

    day: str = ""
    pass_id: int = 0
    splits: tuple[str, ...] = ()
    state: PassState | None = None
    #: the attempt handed out last (0: never handed out), the last attempt retired
    attempts: int = 0
    retired: int = 0
    #: attempts that failed (a pass re-handed by a rewind is no failure)
    failures: int = 0
    skipped_splits: tuple[str, ...] = ()
    #: the checkpoint the last attempt was told to load
    resume_from: str | None = None
    queued_at: float | None = _time()
    started_at: float | None = _time()
    finished_at: float | None = _time()
    rolled_back_at: float | None = _time()
    ranks: int | None = None
    error: str | None = None
    predict_auc: float | None = None
    train_auc: float | None = None
    logloss: float | None = None
    best_auc: float | None = None
    samples: int | None = None
    malformed_lines: int | None = None
    seconds: float | None = None
    #: the largest share of the phase's rows at one probability, and whether its predictions
    #: collapsed; ``predictions_collapsed``: the pass's verdict (a stalled model)
    predict_top_share: float | None = None
    predict_collapsed: bool | None = None
    train_top_share: float | None = None
    train_collapsed: bool | None = None
    predictions_collapsed: bool | None = None
    #: the training batch the pass ran (``train_batch_size``, or the one ``auto`` chose)
    batch_size: int | None = None


@dataclass(frozen=True)
class JobRecord(HashRecord):
    """A job's hash, every :class:`JobField` typed (an absent one: its empty value).

    ``spec`` and ``trainer_config`` stay the JSON text they were written as: the spec is the
    API's ``JobCreate`` (a model this package cannot import: it lies above it) and the
    trainer config is read by the trainers as a plain dict; kept as text, neither is ever
    re-serialised, so a record read and written back is the bytes it was.
    """

    RECORD: ClassVar[str] = "job record"

    id: str = ""
    name: str = ""
    #: the job as created (JobCreate JSON), paths resolved
    spec: str = ""
    #: the trainer config the job implies (JSON); "": a job stored before the API kept it
    trainer_config: str = ""
    state: JobState | None = None
    created_at: float | None = _time()
    updated_at: float | None = _time()
    #: when the job last started: commands issued before it are dropped
    started_at: float | None = _time()
    passes_total: int = 0
    passes_done: int = 0
    cursor: int = 0
    in_flight: str | None = None
    last_checkpoint: str | None = None
    error: str | None = None
    waiting_for: str | None = None
    trainers: str | None = None
    group: str | None = None
    last_group: str | None = None
    restarts: int = 0
    restarts_total: int = 0
    not_before: float | None = _time()


@dataclass(frozen=True)
class TriggerRecord(HashRecord):
    """A trigger (an operator's checkpoint, export or shrink of a running job): written
    pending at create, finished by the trainers' report (``state``, ``finished_at`` and
    ``result`` or ``error``)."""

    RECORD: ClassVar[str] = "trigger record"

    id: str = ""
    kind: CommandType | None = None
    #: an export's save mode (``base``, ``delta``, ``batch``, ``online``); None: not an export
    mode: str | None = None
    state: TriggerState | None = None
    created_at: float | None = _time()
    finished_at: float | None = _time()
    #: what the trainers reported, the JSON text written (any JSON value)
    result: str | None = None
    error: str | None = None


#: The pass record's flags (``bool`` fields), the figures a report carries as true or false.
_FLAGS = frozenset(
    name
    for name, hint in typing.get_type_hints(PassRecord).items()
    if bool in typing.get_args(hint)
)

# the records and their field names are one list each: a field added to one is added to both
assert [f.name for f in dataclasses.fields(PassRecord)] == [f.value for f in PassField]
assert [f.name for f in dataclasses.fields(JobRecord)] == [f.value for f in JobField]
