"""What a trainer group reports to the control plane: one dataclass per kind, one codec.

A report is one entry of the job's report stream (``keys.reports``)::

    type  the kind (ReportKind value)    "pass_failed"
    data  the report's fields, JSON       {"day": "20190720", "pass_id": 3, "error": ...}
    ts    when it was sent (unix s)       "1764270000.123"

The trainer builds a dataclass and sends it (:meth:`TrainerChannel.send`); the scheduler
decodes it (:func:`decode_report`) and reads its attributes. A field added with a default
keeps records of older senders readable; :class:`~.codec.ContractError` names any field that
is missing or of the wrong type.

A failed pass carries its :class:`ErrorClass`, chosen by the trainer from the exception's
type: the control plane never reads error text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from streamrec.control.codec import ContractError, decode, encode, json_safe
from streamrec.errors import quote


class ReportKind(StrEnum):
    """What a trainer group reports on a job's report stream (one dataclass each below)."""

    STARTED = "started"
    CLAIMED = "claimed"
    PASS_DONE = "pass_done"
    PASS_FAILED = "pass_failed"
    CHECKPOINT = "checkpoint"
    TRIGGER_DONE = "trigger_done"
    TRIGGER_FAILED = "trigger_failed"
    STOPPED = "stopped"
    RELEASED = "released"
    ERROR = "error"
    FATAL = "fatal"


class ErrorClass(StrEnum):
    """What kind of failure a pass had, and what the control plane does about it."""

    #: a split's content is bad (``bad_splits`` named): the job's ``data.on_bad_split``
    DATA = "data"
    #: a shard lost the job's rows (restarted empty), or the model lacks passes the job
    #: counts done: the job goes back to its last checkpoint, no failure of the pass
    STORE_LOST = "store_lost"
    #: a shard or the sampler unreachable: a restart of the group (budget, backoff)
    INFRA = "infra"
    #: anything else (disk, a peer, a bug): handed out again once, from the last checkpoint
    TRANSIENT = "transient"


class Phase(StrEnum):
    """Where in a pass it failed: the saves after it count as checkpoint failures."""

    TRAIN = "train"
    SAVE = "save"


@dataclass(frozen=True)
class Started:
    """The trainer group came up, its model the state after ``resumed_from`` (a pass key;
    None: a fresh model); ``resharded``: "M -> N" when that checkpoint was saved by M store
    shards and loaded into N."""

    KIND: ClassVar[ReportKind] = ReportKind.STARTED
    ranks: int = 1
    threads: int | None = None
    host: str | None = None
    group: str | None = None
    resumed_from: str | None = None
    resharded: str | None = None


@dataclass(frozen=True)
class Claimed:
    """A pass was taken. ``attempt`` (every report about a pass carries it; None from a
    sender that predates it) tells a report about an earlier hand-out apart."""

    KIND: ClassVar[ReportKind] = ReportKind.CLAIMED
    day: str
    pass_id: int
    ranks: int = 1
    attempt: int | None = None


@dataclass(frozen=True)
class PassDone:
    """The pass was trained; ``record`` is the trainer's per-pass record (AUCs, logloss,
    samples, seconds, ``checkpoint`` ...: numbers, strings or null)."""

    KIND: ClassVar[ReportKind] = ReportKind.PASS_DONE
    day: str
    pass_id: int
    ranks: int = 1
    attempt: int | None = None
    record: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PassFailed:
    """The pass raised on some rank (every rank stopped it); ``error`` is for people only."""

    KIND: ClassVar[ReportKind] = ReportKind.PASS_FAILED
    day: str
    pass_id: int
    attempt: int | None = None
    error: str = ""
    error_class: ErrorClass = ErrorClass.TRANSIENT
    phase: Phase = Phase.TRAIN
    bad_splits: tuple[str, ...] = ()


@dataclass(frozen=True)
class Checkpoint:
    """A full checkpoint of the state after the pass is complete on disk at ``path``."""

    KIND: ClassVar[ReportKind] = ReportKind.CHECKPOINT
    day: str
    pass_id: int
    path: str | None = None


@dataclass(frozen=True)
class TriggerDone:
    """A checkpoint, export or shrink command finished; ``result`` what it made."""

    KIND: ClassVar[ReportKind] = ReportKind.TRIGGER_DONE
    trigger_id: str
    result: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TriggerFailed:
    """A command failed. ``refused``: the group had no model to save or shrink (before the
    first pass, after a failed one): no failed save."""

    KIND: ClassVar[ReportKind] = ReportKind.TRIGGER_FAILED
    trigger_id: str
    error: str = ""
    refused: bool = False


@dataclass(frozen=True)
class Stopped:
    """The group obeyed a stop command."""

    KIND: ClassVar[ReportKind] = ReportKind.STOPPED


@dataclass(frozen=True)
class Released:
    """The group was told to end (SIGTERM) with this pass in hand: handed out again, no
    failure of the pass."""

    KIND: ClassVar[ReportKind] = ReportKind.RELEASED
    day: str
    pass_id: int
    attempt: int | None = None


@dataclass(frozen=True)
class Error:
    """Something worth an event."""

    KIND: ClassVar[ReportKind] = ReportKind.ERROR
    message: str = ""


@dataclass(frozen=True)
class Fatal:
    """The job cannot run here (bad trainer config, wrong world size or store tier)."""

    KIND: ClassVar[ReportKind] = ReportKind.FATAL
    message: str = ""


Report = (
    Started
    | Claimed
    | PassDone
    | PassFailed
    | Checkpoint
    | TriggerDone
    | TriggerFailed
    | Stopped
    | Released
    | Error
    | Fatal
)
#: The dataclass of each kind.
REPORTS: dict[ReportKind, type[Report]] = {
    cls.KIND: cls
    for cls in (
        Started,
        Claimed,
        PassDone,
        PassFailed,
        Checkpoint,
        TriggerDone,
        TriggerFailed,
        Stopped,
        Released,
        Error,
        Fatal,
    )
}
#: The prefix by which the trainer's text of a refused command was known before
#: ``TriggerFailed.refused`` existed: read only in reports that lack that field.
_LEGACY_REFUSED = "NotFound:"


def kind_of(value: str) -> ReportKind:
    """The :class:`ReportKind` named ``value``; ContractError for one the scheduler does not
    know."""
    try:
        return ReportKind(value)
    except ValueError:
        names = ", ".join(k.value for k in ReportKind)
        raise ContractError(
            f"report field 'type': {quote(value)} is not a valid ReportKind (one of {names})"
        ) from None


def report_from_data(kind: str, data: Any) -> Report:
    """The report of ``kind`` from its JSON object (ContractError naming a bad field)."""
    report_kind = kind_of(kind)
    report = decode(REPORTS[report_kind], data, f"report {report_kind.value!r}")
    if isinstance(report, TriggerFailed) and "refused" not in data:
        # a report written before the field existed: its one marker was the error's type
        refused = report.error.startswith(_LEGACY_REFUSED)
        report = TriggerFailed(report.trigger_id, report.error, refused)
    return report


def encode_report(report: Report, ts: float) -> dict[str, str]:
    """The report stream entry of ``report`` (NaN and infinities as null: JSON has none)."""
    return {
        "type": report.KIND.value,
        "data": json.dumps(json_safe(encode(report))),
        "ts": f"{ts:.3f}",
    }


def decode_report(fields: dict[str, str]) -> Report:
    """The report of a report stream entry (ContractError naming what is wrong)."""
    try:
        data = json.loads(fields.get("data") or "{}")
    except ValueError:
        raw = fields.get("data")
        raise ContractError(f"report: field 'data' must be JSON, got {quote(raw)}") from None
    return report_from_data(fields.get("type", ""), data)
