"""``streamrec-api serve``: the control plane under uvicorn."""

from __future__ import annotations

import argparse
import logging
import sys

from streamrec.api.errors import ApiConfigError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamrec-api", description="StreamRec control plane")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="serve the REST API (and run the scheduler)")
    s.add_argument("--host", default=None)
    s.add_argument("--port", type=int, default=None)
    s.add_argument("--redis-url", default=None)
    s.add_argument("--token-file", default=None, help="file holding the bearer token")
    s.add_argument(
        "--data-root",
        action="append",
        dest="data_roots",
        default=None,
        help="allowed root for job data (repeatable)",
    )
    s.add_argument(
        "--model-root",
        action="append",
        dest="model_roots",
        default=None,
        help="allowed root for job models (repeatable)",
    )
    s.add_argument(
        "--store-endpoint",
        action="append",
        dest="store_endpoints",
        default=None,
        help="a store shard endpoint jobs may name (repeatable; none: jobs may name none)",
    )
    s.add_argument(
        "--sampler-endpoint",
        action="append",
        dest="sampler_endpoints",
        default=None,
        help="a sampler endpoint jobs may name (repeatable; none: the node-local one only)",
    )
    s.add_argument(
        "--online-redis-url",
        action="append",
        dest="online_redis_urls",
        default=None,
        help="a serving Redis jobs may publish to, model.online.redis_url (repeatable)",
    )
    s.add_argument(
        "--default-online-redis-url",
        default=None,
        help="the serving Redis of a job that names none (its model.online.redis_url unset): "
        "the export trigger's mode online publishes there; allowed like --online-redis-url",
    )
    s.add_argument(
        "--metrics-host",
        action="append",
        dest="metrics_hosts",
        default=None,
        help="an address a job's model.runner.metrics_host may bind (repeatable; default: "
        "the loopback only)",
    )
    s.add_argument(
        "--redis-password-file",
        default=None,
        help="file holding Redis's password (default: $STREAMREC_REDIS_PASSWORD_FILE)",
    )
    s.add_argument(
        "--auth-reads",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the token on read endpoints too (the default; --no-auth-reads opens them)",
    )
    s.add_argument(
        "--auth-disabled",
        action="store_true",
        default=None,
        help="no token at all (local tests only)",
    )
    s.add_argument("--no-scheduler", action="store_false", dest="scheduler_enabled", default=None)
    s.add_argument("--scheduler-interval-s", type=float, default=None)
    s.add_argument("--log-level", default="info")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    import uvicorn
    from streamrec.api.app import create_app
    from streamrec.api.config import Settings

    overrides = {
        k: v for k, v in vars(args).items() if k not in ("cmd", "log_level") and v is not None
    }
    try:
        settings = Settings.load(overrides)
    except ApiConfigError as exc:
        print(f"streamrec-api: {exc}", file=sys.stderr)
        return 2
    app = create_app(settings)
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=args.log_level, access_log=False
    )
    server = uvicorn.Server(config)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
