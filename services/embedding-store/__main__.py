# ruff: noqa: N999 (the directory is services/embedding-store, installed as embedding_store)
"""``streamrec-embedding-store serve ...``: runs one shard of the embedding store.

Example::

    streamrec-embedding-store serve --shard-id 0 --num-shards 2 \\
        --endpoint tcp://127.0.0.1:5555 --tables tables.yaml --metrics-port 9100

``--tables`` fills the default namespace; without it the shard starts empty and serves the
namespaces its clients create (``create_tables``, one per job).

Requests must carry the peer token (``--auth-token-file``, see :mod:`streamrec.auth`;
``--insecure-no-auth`` turns that off for local development); ``save``/``load`` paths must
lie under a ``--model-root`` (none given: the shard saves and loads nothing).

Once serving, the process prints ``READY <endpoint> metrics=<port|none>`` on stdout (a bound
``tcp://host:*`` endpoint shows its real port there). SIGTERM or SIGINT stops it cleanly.
This module alone calls ``sys.exit``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading

import zmq
from streamrec.errors import BadRequest, StreamRecError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="streamrec-embedding-store",
        description="Embedding-store shard (sparse parameter server)",
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve one shard over ZeroMQ")
    s.add_argument(
        "--shard-id",
        required=True,
        help="K, this shard's index; 'from-hostname' takes it from a StatefulSet pod name "
        "ending in -K",
    )
    s.add_argument("--num-shards", type=int, required=True, help="N, shards in the store")
    s.add_argument(
        "--endpoint",
        required=True,
        help="ZeroMQ bind address (tcp://127.0.0.1:5555, tcp://127.0.0.1:*, ipc://..)",
    )
    s.add_argument(
        "--tables",
        default=None,
        help="tables file, YAML or JSON: the default namespace's tables (none: the shard "
        "serves only the namespaces its clients create)",
    )
    s.add_argument(
        "--max-namespaces",
        type=int,
        default=None,
        help="namespaces (one per job) held at once besides the default one (default 64)",
    )
    s.add_argument(
        "--tier",
        default="host",
        choices=["host", "ssd", "device"],
        help="where rows live: RAM, a file with a RAM cache, or GPU memory (needs a CUDA GPU)",
    )
    s.add_argument(
        "--persistent-path", default=None, help="ssd tier root; this shard uses <path>/shard-K-of-N"
    )
    s.add_argument(
        "--cache-budget-mb", type=float, default=None, help="RAM cache of each table (ssd tier)"
    )
    s.add_argument(
        "--gpu-cache-budget-mb",
        type=float,
        default=None,
        help="GPU memory caching each table's hot rows (tiers host and ssd; needs a CUDA GPU)",
    )
    s.add_argument(
        "--device",
        default=None,
        help="the device of tier device or of the GPU cache: cuda, cuda:N (default: the "
        "current one); cpu runs the CUDA kernels' CPU build (tests)",
    )
    s.add_argument("--capacity", type=int, default=None, help="upper bound on rows (ssd tier)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--num-threads", type=int, default=None, help="compute threads of the store")
    s.add_argument("--workers", type=int, default=2, help="RPC worker threads")
    s.add_argument("--max-message-bytes", type=int, default=1 << 30)
    s.add_argument("--metrics-port", type=int, default=None, help="0 picks a free port")
    s.add_argument("--metrics-host", default="127.0.0.1")
    s.add_argument(
        "--redis-url", default=None, help="serving KV store for base/delta (converter 'redis')"
    )
    s.add_argument("--redis-prefix", default="streamrec:emb")
    s.add_argument(
        "--model-root",
        action="append",
        dest="model_roots",
        default=[],
        help="directory that save/load paths must lie under (repeatable); without one the "
        "shard saves and loads nothing",
    )
    s.add_argument(
        "--auth-token-file",
        default=None,
        help="file holding the peer token every request must carry (default: "
        "$STREAMREC_AUTH_TOKEN_FILE, else a per-user file in the runtime directory)",
    )
    s.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve requests without a token: local development only",
    )
    s.add_argument("--log-level", default="INFO")
    return p


def shard_id_arg(value: str, hostname: str | None = None) -> int | str:
    """``--shard-id``: an integer, or ``from-hostname`` (``store-3`` -> 3).

    Anything else is handed on as given, so the config check names the bad value.
    """
    if value == "from-hostname":
        host = hostname if hostname is not None else socket.gethostname()
        tail = host.rsplit("-", 1)[-1]
        if not tail.isdigit():
            raise BadRequest(f"--shard-id from-hostname: hostname {host!r} does not end in -K")
        return int(tail)
    return int(value) if value.lstrip("-").isdigit() else value


def check_ordinal(shard_id: int | str, num_shards: int) -> None:
    """BadRequest when ``shard_id`` is a shard number not below ``num_shards``: before anything
    is read, naming the Kubernetes trap that makes one (a StatefulSet pod's ordinal is its
    ``--shard-id``; its replicas changed where components/counts does not copy them into
    ``--num-shards``)."""
    if isinstance(shard_id, int) and shard_id >= num_shards >= 1:
        raise BadRequest(
            f"--shard-id {shard_id} is not below --num-shards {num_shards}: there is no shard "
            f"{shard_id} of {num_shards}. In Kubernetes, the embedding-store StatefulSet's "
            f"replicas were changed where components/counts does not copy them into "
            f"NUM_SHARDS: list deploy/k8s/components/counts in the components of the "
            f'kustomization that sets `replicas:` (deploy/k8s/README.md, "Sizes")'
        )


def serve(args: argparse.Namespace) -> int:
    shard_id = shard_id_arg(args.shard_id)
    check_ordinal(shard_id, args.num_shards)  # at once, before the store's imports
    from streamrec.embedding_store.service.config import ShardConfig, read_tables_file
    from streamrec.embedding_store.service.server import Shard

    config = ShardConfig.parse(
        {
            "shard_id": shard_id,
            "num_shards": args.num_shards,
            "endpoint": args.endpoint,
            "tables": [] if args.tables is None else read_tables_file(args.tables),
            "tier": args.tier,
            "persistent_path": args.persistent_path,
            "cache_budget_mb": args.cache_budget_mb,
            "gpu_cache_budget_mb": args.gpu_cache_budget_mb,
            "device": args.device,
            "capacity": args.capacity,
            "seed": args.seed,
            "num_threads": args.num_threads,
            "workers": args.workers,
            "max_message_bytes": args.max_message_bytes,
            "metrics_port": args.metrics_port,
            "metrics_host": args.metrics_host,
            "redis_url": args.redis_url,
            "redis_prefix": args.redis_prefix,
            "model_roots": args.model_roots,
            "auth_token_file": args.auth_token_file,
            "insecure_no_auth": args.insecure_no_auth,
            **({} if args.max_namespaces is None else {"max_namespaces": args.max_namespaces}),
        },
        source="command line",
    )
    shard = Shard(config).start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    metrics = shard.metrics_port if shard.metrics_port is not None else "none"
    print(f"READY {shard.endpoint} metrics={metrics}", flush=True)
    logging.getLogger("streamrec.embedding_store").info(
        "shard %d of %d serving %s on %s",
        config.shard_id,
        config.num_shards,
        [t.name for t in config.tables],
        shard.endpoint,
    )
    while not stop.wait(0.5):
        pass
    shard.stop()
    return 0


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        code = serve(args)
    except StreamRecError as exc:
        print(f"streamrec-embedding-store: {exc}", file=sys.stderr)
        code = 2
    except (zmq.ZMQError, OSError) as exc:  # endpoint or metrics port taken, bad address
        print(f"streamrec-embedding-store: cannot serve: {exc}", file=sys.stderr)
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()
