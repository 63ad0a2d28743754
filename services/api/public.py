"""REST responses, named by role: ``JobPublic`` (one), ``JobsPublic`` (a page), ...

The request bodies (``JobCreate``, ``TriggerCreate``) are in :mod:`streamrec.api.models`.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field
from streamrec.api.models import ExportMode, JobCreate, TriggerKind, stored_spec
from streamrec.api.state import JobState, PassState, TriggerState
from streamrec.control.records import JobRecord, PassRecord, TriggerRecord


class JobPublic(BaseModel):
    id: str
    name: str
    state: JobState
    spec: JobCreate
    created_at: float
    updated_at: float
    passes_total: int
    passes_done: int
    in_flight: str | None = Field(None, description="the pass handed out, as 'YYYYMMDD/<id>'")
    waiting_for: str | None = Field(
        None,
        description=(
            "the split ('YYYYMMDD/HHMM') a running job's next pass waits for: its donefile has "
            "not landed (None: in flight, ready, or not running)"
        ),
    )
    last_checkpoint: str | None = None
    error: str | None = None
    trainers: Literal["assigned", "waiting_for_trainers", "pinned"] | None = Field(
        None,
        description=(
            "how the job stands with the trainer pool: a group assigned, waiting for a free "
            "group that fits, or served by a group pinned to it (--job-id)"
        ),
    )
    group: str | None = Field(None, description="the pooled trainer group running the job")
    last_group: str | None = Field(
        None,
        description="the pooled trainer group the job was last given to: kept after the job "
        "ends, when group is cleared (None: never given to one)",
    )
    restarts: int = Field(
        0, description="infrastructure restarts of the trainer group in a row (budget)"
    )
    restarts_total: int = Field(0, description="infrastructure restarts of the job in all")


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


class PassPublic(BaseModel):
    day: str
    pass_id: int
    splits: list[str]
    state: PassState
    attempts: int = Field(description="times the pass was handed out (rewinds included)")
    failures: int = Field(
        0, description="attempts that failed (a pass re-handed by a rewind is no failure)"
    )
    resume_from: str | None = Field(None, description="checkpoint the last attempt resumed from")
    skipped_splits: list[str] = Field(
        default_factory=list, description="bad splits left out (data.on_bad_split: skip)"
    )
    predict_auc: float | None = None
    train_auc: float | None = None
    logloss: float | None = None
    best_auc: float | None = None
    samples: int | None = None
    malformed_lines: int | None = None
    seconds: float | None = None
    predict_top_share: float | None = Field(
        None, description="the largest share of the predict phase's rows at one probability"
    )
    predict_collapsed: bool | None = Field(
        None, description="the predict phase's predictions collapsed (one probability, AUC 0.5)"
    )
    train_top_share: float | None = Field(
        None, description="the largest share of the training phase's rows at one probability"
    )
    train_collapsed: bool | None = Field(
        None, description="the training phase's predictions collapsed"
    )
    predictions_collapsed: bool | None = Field(
        None,
        description="the pass's verdict: its model stalled (training predictions collapsed, or "
        "a trained model's predict phase did); a predictions_collapsed event names it",
    )
    batch_size: int | None = Field(
        None, description="the training batch the pass ran (train_batch_size or auto's choice)"
    )
    ranks: int | None = None
    queued_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None


class PassesPublic(BaseModel):
    data: list[PassPublic]
    count: int


class TriggerPublic(BaseModel):
    id: str
    kind: TriggerKind
    mode: ExportMode | None = None
    state: TriggerState
    created_at: float
    finished_at: float | None = None
    result: dict[str, Any] | None = None
    error: str | None = None


class TriggersPublic(BaseModel):
    data: list[TriggerPublic]
    count: int


class EventPublic(BaseModel):
    id: str = Field(description="stream id; pass it as `after` to read the next page")
    type: str
    message: str
    ts: float
    data: dict[str, Any]


class EventsPublic(BaseModel):
    data: list[EventPublic]
    next: str | None = Field(None, description="`after` for the next page; None at the end")


class WorkerPublic(BaseModel):
    alive: bool
    stuck: bool = Field(
        False, description="alive but no progress for trainer_stuck_s while working on a pass"
    )
    heartbeat: dict[str, Any] | None = None
    ttl_s: float | None = None
    trainers: Literal["assigned", "waiting_for_trainers", "pinned"] | None = Field(
        None, description="the job's standing with the trainer pool (see JobPublic)"
    )
    group: str | None = None


class ErrorPublic(BaseModel):
    """Body of every error other than 422: what went wrong, a code, the job's state on 409."""

    detail: str
    code: str | None = None
    state: str | None = None


class HealthPublic(BaseModel):
    status: Literal["ok", "unavailable"]
    redis: bool | None = None


# ---- from the stored records ----------------------------------------------------------
Shown = TypeVar("Shown", bound=BaseModel)


def _from_record(model: type[Shown], rec: object, **shown: Any) -> Shown:
    """``model`` with each field the attribute of ``rec`` of that name, but those in ``shown``
    (the REST models show a record's fields under their names)."""
    return model.model_validate({name: getattr(rec, name) for name in model.model_fields} | shown)


def job_public(rec: JobRecord) -> JobPublic:
    """A job's record as REST shows it (``waiting_for`` only while it runs with no pass in
    flight)."""
    waits = rec.state == JobState.RUNNING and not rec.in_flight
    return _from_record(
        JobPublic,
        rec,
        spec=stored_spec(rec.spec),
        waiting_for=rec.waiting_for if waits else None,
    )


def pass_public(rec: PassRecord) -> PassPublic:
    """A pass record as REST shows it."""
    return _from_record(
        PassPublic, rec, splits=list(rec.splits), skipped_splits=list(rec.skipped_splits)
    )


def trigger_public(rec: TriggerRecord) -> TriggerPublic:
    """A trigger record as REST shows it (a result that is no JSON object: ``{"value": ...}``)."""
    result: Any = json.loads(rec.result) if rec.result else None
    return _from_record(
        TriggerPublic,
        rec,
        result=result if isinstance(result, dict) or result is None else {"value": result},
    )


def event_public(event_id: str, f: dict[str, str]) -> EventPublic:
    """An entry of a job's event stream as REST shows it (bad data JSON: no data)."""
    try:
        data = json.loads(f.get("data") or "{}")
    except ValueError:
        data = {}
    return EventPublic(
        id=event_id,
        type=f.get("type", ""),
        message=f.get("message", ""),
        ts=float(f.get("ts") or 0),
        data=data if isinstance(data, dict) else {},
    )
