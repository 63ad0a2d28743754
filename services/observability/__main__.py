"""``python -m streamrec.observability generate [--check] [--root DIR]``.

Writes every generated file (alert rules, PrometheusRule, dashboards) from its Python source,
or with ``--check`` (CI) regenerates in memory and exits 1 naming the first stale file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from streamrec.observability.generated import StaleGeneratedFile

#: The repository root when run from a checkout (services/observability/ is two levels down).
DEFAULT_ROOT = Path(__file__).resolve().parents[2]


def generate(root: Path, check: bool) -> list[Path]:
    """Writes (or checks) the alert files then the dashboards; returns their paths.

    Raises:
        StaleGeneratedFile: ``check`` and a committed file is missing or differs.
    """
    # Imported here: the dashboards pull in grafana-foundation-sdk, needed only to generate.
    from streamrec.observability import alerts, dashboards

    return [*alerts.write_generated(root, check), *dashboards.write_generated(root, check)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m streamrec.observability",
        description="Generate the committed alert rules and Grafana dashboards.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="write (or --check) every generated file")
    gen.add_argument(
        "--check", action="store_true", help="compare instead of writing; exit 1 if stale"
    )
    gen.add_argument(
        "--root", type=Path, default=DEFAULT_ROOT, help="repository root (default: this checkout)"
    )
    args = parser.parse_args(argv)
    try:
        paths = generate(args.root, args.check)
    except StaleGeneratedFile as e:
        print(e, file=sys.stderr)  # names the file and the command that fixes it
        return 1
    verb = "up to date" if args.check else "wrote"
    for path in paths:
        print(f"{verb}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
