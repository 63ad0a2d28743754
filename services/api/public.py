"""REST responses, named by role: ``JobPublic`` (one), ``JobsPublic`` (a page), ...

The request bodies (``JobCreate``, ``TriggerCreate``) are in :mod:`streamrec.api.models`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field
from streamrec.api.models import ExportMode, JobCreate, TriggerKind
from streamrec.api.state import JobState, PassState, TriggerState


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
