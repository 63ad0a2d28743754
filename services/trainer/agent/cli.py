"""``streamrec-trainer-agent``: a trainer rank under the control plane, from the command line.

Without ``--job-id`` the group joins the control plane's pool
(:class:`~.pool_member.PoolMember`) and runs the jobs it is given; with it,
the group is pinned to that job (:class:`~.loop.Agent`). The job guard's
flags (``--model-root``, ``--data-root``, ``--sampler-endpoint``, ``--store-endpoint`` or
``--store-endpoint-template`` with ``--store-shards``, ``--online-redis-url``) say what a job
read from Redis may make the group do (:mod:`.job_guard`).
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from streamrec.control import redis_io
from streamrec.errors import StreamRecError
from streamrec.trainer.agent.job_guard import JobGuard
from streamrec.trainer.agent.liveness import enable_fault_stacks, handle_sigterm
from streamrec.trainer.agent.loop import Agent
from streamrec.trainer.agent.pool_member import PoolMember, default_group_name

log = logging.getLogger("streamrec.trainer.agent")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="streamrec.trainer.agent", description="trainer rank driven by the control plane"
    )
    p.add_argument("--redis-url", required=True)
    p.add_argument(
        "--job-id",
        default=None,
        help="pin this group to one job (it exits when the job ends); without it the group "
        "joins the control plane's pool and runs the jobs it is given, one after another",
    )
    p.add_argument(
        "--group-name",
        default=None,
        help="the group's name in the pool, stable across restarts (default: "
        "$STREAMREC_GROUP_NAME, else the host name)",
    )
    p.add_argument(
        "--group-timeout-s",
        type=float,
        default=60.0,
        help="a pooled group's process-group timeout (its ranks' rendezvous; a step's "
        "collectives wait the job's distributed.timeout_s, a checkpoint's agreement its "
        "distributed.checkpoint_timeout_s)",
    )
    p.add_argument("--heartbeat-ttl-s", type=float, default=10.0)
    p.add_argument("--poll-ms", type=int, default=500)
    p.add_argument(
        "--stuck-timeout-s",
        type=float,
        default=300.0,
        help="exit (code 4) after working this long without progress (0: no watchdog)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics on this port + the local rank (0: a free port; default: the "
        "job's runner.metrics_port)",
    )
    p.add_argument("--metrics-host", default=None, help="address /metrics binds")
    p.add_argument(
        "--redis-password-file",
        default=None,
        help="file holding Redis's password (default: $STREAMREC_REDIS_PASSWORD_FILE)",
    )
    for flag, what in (
        ("--model-root", "a root a job's model_save_path must lie under"),
        ("--data-root", "a root a job's train_data_dir and sampler table must lie under"),
        ("--sampler-endpoint", "a sampler address a job may name (unset: the node-local one)"),
        ("--store-endpoint", "a store shard address a job may name (the peer token goes there)"),
        (
            "--online-redis-url",
            "a serving Redis a job may publish to (its password: the file "
            "$STREAMREC_ONLINE_REDIS_PASSWORD_FILE)",
        ),
    ):
        p.add_argument(flag, action="append", default=[], help=f"{what} (repeatable)")
    p.add_argument(
        "--store-endpoint-template",
        default=None,
        help="store shards a job may name, numbered: {shard} = 0 .. --store-shards - 1 "
        "(tcp://embedding-store-{shard}.embedding-store:5555)",
    )
    p.add_argument("--store-shards", type=int, default=None, help="the template's shard count")
    p.add_argument("--log-level", default="INFO")
    return p


def job_guard(args: argparse.Namespace) -> JobGuard:
    """The limits the guard flags of ``args`` set (a ValueError names a bad flag)."""
    return JobGuard.from_flags(
        args.model_root,
        args.data_root,
        args.sampler_endpoint,
        args.online_redis_url,
        args.store_endpoint,
        args.store_endpoint_template,
        args.store_shards,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=args.log_level.upper(), format=f"%(asctime)s rank{rank} %(name)s %(message)s"
    )
    # SIGTERM (a pod deleted, torchrun stopping the group): end cleanly, the pass in hand
    # released (Agent.close), not failed; the group leaves the pool
    handle_sigterm()
    enable_fault_stacks()
    try:
        guard = job_guard(args)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    if not guard.enforce:
        log.warning(
            "INSECURE: no --model-root/--data-root/--sampler-endpoint/--store-endpoint: the "
            "paths and endpoints of a job read from Redis are not checked by this trainer"
        )
    try:
        args.redis_url = redis_io.with_password(args.redis_url, args.redis_password_file)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    if redis_io.redacted(args.redis_url) == args.redis_url:  # no password in it
        log.warning(
            "INSECURE: Redis without a password (--redis-password-file or "
            "STREAMREC_REDIS_PASSWORD_FILE): whoever reaches it may rewrite this group's jobs"
        )
    agent_args: dict[str, Any] = {
        "guard": guard,
        "heartbeat_ttl_s": args.heartbeat_ttl_s,
        "poll_ms": args.poll_ms,
        "stuck_timeout_s": args.stuck_timeout_s or None,
    }
    group: PoolMember | Agent
    if args.job_id is None:  # a pooled group: the API assigns it jobs
        group = PoolMember(
            args.redis_url,
            args.group_name or default_group_name(),
            agent_args,
            poll_ms=args.poll_ms,
            ttl_s=args.heartbeat_ttl_s,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host or "127.0.0.1",
            group_timeout_s=args.group_timeout_s,
        )
    else:  # pinned to one job
        group = Agent(
            args.redis_url,
            args.job_id,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
            **agent_args,
        )
    try:
        return group.run()
    except StreamRecError as exc:
        log.error("%s", exc)
        return 2
