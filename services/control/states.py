"""Job, pass and trigger states: the names the control plane and the trainers share."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    CREATED = "created"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPING = "stopping"
    STOPPED = "stopped"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class PassState(StrEnum):
    QUEUED = "queued"  # handed out on the work stream, not yet taken
    RUNNING = "running"  # a trainer group took it
    DONE = "done"
    FAILED = "failed"
    #: trained, then undone by a rewind to an earlier checkpoint: it is trained again
    ROLLED_BACK = "rolled_back"


class TriggerState(StrEnum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


#: States a job does not leave by itself: nothing more comes for its run.
TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED})
#: States in which a trainer group may be at work (triggers are accepted).
ACTIVE_STATES = frozenset({JobState.RUNNING, JobState.PAUSED, JobState.STOPPING})
