"""/v1/jobs/{id}/events: state changes, failures, checkpoints; paged by stream id."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import AfterValidator
from streamrec.api.deps import ReadAuth, RepoDep
from streamrec.api.public import EventsPublic
from streamrec.api.routes.jobs import JobId

#: Both halves of a Redis stream id are unsigned 64-bit.
_STREAM_ID_MAX = 2**64 - 1


def _stream_id(after: str | None) -> str | None:
    """Refuses a cursor Redis would refuse (a 422 here, not Redis's error as a 503)."""
    if after is not None and any(int(part) > _STREAM_ID_MAX for part in after.split("-")):
        raise ValueError(f"each half of a stream id is at most {_STREAM_ID_MAX}")
    return after


router = APIRouter(prefix="/jobs/{job_id}/events", tags=["events"])


@router.get("", dependencies=[ReadAuth])
def list_events(
    job_id: JobId,
    repo: RepoDep,
    after: Annotated[
        str | None,
        Query(pattern=r"^\d{1,20}-\d{1,20}$", description="`next` of the previous page"),
        AfterValidator(_stream_id),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> EventsPublic:
    return repo.events(job_id, after, limit)
