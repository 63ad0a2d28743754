"""Job and pass states, the job state machine, and the one function that changes a job's state.

Job state machine (actions in brackets; the scheduler takes the unbracketed ones)::

    created --[start]--> running --[pause]--> paused --[resume]--> running
    running|paused --[stop]--> stopping --(trainers stopped / none alive)--> stopped
    running|paused --(last pass done)--> succeeded
    running|paused|stopping --(pass failed twice, bad data)--> failed
    stopped|failed --[start]--> running          (resumes from the last checkpoint)
    created|stopped|succeeded|failed --[delete]--> (gone)

Any other (state, action) is refused with :class:`InvalidTransition` (HTTP 409 naming the
current state). A state change and its index move (``jobs:state:<state>`` sets) and its event
are written in one MULTI/EXEC under WATCH (:func:`watched`, the one check-then-write loop of
the API), so readers never see a job in two indexes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any, TypeVar, cast

import redis
from streamrec.api.errors import InvalidTransition, JobNotFound
from streamrec.control import keys, redis_io
from streamrec.control.commands import Command
from streamrec.control.records import JobField, JobRecord
from streamrec.control.states import (  # noqa: F401 (re-exported for the api)
    ACTIVE_STATES,
    TERMINAL_STATES,
    JobState,
    PassState,
    TriggerState,
)

T = TypeVar("T")


class JobAction(StrEnum):
    """What changes a job's state (the value is written in its state events)."""

    START = "start"
    STOP = "stop"
    PAUSE = "pause"
    RESUME = "resume"
    DELETE = "delete"
    #: the trainers left a stopping job (or none is alive): stopping -> stopped
    TRAINERS_STOPPED = "stopped"
    SUCCEED = "succeed"
    FAIL = "fail"


#: (current state, action) -> new state. ``delete`` maps to None (the job is removed).
TRANSITIONS: dict[tuple[JobState, JobAction], JobState | None] = {
    (JobState.CREATED, JobAction.START): JobState.RUNNING,
    (JobState.STOPPED, JobAction.START): JobState.RUNNING,
    (JobState.FAILED, JobAction.START): JobState.RUNNING,
    (JobState.RUNNING, JobAction.PAUSE): JobState.PAUSED,
    (JobState.PAUSED, JobAction.RESUME): JobState.RUNNING,
    (JobState.RUNNING, JobAction.STOP): JobState.STOPPING,
    (JobState.PAUSED, JobAction.STOP): JobState.STOPPING,
    (JobState.STOPPING, JobAction.TRAINERS_STOPPED): JobState.STOPPED,
    (JobState.RUNNING, JobAction.SUCCEED): JobState.SUCCEEDED,
    (JobState.PAUSED, JobAction.SUCCEED): JobState.SUCCEEDED,
    (JobState.STOPPING, JobAction.SUCCEED): JobState.SUCCEEDED,
    (JobState.RUNNING, JobAction.FAIL): JobState.FAILED,
    (JobState.PAUSED, JobAction.FAIL): JobState.FAILED,
    (JobState.STOPPING, JobAction.FAIL): JobState.FAILED,
    (JobState.CREATED, JobAction.DELETE): None,
    (JobState.STOPPED, JobAction.DELETE): None,
    (JobState.SUCCEEDED, JobAction.DELETE): None,
    (JobState.FAILED, JobAction.DELETE): None,
}
#: Actions an operator may ask for over REST.
USER_ACTIONS = (
    JobAction.START,
    JobAction.STOP,
    JobAction.PAUSE,
    JobAction.RESUME,
    JobAction.DELETE,
)


def next_state(current: JobState, action: JobAction) -> JobState | None:
    """The state after ``action``; raises KeyError when the machine does not allow it."""
    return TRANSITIONS[(current, action)]


def event_fields(kind: str, message: str, data: dict[str, Any] | None = None) -> dict[str, str]:
    """The fields of one entry of a job's event stream."""
    return {
        "type": kind,
        "message": message,
        "data": json.dumps(data or {}),
        "ts": f"{time.time():.3f}",
    }


def append_event(
    client: redis.Redis,
    job_id: str,
    kind: str,
    message: str,
    data: dict[str, Any] | None = None,
) -> None:
    """Appends an event to the job's event stream: the one place the API writes events
    (``client`` a pipeline: queued with the rest of its transaction)."""
    redis_io.xadd(client, keys.events(job_id), event_fields(kind, message, data))


def change_state(
    r: redis.Redis,
    job_id: str,
    action: JobAction,
    reason: str = "",
    extra: dict[str, str] | None = None,
    command: Command | None = None,
) -> JobState:
    """Applies ``action`` to a job atomically; returns the new state.

    The job hash (with ``extra``: the fields of a ``JobRecord.patch``), both state indexes,
    the event stream and (when given) a command for the trainers change in one transaction;
    a concurrent change makes the WATCH fail and the check runs again on the fresh state.

    Raises:
        JobNotFound: no such job.
        InvalidTransition: the state machine refuses ``action`` in the current state.
    """
    key = keys.job(job_id)

    def apply(pipe: redis.client.Pipeline) -> JobState:
        raw = redis_io.hget(pipe, key, JobField.STATE)
        if raw is None:
            raise JobNotFound(f"job {job_id!r} not found")
        current = JobState(raw)
        try:
            new = next_state(current, action)
        except KeyError:
            raise InvalidTransition(job_id, current.value, action) from None
        assert new is not None, "delete goes through delete_job"
        pipe.multi()
        fields = JobRecord.patch(state=new, updated_at=time.time())
        redis_io.hset(pipe, key, {**fields, **(extra or {})})
        pipe.srem(keys.jobs_in_state(current.value), job_id)
        pipe.sadd(keys.jobs_in_state(new.value), job_id)
        msg = f"{current.value} -> {new.value} ({action})" + (f": {reason}" if reason else "")
        append_event(
            pipe, job_id, "state", msg, {"from": current.value, "to": new.value, "action": action}
        )
        if command is not None:
            redis_io.xadd(pipe, keys.commands(job_id), command.to_fields())
        return new

    return watched(r, apply, key)


def watched(r: redis.Redis, body: Callable[[redis.client.Pipeline], T], *watch: str) -> T:
    """Runs ``body`` as one optimistic transaction on ``watch`` and returns what it returns.

    ``body`` reads in immediate mode, calls ``pipe.multi()`` and queues its writes; they are
    executed together, and the whole of ``body`` runs again when a watched key changed in the
    meantime (so its checks always hold on the state it writes over). An exception raised by
    ``body`` (e.g. a refused transition) leaves Redis untouched.
    """
    # redis-py types ``body`` as returning None; value_from_callable returns what it returns
    return cast(T, r.transaction(body, *watch, value_from_callable=True))  # type: ignore[arg-type]
