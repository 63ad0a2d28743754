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
from streamrec.errors import StreamRecError
from streamrec.metrics import serve_metrics
from streamrec.trainer import distributed as ddp

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
        agent_args: what each job's :class:`~streamrec.trainer.agent.Agent` is made with
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
        #: The token of the last assignment carried out (not to be run again).
        self.finished: str | None = None
        #: Tries in a row that ended in an error (the backoff before the next).
        self.failed_starts = 0
        self._stop = threading.Event()
        self.channel: PoolChannel | None = None

    def _renew(self) -> None:
        assert self.channel is not None
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.channel.register(self.job_id)
            except redis.RedisError as exc:  # a blip: the next renewal may succeed
                log.warning("pool registration failed: %s", exc)

    def start(self) -> None:
        """Joins the process group, serves /metrics, registers (rank 0)."""
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        ddp.init_from_env(backend, self.group_timeout_s)
        if self.metrics_port is not None:
            local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
            port = self.metrics_port + local_rank if self.metrics_port else 0
            bound = serve_metrics(port, self.metrics_host)
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
        return a

    def _holds(self, a: Assignment) -> Callable[[], bool] | None:
        """Rank 0: whether the group's assignment is still ``a`` (None on the other ranks)."""
        channel = self.channel
        if channel is None:
            return None
        return lambda: channel.assignment() == a

    def free_deleted_jobs(self) -> None:
        """Rank 0 of an idle group: drops the store rows of jobs deleted over REST."""
        from streamrec.embedding_store import EmbeddingStoreClient

        assert self.channel is not None
        while (drop := self.channel.take_drop()) is not None:
            try:
                with EmbeddingStoreClient(list(drop.endpoints), namespace=drop.namespace) as c:
                    dropped = c.drop_namespace()
                log.info("deleted job's rows freed (namespace %s): %s", drop.namespace, dropped)
            except StreamRecError as exc:  # gone already (a shard restarted empty) or refused
                log.warning("namespace %s not dropped: %s", drop.namespace, exc)

    def run(self) -> int:
        """Waits for jobs and runs them, until the process is stopped."""
        from streamrec.trainer.agent import Agent

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
                self.job_id = a.job_id
                if self.channel is not None:
                    self.channel.register(a.job_id)
                log.info("group %s runs job %s", self.name, a.job_id)
                agent = Agent(
                    self.redis_url,
                    a.job_id,
                    serve_metrics=False,
                    group=self.name,
                    still_assigned=self._holds(a),
                    **self.agent_args,
                )
                try:
                    agent.run()
                except StreamRecError as exc:
                    # a job this group cannot run fails (the agent reported it fatal and the
                    # API clears the assignment); another error (a shard not up yet) is an
                    # event: the same assignment is tried again after a backoff
                    self.failed_starts += 1
                    wait = min(60.0, 2.0**self.failed_starts)
                    log.error("job %s: %s; trying again in %.0f s", a.job_id, exc, wait)
                    self._stop.wait(wait)
                    continue
                # anything else (a peer died in a collective) ends the process: torchrun
                # restarts the whole group, which reads its assignment and goes on
                self.failed_starts = 0
                self.finished = a.token
                self.job_id = None
                if self.channel is not None:
                    self.channel.register(None)
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
