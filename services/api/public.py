"""REST responses, named by role: ``JobPublic`` (one), ``JobsPublic`` (a page), ...

The request bodies (``JobCreate``, ``TriggerCreate``) are in :mod:`streamrec.api.models`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field
from streamrec.api.models import ExportMode, JobCreate, TriggerKind
from streamrec.api.state import JobState, PassState, TriggerState
from streamrec.control.records import PassField


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
def _float(v: str | None) -> float | None:
    return None if v in (None, "") else float(v)


def _int(v: str | None) -> int | None:
    return None if v in (None, "") else int(float(v))


def pass_public(f: dict[str, str]) -> PassPublic:
    """A pass record as REST shows it."""
    return PassPublic(
        day=f[PassField.DAY],
        pass_id=int(f[PassField.PASS_ID]),
        splits=json.loads(f[PassField.SPLITS]),
        state=f[PassField.STATE],
        attempts=int(f.get(PassField.ATTEMPTS, "0")),
        failures=int(f.get(PassField.FAILURES) or 0),
        resume_from=f.get(PassField.RESUME_FROM) or None,
        skipped_splits=json.loads(f.get(PassField.SKIPPED_SPLITS) or "[]"),
        predict_auc=_float(f.get(PassField.PREDICT_AUC)),
        train_auc=_float(f.get(PassField.TRAIN_AUC)),
        logloss=_float(f.get(PassField.LOGLOSS)),
        best_auc=_float(f.get(PassField.BEST_AUC)),
        samples=_int(f.get(PassField.SAMPLES)),
        malformed_lines=_int(f.get(PassField.MALFORMED_LINES)),
        seconds=_float(f.get(PassField.SECONDS)),
        ranks=_int(f.get(PassField.RANKS)),
        queued_at=_float(f.get(PassField.QUEUED_AT)),
        started_at=_float(f.get(PassField.STARTED_AT)),
        finished_at=_float(f.get(PassField.FINISHED_AT)),
        error=f.get(PassField.ERROR) or None,
    )


def trigger_public(f: dict[str, str]) -> TriggerPublic:
    """A trigger's hash as REST shows it."""
    result: Any = json.loads(f["result"]) if f.get("result") else None
    return TriggerPublic(
        id=f["id"],
        kind=f["kind"],
        mode=f.get("mode") or None,
        state=f["state"],
        created_at=float(f["created_at"]),
        finished_at=_float(f.get("finished_at")),
        result=result if isinstance(result, dict) or result is None else {"value": result},
        error=f.get("error") or None,
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
