"""/v1/jobs/{id}/triggers: checkpoint, export (base|delta|batch) or shrink now."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, status
from streamrec.api.deps import ReadAuth, RepoDep, WriteAuth
from streamrec.api.models import TriggerCreate
from streamrec.api.public import TriggerPublic, TriggersPublic
from streamrec.api.routes.jobs import JobId

router = APIRouter(prefix="/jobs/{job_id}/triggers", tags=["triggers"])


@router.post("", status_code=status.HTTP_202_ACCEPTED, dependencies=[WriteAuth])
def create_trigger(job_id: JobId, body: TriggerCreate, repo: RepoDep) -> TriggerPublic:
    """Sends the command to the job's trainers; poll the returned id for its outcome."""
    return repo.create_trigger(job_id, body)


@router.get("", dependencies=[ReadAuth])
def list_triggers(
    job_id: JobId,
    repo: RepoDep,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> TriggersPublic:
    return repo.list_triggers(job_id, offset, limit)


@router.get("/{trigger_id}", dependencies=[ReadAuth])
def get_trigger(
    job_id: JobId, trigger_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$")], repo: RepoDep
) -> TriggerPublic:
    return repo.get_trigger(job_id, trigger_id)
