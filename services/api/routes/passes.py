"""/v1/jobs/{id}/passes: the passes handed out so far, with their metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from streamrec.api.deps import ReadAuth, RepoDep
from streamrec.api.public import PassesPublic, PassPublic
from streamrec.api.routes.jobs import JobId

router = APIRouter(prefix="/jobs/{job_id}/passes", tags=["passes"])


@router.get("", dependencies=[ReadAuth])
def list_passes(
    job_id: JobId,
    repo: RepoDep,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> PassesPublic:
    """Passes in training order: day, pass id, splits, state, AUCs, logloss, samples, ..."""
    return repo.list_passes(job_id, offset, limit)


@router.get("/{day}/{pass_id}", dependencies=[ReadAuth])
def get_pass(
    job_id: JobId,
    day: Annotated[str, Path(pattern=r"^\d{8}$")],
    pass_id: Annotated[int, Path(ge=1, le=1440)],
    repo: RepoDep,
) -> PassPublic:
    return repo.get_pass(job_id, day, pass_id)
