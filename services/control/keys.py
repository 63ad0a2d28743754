"""Every Redis key the control plane and the trainer agents use, in one place.

::

    streamrec:jobs                          zset   job id -> creation time (listing order)
    streamrec:jobs:state:<state>            set    job ids in that state (one index per state)
    streamrec:jobs:model_paths              hash   live job id -> its resolved model_save_path
    streamrec:job:<id>                      hash   spec (JSON), state, times, cursor, in-flight pass
    streamrec:job:<id>:passes               zset   pass key "YYYYMMDD/<pass_id>" -> order index
    streamrec:job:<id>:pass:<day>/<pid>     hash   one pass record (state, metrics, attempts, ...)
    streamrec:job:<id>:work                 stream passes handed out; group "trainers"
    streamrec:job:<id>:commands             stream commands (checkpoint/export/shrink/stop)
    streamrec:job:<id>:reports              stream what trainers report back; group "api"
    streamrec:job:<id>:events               stream events (state changes, failures, checkpoints)
    streamrec:job:<id>:triggers             zset   trigger id -> creation time
    streamrec:job:<id>:trigger:<tid>        hash   one trigger (kind, mode, state, result)
    streamrec:job:<id>:heartbeat            string trainer group heartbeat (JSON), with TTL
    streamrec:scheduler:lock                string owner of the scheduler lease, with TTL
    streamrec:pool:groups                   set    names of the trainer groups that joined the pool
    streamrec:pool:group:<name>             string a pooled group's registration (JSON), with TTL
    streamrec:pool:assignments              hash   group name -> "<job id>:<token>" (its job)
    streamrec:pool:generation               string the last assignment's token (INCR)
    streamrec:pool:drops                    list   deleted jobs' store namespaces to free (JSON)
"""

from __future__ import annotations

from collections.abc import Callable

PREFIX = "streamrec"
JOBS = f"{PREFIX}:jobs"
#: job id -> resolved ``checkpoint.model_save_path`` of every live job (one model path, one job)
MODEL_PATHS = f"{PREFIX}:jobs:model_paths"
SCHEDULER_LOCK = f"{PREFIX}:scheduler:lock"
POOL_GROUPS = f"{PREFIX}:pool:groups"
POOL_ASSIGNMENTS = f"{PREFIX}:pool:assignments"
#: Counter of the pool's assignments: each assignment's token (its generation, which the
#: store shards fence on) is the next value.
POOL_GENERATION = f"{PREFIX}:pool:generation"
POOL_DROPS = f"{PREFIX}:pool:drops"

#: Consumer group of the trainers on a job's work and command streams.
TRAINER_GROUP = "trainers"
#: Consumer group of the API on a job's report stream.
API_GROUP = "api"
#: Fixed consumer name of the API: a restarted API re-reads its own pending reports.
API_CONSUMER = "scheduler"


def jobs_in_state(state: str) -> str:
    return f"{PREFIX}:jobs:state:{state}"


def job(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}"


def pass_key(day: str, pass_id: int) -> str:
    """The name of a pass inside a job: ``"20190720/3"``."""
    return f"{day}/{pass_id}"


def pass_record(job_id: str, day: str, pass_id: int) -> str:
    return f"{job(job_id)}:pass:{pass_key(day, pass_id)}"


def trigger(job_id: str, trigger_id: str) -> str:
    return f"{job(job_id)}:trigger:{trigger_id}"


def _job_part(part: str) -> Callable[[str], str]:
    """The function naming a job's fixed-name key ``part``: ``streamrec:job:<id>:<part>``."""

    def key(job_id: str) -> str:
        return f"{job(job_id)}:{part}"

    key.__name__ = key.__qualname__ = part
    return key


passes = _job_part("passes")
work = _job_part("work")
commands = _job_part("commands")
reports = _job_part("reports")
events = _job_part("events")
triggers = _job_part("triggers")
heartbeat = _job_part("heartbeat")


def pool_group(name: str) -> str:
    return f"{PREFIX}:pool:group:{name}"


def parse_pass_key(key: str) -> tuple[str, int]:
    """The inverse of :func:`pass_key`: ``"20190720/3"`` -> ``("20190720", 3)``."""
    day, pass_id = key.split("/")
    return day, int(pass_id)


def all_job_keys(job_id: str) -> list[str]:
    """Fixed-name keys of a job (pass and trigger records are listed from their indexes)."""
    parts = (passes, work, commands, reports, events, triggers, heartbeat)
    return [job(job_id), *(key(job_id) for key in parts)]
