"""/v1/jobs/{id}/events: state changes, failures, checkpoints; paged by stream id."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from streamrec.api.deps import ReadAuth, RepoDep
from streamrec.api.models import EventsPublic
from streamrec.api.routes.jobs import JobId

router = APIRouter(prefix="/jobs/{job_id}/events", tags=["events"])


@router.get("", dependencies=[ReadAuth])
def list_events(
    job_id: JobId,
    repo: RepoDep,
    after: Annotated[
        str | None, Query(pattern=r"^\d{1,20}-\d{1,20}$", description="`next` of the previous page")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> EventsPublic:
    return repo.events(job_id, after, limit)
