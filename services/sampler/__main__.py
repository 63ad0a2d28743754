"""``streamrec-sampler``: run the node-local sampler server, or ping one.

streamrec-sampler serve [--endpoint ipc:///run/x.sock | tcp://0.0.0.0:5560]
                        [--metrics-port 9102] [--workers 1] [--seed 7] ...
streamrec-sampler ping  [--endpoint ...]

Requests carry the peer token of --auth-token-file (default $STREAMREC_AUTH_TOKEN_FILE, else a
per-user file); --insecure-no-auth serves without one (local development only).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from streamrec.errors import StreamRecError
from streamrec.sampler.config import ServerConfig, default_endpoint


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamrec-sampler",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the sampler server in the foreground")
    serve.add_argument(
        "--endpoint",
        help="ipc://PATH or tcp://HOST:PORT "
        "(default: $STREAMREC_SAMPLER_ENDPOINT or a per-user ipc socket)",
    )
    serve.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics here")
    serve.add_argument("--metrics-host", help="address of the metrics listener")
    serve.add_argument("--workers", type=int, help="request threads")
    serve.add_argument("--max-message-bytes", type=int, help="cap on one request")
    serve.add_argument("--max-rounds", type=int, help="conflict redraw rounds")
    serve.add_argument("--max-negatives", type=int, help="cap on negatives per request")
    serve.add_argument("--seed", type=int, help="seed of the random streams")
    serve.add_argument("--auth-token-file", help="file holding the peer token")
    serve.add_argument(
        "--idle-exit-s",
        type=float,
        help="exit after this long with no client connected and no request (0: never)",
    )
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        default=None,
        help="serve requests without a token: local development only",
    )
    serve.add_argument("--log-level", default="INFO")
    ping = sub.add_parser("ping", help="ask a running server who it is")
    ping.add_argument("--endpoint")
    ping.add_argument("--timeout", type=float, default=5.0)
    ping.add_argument("--auth-token-file", help="file holding the peer token")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            from streamrec.sampler.server import serve

            logging.basicConfig(
                level=args.log_level.upper(),
                format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            )
            fields = {
                k: v
                for k, v in vars(args).items()
                if k not in ("command", "log_level") and v is not None
            }
            serve(ServerConfig.parse(fields, source="streamrec-sampler serve"))
            return 0
        from streamrec.auth import load_token
        from streamrec.wire import RpcClient

        token = load_token(args.auth_token_file)
        endpoint = args.endpoint or default_endpoint()
        with RpcClient(endpoint, timeout_s=args.timeout, token=token) as client:
            meta, _ = client.call("ping")
        print(json.dumps(meta))
        return 0
    except StreamRecError as exc:
        print(f"streamrec-sampler: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
