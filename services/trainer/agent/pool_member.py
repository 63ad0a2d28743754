"""A trainer group in the control plane's pool: wait for a job, run it, wait for the next.

``streamrec-trainer-agent`` without ``--job-id`` runs this on every rank (under torchrun)::

    rank 0                                        every rank
    ------                                        ----------
    keeps the group's registration (a thread)
    reads its assignment (streamrec.control.pool) -> broadcast (job id, token) -> run the job
                                                     with an Agent, then wait again

The process group is made once, for the group's life (jobs come and go; a job's trainer
reuses it), and /metrics is served once, on the process's port, so both stay up between
jobs. A job's Agent returns when the job is stopped, ends or is deleted; the group then
waits for its next assignment (a new token), never exits by itself.

However a job ends here, the group is back in the pool at once: its registration names no
job as soon as the Agent returns or raises. A job the group cannot run (the agent reports it
fatal: a tier or size the group lacks, a config this trainer refuses) is failed by the API
with the group's message and never tried again here; a job the group could not start (a
shard not up yet) is tried again after a backoff while it stays assigned, and the group takes
another assignment meanwhile (the API gives it one once that job ended: stopped, deleted).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
import torch
import torch.distributed as dist
from streamrec.control import redis_io
from streamrec.control.pool import Assignment, PoolChannel, check_group_name
from streamrec.errors import BadRequest, StreamRecError
from streamrec.trainer import distributed as ddp
from streamrec.trainer import metrics as m
from streamrec.trainer.agent.loop import Agent

log = logging.getLogger("streamrec.trainer.pool")

#: Bytes of the (job id, token) broadcast from rank 0: "<job id>:<token>" padded with 0.
ASSIGNMENT_BYTES = 160


def default_group_name() -> str:
    """``$STREAMREC_GROUP_NAME``, else this host's name (a pod's: stable in a StatefulSet)."""
    return os.environ.get("STREAMREC_GROUP_NAME") or socket.gethostname().split(".")[0]


def broadcast_assignment(a: Assignment | None, rank: int) -> Assignment | None:
    """Rank 0's assignment (None: nothing yet) to every rank, as bytes in a tensor."""
    if not ddp.active():
        return a
    buf = torch.zeros(ASSIGNMENT_BYTES, dtype=torch.uint8)
    if rank == 0 and a is not None:
        raw = a.encode().encode()[:ASSIGNMENT_BYTES]
        buf[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    dist.broadcast(buf, 0)
    return Assignment.decode(bytes(buf.tolist()).rstrip(b"\0").decode())


class PoolMember:
    """One rank of a pooled trainer group.

    Args:
        redis_url: the control plane's Redis.
        group_name: the group's name in the pool (stable across restarts).
        agent_args: what each job's :class:`~.loop.Agent` is made with
            (heartbeat, poll and stuck settings).
        poll_ms: how often an idle group looks for an assignment.
        ttl_s: the registration expires this long after rank 0's last renewal.
        metrics_port / metrics_host: where this rank serves /metrics for its whole life
            (port + local rank; 0 a free port; None: not served).
        group_timeout_s: the process group's timeout (the rendezvous of the ranks; a job's
            step collectives and checkpoint agreements wait the job's own timeouts).
    """

    def __init__(
        self,
        redis_url: str,
        group_name: str,
        agent_args: dict[str, Any],
        poll_ms: int = 500,
        ttl_s: float = 10.0,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        group_timeout_s: float = 60.0,
    ) -> None:
        self.rank, self.world = ddp.env_world()
        self.redis_url = redis_url
        self.name = check_group_name(group_name)
        self.agent_args = agent_args
        self.poll_s = poll_ms / 1000
        self.ttl_s = ttl_s
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.group_timeout_s = group_timeout_s
        #: The job this group works for now (rank 0's registration says it).
        self.job_id: str | None = None
        #: The token of the last assignment carried out or refused (not to be run again).
        self.finished: str | None = None
        #: Rank 0: the assignment that could not start (its token) and the time.monotonic()
        #: before which it is not tried again (another assignment is taken at once).
        self.retry: tuple[str, float] | None = None
        #: Tries in a row of that assignment that ended in an error (the backoff's exponent).
        self.failed_starts = 0
        self._stop = threading.Event()
        #: held while the registration is written: a renewal never writes back a job the
        #: group has just left
        self._registering = threading.Lock()
        self.channel: PoolChannel | None = None

    def _renew(self) -> None:
        assert self.channel is not None
        while not self._stop.wait(self.ttl_s / 3):
            try:
                with self._registering:
                    self.channel.register(self.job_id)
            except redis.RedisError as exc:  # a blip: the next renewal may succeed
                log.warning("pool registration failed: %s", exc)

    def working_for(self, job_id: str | None) -> None:
        """The group works for ``job_id`` (None: idle); rank 0's registration says so now
        (or, after a Redis blip, at the next renewal)."""
        with self._registering:
            self.job_id = job_id
            if self.channel is None:
                return
            try:
                self.channel.register(job_id)
            except redis.RedisError as exc:  # the renewal writes it again within ttl/3
                log.warning("pool registration failed: %s", exc)

    def start(self) -> None:
        """Joins the process group, serves /metrics, registers (rank 0)."""
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        ddp.init_from_env(backend, self.group_timeout_s)
        if self.metrics_port is not None:
            bound = m.serve_rank_metrics(self.metrics_port, self.metrics_host, self.rank)
            log.info("rank %d serves /metrics on %s:%d", self.rank, self.metrics_host, bound)
        if self.rank == 0:
            r = redis.Redis.from_url(
                self.redis_url,
                decode_responses=True,
                socket_timeout=10,
                socket_connect_timeout=10,
                retry=redis_io.reconnecting(),
            )
            self.channel = PoolChannel(r, self.name, self.world, socket.gethostname(), self.ttl_s)
            self.channel.register(None)
            threading.Thread(target=self._renew, name="pool-registration", daemon=True).start()
            log.info("group %s (%d rank(s)) joined the pool", self.name, self.world)

    def next_assignment(self) -> Assignment | None:
        """Rank 0: the group's assignment when it is one not yet carried out."""
        assert self.channel is not None
        a = self.channel.assignment()
        if a is None or a.token == self.finished:
            return None
        retry = self.retry
        if retry is not None and retry[0] == a.token and time.monotonic() < retry[1]:
            return None  # backing off; a new assignment is taken at once
        return a

    def _holds(self, a: Assignment) -> Callable[[], bool] | None:
        """Rank 0: whether the group's assignment is still ``a`` (None on the other ranks)."""
        channel = self.channel
        if channel is None:
            return None
        return lambda: channel.assignment() == a

    def free_deleted_jobs(self) -> None:
        """Rank 0 of an idle group: drops the store rows of jobs deleted over REST."""
        from streamrec.embedding_store import EmbeddingStoreClient  # lazy: C++ extension

        assert self.channel is not None
        while (drop := self.channel.take_drop()) is not None:
            try:
                if (guard := self.agent_args.get("guard")) is not None:  # Redis is not trusted
                    guard.check_store_endpoints(drop.endpoints, "drop.endpoints")
                with EmbeddingStoreClient(list(drop.endpoints), namespace=drop.namespace) as c:
                    dropped = c.drop_namespace()
                log.info("deleted job's rows freed (namespace %s): %s", drop.namespace, dropped)
            except StreamRecError as exc:  # gone already (a shard restarted empty) or refused
                log.warning("namespace %s not dropped: %s", drop.namespace, exc)

    def run(self) -> int:
        """Waits for jobs and runs them, until the process is stopped."""
        self.start()
        try:
            while not self._stop.is_set():
                mine = self.next_assignment() if self.rank == 0 else None
                a = broadcast_assignment(mine, self.rank)
                if a is None:
                    if self.channel is not None:
                        self.free_deleted_jobs()
                    time.sleep(self.poll_s)
                    continue
                self.working_for(a.job_id)
                log.info("group %s runs job %s", self.name, a.job_id)
                agent = Agent(
                    self.redis_url,
                    a.job_id,
                    serve_metrics=False,
                    group=self.name,
                    still_assigned=self._holds(a),
                    generation=a.generation,
                    **self.agent_args,
                )
                try:
                    agent.run()
                except BadRequest as exc:
                    # a job this group cannot run: the agent reported it fatal, the API fails
                    # it with this message and clears the assignment; never tried again here
                    log.error("job %s cannot run on group %s: %s", a.job_id, self.name, exc)
                    self.finished = a.token
                except StreamRecError as exc:
                    # could not start (a shard not up yet): an event; the same assignment is
                    # tried again after a backoff while it stands, and the registration names
                    # no job meanwhile (stopping the job frees the group: the API clears the
                    # assignment, and a new one is taken at once)
                    again = self.retry is not None and self.retry[0] == a.token
                    self.failed_starts = self.failed_starts + 1 if again else 1
                    wait = min(60.0, 2.0**self.failed_starts)
                    self.retry = (a.token, time.monotonic() + wait)
                    log.error("job %s: %s; trying again in %.0f s", a.job_id, exc, wait)
                else:
                    self.failed_starts = 0
                    self.retry = None
                    self.finished = a.token
                # anything else (a peer died in a collective) ends the process: torchrun
                # restarts the whole group, which reads its assignment and goes on
                self.working_for(None)
                log.info("group %s is back in the pool", self.name)
        finally:
            self.close()
        return 0

    def close(self) -> None:
        self._stop.set()
        if self.channel is not None:
            try:
                self.channel.leave()
            except redis.RedisError as exc:  # the TTL ends the registration anyway
                log.warning("could not leave the pool: %s", exc)
            self.channel.r.close()
        ddp.shutdown()
