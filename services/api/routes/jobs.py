"""/v1/jobs: create, list, get, start, stop, pause, resume, delete; the trainer group's state."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status
from streamrec.api.deps import ReadAuth, RepoDep, SettingsDep, WriteAuth
from streamrec.api.models import JobCreate
from streamrec.api.public import JobPublic, JobsPublic, WorkerPublic
from streamrec.api.state import JobAction, JobState

router = APIRouter(prefix="/jobs", tags=["jobs"])

JobId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="job id")]


@router.post("", status_code=status.HTTP_201_CREATED, dependencies=[WriteAuth])
def create_job(body: JobCreate, repo: RepoDep) -> JobPublic:
    """Accepts a job in state `created`; `POST /v1/jobs/{id}/start` runs it."""
    return repo.create_job(body)


@router.get("", dependencies=[ReadAuth])
def list_jobs(
    repo: RepoDep,
    state: JobState | None = None,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> JobsPublic:
    return repo.list_jobs(state, offset, limit)


@router.get("/{job_id}", dependencies=[ReadAuth])
def get_job(job_id: JobId, repo: RepoDep) -> JobPublic:
    return repo.get_job(job_id)


@router.post("/{job_id}/start", dependencies=[WriteAuth])
def start_job(job_id: JobId, repo: RepoDep) -> JobPublic:
    """created|stopped|failed -> running (a restarted job resumes from its last checkpoint)."""
    return repo.act(job_id, JobAction.START)


@router.post("/{job_id}/stop", dependencies=[WriteAuth])
def stop_job(job_id: JobId, repo: RepoDep) -> JobPublic:
    """running|paused -> stopping; the trainers finish the pass in flight, then stopped."""
    return repo.act(job_id, JobAction.STOP)


@router.post("/{job_id}/pause", dependencies=[WriteAuth])
def pause_job(job_id: JobId, repo: RepoDep) -> JobPublic:
    """running -> paused: no new pass is handed out; the one in flight finishes."""
    return repo.act(job_id, JobAction.PAUSE)


@router.post("/{job_id}/resume", dependencies=[WriteAuth])
def resume_job(job_id: JobId, repo: RepoDep) -> JobPublic:
    """paused -> running."""
    return repo.act(job_id, JobAction.RESUME)


@router.delete("/{job_id}", status_code=status.HTTP_204_NO_CONTENT, dependencies=[WriteAuth])
def delete_job(job_id: JobId, repo: RepoDep) -> Response:
    """Removes a job that is not running (created, stopped, succeeded, failed)."""
    repo.delete_job(job_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{job_id}/workers", dependencies=[ReadAuth])
def get_workers(job_id: JobId, repo: RepoDep, settings: SettingsDep) -> WorkerPublic:
    """The trainer group's last heartbeat (absent once its TTL expired) and whether it is
    stuck (beating without progress while it works)."""
    return repo.worker(job_id, settings.trainer_stuck_s)
