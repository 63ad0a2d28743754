"""The trainers' channel to the control plane, straight on Redis (what the trainer agent uses):
take passes from the job's work stream, acknowledge them, report outcomes, heartbeat, read
commands. Only rank 0 of a trainer group talks to it.

Reports are typed (:mod:`~streamrec.control.reports`: one dataclass per kind, a failed
pass's :class:`~streamrec.control.reports.ErrorClass`); work items are
:class:`~streamrec.control.work.WorkItem`, commands :class:`~streamrec.control.commands.Command`.

The trainer imports nothing else of the api: what it needs of a job (its trainer config, the
states in which it ends, the report kinds, the command types) comes from this module.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import redis
from streamrec.control import keys, redis_io
from streamrec.control.codec import json_safe
from streamrec.control.commands import Command, CommandType
from streamrec.control.records import JobField
from streamrec.control.reports import Report, ReportKind, encode_report, report_from_data
from streamrec.control.states import TERMINAL_STATES
from streamrec.control.trainer_config import TrainerConfig
from streamrec.control.work import WorkItem
from streamrec.errors import BadRequest, NotFound

__all__ = [
    "TERMINAL_STATES",
    "Command",
    "CommandType",
    "ReportKind",
    "TrainerChannel",
    "WorkItem",
]


class TrainerChannel:
    """Rank 0's connection to the control plane for one job.

    Args:
        redis_url: the control plane's Redis.
        job_id: the job this trainer group works for.
        consumer: this group's consumer name in the work/command groups (unique per group).
        heartbeat_ttl_s: the heartbeat expires this long after the last beat.
    """

    def __init__(
        self,
        redis_url: str,
        job_id: str,
        consumer: str,
        heartbeat_ttl_s: float = 10.0,
        timeout_s: float = 10.0,
    ) -> None:
        self.r = redis.Redis.from_url(
            redis_url,
            decode_responses=True,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=redis_io.reconnecting(),
        )
        self.job_id = job_id
        self.consumer = consumer
        self.heartbeat_ttl_ms = int(heartbeat_ttl_s * 1000)
        self.max_block_ms = max(1, int(timeout_s * 1000) // 2)
        #: work entries taken and not yet acknowledged (pending on purpose)
        self._held: set[str] = set()
        self._born = time.monotonic()
        #: Whether take_commands has taken over the commands a dead group left unacknowledged.
        self._commands_recovered = False

    def close(self) -> None:
        self.r.close()

    # ---- job ---------------------------------------------------------------------------
    def job(self) -> dict[str, str]:
        """The job's hash (state, spec JSON, ...); raises NotFound when it was deleted."""
        fields = redis_io.hgetall(self.r, keys.job(self.job_id))
        if not fields:
            raise NotFound(f"job {self.job_id!r} not found")
        return fields

    def trainer_config(self, runner_overrides: Mapping[str, Any] | None = None) -> TrainerConfig:
        """The trainer config the job implies, computed and validated by the API when the job
        was created, validated again here (Redis is not trusted more than a REST body);
        ``runner_overrides`` (the agent's flags) are written over its runner section first."""
        raw = self.job().get("trainer_config")
        if not raw:
            raise NotFound(
                f"job {self.job_id!r} has no trainer config (created by an older API): "
                f"create it again"
            )
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise BadRequest(
                f"job {self.job_id!r}: its trainer_config is not JSON: {exc}"
            ) from None
        if runner_overrides and isinstance(data, dict):
            runner = data.get("runner")
            data["runner"] = {**(runner if isinstance(runner, dict) else {}), **runner_overrides}
        return TrainerConfig.parse(data, source=f"job {self.job_id}")

    def state(self) -> str:
        return self.job()[JobField.STATE]

    # ---- liveness ----------------------------------------------------------------------
    def heartbeat(self, **info: Any) -> None:
        """Renews the group's heartbeat (a key with TTL; the scheduler reads its absence)."""
        body = json.dumps(json_safe({"consumer": self.consumer, "ts": time.time(), **info}))
        self.r.set(keys.heartbeat(self.job_id), body, px=self.heartbeat_ttl_ms)

    def clear_heartbeat(self) -> None:
        self.r.delete(keys.heartbeat(self.job_id))

    # ---- work --------------------------------------------------------------------------
    def take_pass(self, block_ms: int = 1000) -> WorkItem | None:
        """The next pass of the work stream for this group, or None after ``block_ms``."""
        entries = self._lost_delivery()
        deadline = time.monotonic() + block_ms / 1000
        while not entries:  # blocks in slices shorter than the socket timeout
            left_ms = int((deadline - time.monotonic()) * 1000)
            entries = redis_io.read_group(
                self.r,
                keys.TRAINER_GROUP,
                self.consumer,
                keys.work(self.job_id),
                ">",
                count=1,
                block_ms=max(1, min(left_ms, self.max_block_ms)),
            )
            if entries:
                break
            if time.monotonic() >= deadline:
                return None
        msg_id, fields = entries[0]
        self._held.add(msg_id)
        return WorkItem.from_fields(msg_id, fields)

    def ack_pass(self, item: WorkItem) -> None:
        self.r.xack(keys.work(self.job_id), keys.TRAINER_GROUP, item.msg_id)
        self._held.discard(item.msg_id)

    def _lost_delivery(self) -> list[redis_io.Entry]:
        """A pass delivered to this channel that it never saw: the reply to its XREADGROUP
        was lost with the connection (a Redis restart mid-call; the call was retried), so the
        entry is pending here, delivered after this channel was made, but not held. Empty
        when there is none (the usual case: one XPENDING)."""
        work = keys.work(self.job_id)
        age_ms = (time.monotonic() - self._born) * 1000
        for msg_id, idle_ms in redis_io.pending_of(
            self.r, work, keys.TRAINER_GROUP, self.consumer, 16
        ):
            if msg_id in self._held or idle_ms > age_ms:
                continue  # being worked on, or a predecessor's of the same name
            entries = redis_io.xrange(self.r, work, msg_id, msg_id, 1)
            if entries:
                return entries
            self.r.xack(work, keys.TRAINER_GROUP, msg_id)  # deleted while pending
        return []

    def send(self, report: Report) -> str:
        """Appends a report for the scheduler; returns its stream id."""
        return redis_io.xadd(self.r, keys.reports(self.job_id), encode_report(report, time.time()))

    def report(self, kind: ReportKind | str, **data: Any) -> str:
        """:meth:`send` of the report ``kind`` with the fields ``data``; ContractError (a
        ValueError) for a kind the scheduler does not know or a field of the wrong type."""
        return self.send(report_from_data(kind, json_safe(data)))

    # ---- commands ----------------------------------------------------------------------
    def take_commands(self, block_ms: int | None = None) -> list[Command]:
        """Commands to carry out, each acknowledged (:meth:`ack_command`) only once done.

        The first call also takes over the commands an earlier group read but never
        acknowledged (it died with them queued): they are claimed from any consumer and
        read back from this consumer's pending list (id 0), so their triggers do not stay
        pending forever. Commands issued before the job's last start are acknowledged and
        dropped (a stop meant for an earlier run must not stop this one).
        """
        entries: list[redis_io.Entry] = []
        if not self._commands_recovered:
            stream = keys.commands(self.job_id)
            if self.r.exists(stream):
                self.r.xautoclaim(stream, keys.TRAINER_GROUP, self.consumer, 0, "0-0", count=1000)
                entries = redis_io.read_group(
                    self.r, keys.TRAINER_GROUP, self.consumer, stream, "0", 1000
                )
            self._commands_recovered = True
        if not entries:
            block = None if block_ms is None else max(1, min(block_ms, self.max_block_ms))
            entries = redis_io.read_group(
                self.r,
                keys.TRAINER_GROUP,
                self.consumer,
                keys.commands(self.job_id),
                ">",
                16,
                block,
            )
        if not entries:
            return []
        started_at = float(redis_io.hget(self.r, keys.job(self.job_id), JobField.STARTED_AT) or 0)
        out = []
        for msg_id, f in entries:
            command = Command.from_fields(msg_id, f)
            if not f or command.ts < started_at:
                self.r.xack(keys.commands(self.job_id), keys.TRAINER_GROUP, msg_id)
                continue
            out.append(command)
        return out

    def ack_command(self, command: Command) -> None:
        """Acknowledges a command the group carried out (or reported failed)."""
        if command.msg_id is not None:
            self.r.xack(keys.commands(self.job_id), keys.TRAINER_GROUP, command.msg_id)
