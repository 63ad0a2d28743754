"""``streamrec up`` / ``streamrec down``: the whole stack on one machine, from one command.

``streamrec up`` starts, as local processes in a run directory (logs under ``RUN/logs``)::

    redis-server        append-only file under RUN/redis, free local port
    serving-redis       redis-server that online exports publish to (RUN/serving-redis, a
                        password of its own; --online-redis-url names another instead)
    embedding-store     --store-shards shards (streamrec-embedding-store serve), on the
                        --store-tier (ssd: files under RUN/store behind a RAM cache)
    sampler             streamrec-sampler serve on an ipc socket
    streamrec-api       the control plane (token in RUN/api-token)
    prometheus          with --prometheus: scrapes them all, evaluates the alert rules
    streamrec-datagen   a planted stream under RUN/data (optionally paced: --rate)
    trainers-<k>        --trainer-groups groups in the control plane's pool, each
                        torchrun --standalone --nproc-per-node --trainers --max-restarts 10
                        -m streamrec.trainer.agent --group-name trainers-<k> (no job: the API
                        gives each group a running job that fits, one at a time)

Every service serves Prometheus /metrics on a local port (the API on its own); RUN/stack.json
lists them (``metrics``: job name -> host:port list) and the Prometheus URL
(``prometheus_url``).

then submits the demo job over REST and starts it (the pool takes it), prints one row per
finished pass (AUC before and after training against the best AUC the planted truth allows),
and ends with a summary.
A child that exits is reported and restarted at the same address (``--max-restarts`` each):
Redis from its append-only file, a store shard followed by the trainer groups (whose warm
start reloads the last checkpoint into every shard; see ``streamrec.launcher.stack``).
``--keep-running`` leaves the services up after the summary until ``streamrec down`` (or
Ctrl-C). ``--resume`` goes on with the run in ``--run-dir`` instead of a fresh one: its data,
models and Redis kept, its job from the last checkpoint on ``--store-shards`` shards
(resharded when their count changed; ``streamrec.launcher.resume``).

    streamrec up --days 2 --split-interval 120 --samples-per-split 10000   # the defaults
    streamrec down
    streamrec up --resume --store-shards 3   # the same run's job, from its last checkpoint
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from urllib.parse import urlsplit

from streamrec.errors import StreamRecError, quote
from streamrec.launcher.errors import StackError
from streamrec.launcher.resume import ResumedStack
from streamrec.launcher.stack import Stack
from streamrec.launcher.state import stack_down
from streamrec.layout import parse_day


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamrec", description="StreamRec on one machine")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the stack, run the demo job, print the summary")
    up.add_argument("--run-dir", default=".run/streamrec", help="state, data, models, logs")
    up.add_argument("--redis-port", type=int, default=0, help="0: a free port")
    up.add_argument("--api-port", type=int, default=0, help="0: a free port")
    up.add_argument(
        "--store-port",
        type=int,
        default=0,
        help="first store shard port (shard k: +k); 0: free ports",
    )
    up.add_argument("--store-shards", type=int, default=2)
    up.add_argument(
        "--store-tier",
        choices=["host", "ssd"],
        default="host",
        help="where the shards keep the rows (ssd: files under RUN/store, a RAM cache)",
    )
    up.add_argument(
        "--cache-budget-mb",
        type=float,
        default=None,
        help="RAM cache per table of the ssd tier, MiB (default 1)",
    )
    up.add_argument("--trainers", type=int, default=2, help="ranks per trainer group (torchrun)")
    up.add_argument(
        "--trainer-groups",
        type=int,
        default=2,
        help="trainer groups in the control plane's pool (each runs one job at a time)",
    )
    up.add_argument("--start-day", default="20190720")
    up.add_argument("--days", type=int, default=2)
    up.add_argument("--split-interval", type=int, default=120, help="minutes per split")
    up.add_argument("--split-per-pass", type=int, default=1)
    up.add_argument("--samples-per-split", type=int, default=10000)
    up.add_argument("--slots", type=int, default=8, help="sparse features (tables)")
    up.add_argument("--embedding-dim", type=int, default=8)
    up.add_argument("--batch-size", type=int, default=256)
    up.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="splits landing per second (0: as fast as they are generated)",
    )
    up.add_argument("--seed", type=int, default=7)
    up.add_argument("--timeout-s", type=float, default=600, help="give up after this long")
    up.add_argument("--max-restarts", type=int, default=2, help="per restartable child")
    up.add_argument(
        "--prometheus",
        action="store_true",
        help="also run Prometheus (/usr/bin/prometheus) scraping every service, with the "
        "alert rules; its URL is printed and in RUN/stack.json",
    )
    up.add_argument(
        "--online-redis-url",
        default=None,
        help="the serving Redis online exports publish to (redis://host:port/db, no password "
        "in it); default: one the stack runs, on a free port with its own password",
    )
    up.add_argument(
        "--online-redis-password-file",
        default=None,
        help="file holding the --online-redis-url Redis's password (default: none)",
    )
    up.add_argument(
        "--resume",
        action="store_true",
        help="go on with the run in --run-dir (its data, models, Redis; its job from the last "
        "checkpoint, on --store-shards shards: resharded when their count changed); the "
        "job's sizes are the run's",
    )
    up.add_argument(
        "--keep-running",
        action="store_true",
        help="leave the services up after the summary, until `streamrec down`",
    )
    down = sub.add_parser("down", help="stop a stack started by `streamrec up`")
    down.add_argument("--run-dir", default=".run/streamrec")
    return p


def check_args(args: argparse.Namespace) -> None:
    """Refuses bad sizes with the flag and the value."""
    for flag in (
        "store_shards",
        "trainers",
        "trainer_groups",
        "days",
        "split_per_pass",
        "samples_per_split",
        "slots",
        "embedding_dim",
        "batch_size",
    ):
        v = getattr(args, flag)
        if v < 1:
            raise StackError(f"--{flag.replace('_', '-')} must be >= 1, got {v}")
    for flag in ("redis_port", "api_port", "store_port"):
        v = getattr(args, flag)
        if not 0 <= v <= 65535:
            raise StackError(f"--{flag.replace('_', '-')} must be a port (0: free), got {v}")
    try:
        parse_day(args.start_day)
    except ValueError as exc:
        raise StackError(f"--start-day: {exc}") from None
    if not (0 < args.split_interval <= 1440 and 1440 % args.split_interval == 0):
        raise StackError(f"--split-interval must divide 1440, got {args.split_interval}")
    if args.cache_budget_mb is not None:
        if args.store_tier != "ssd":
            raise StackError("--cache-budget-mb applies to --store-tier ssd only")
        if args.cache_budget_mb <= 0:
            raise StackError(f"--cache-budget-mb must be > 0, got {args.cache_budget_mb}")
    check_online_redis(args.online_redis_url, args.online_redis_password_file)
    if args.rate < 0 or args.timeout_s <= 0:
        raise StackError(
            f"--rate must be >= 0 and --timeout-s > 0, got {args.rate}, {args.timeout_s}"
        )


def check_online_redis(url: str | None, password_file: str | None) -> None:
    """``--online-redis-url``: a redis:// URL without a password (jobs and the allow-lists
    name it; the password goes in ``--online-redis-password-file``, which needs the URL)."""
    if url is None:
        if password_file is not None:
            raise StackError("--online-redis-password-file needs --online-redis-url")
        return
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("redis", "rediss") and bool(parts.hostname) and not parts.password
    except ValueError:
        ok = False
    if not ok:
        raise StackError(
            f"--online-redis-url must be redis://host:port/db without a password (that goes "
            f"in --online-redis-password-file), got {quote(url)}"
        )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "down":
        return stack_down(Path(args.run_dir).resolve())
    try:
        check_args(args)
        if args.resume:  # the job's flags are the run's: their defaults tell what was given
            defaults = vars(build_parser().parse_args(["up"]))
            stack: Stack = ResumedStack(args, defaults)
        else:
            stack = Stack(args)
    except StackError as exc:
        print(f"streamrec up: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, stack.request_stop)
    signal.signal(signal.SIGINT, stack.request_stop)
    try:
        return stack.up()
    except StreamRecError as exc:
        print(f"streamrec up: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.say("stopping the stack ...")
        stack.down()


if __name__ == "__main__":
    sys.exit(main())
