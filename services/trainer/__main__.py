"""``streamrec-trainer``: run a job, export a serving model, or score files with one.

Examples::

    streamrec-trainer --config job.yaml                      # the whole job (warm start first)
    streamrec-trainer --config job.yaml --learning-rate 0.05 --end-day 20190722
    streamrec-trainer export --config job.yaml --out serving/  # newest checkpoint -> serving
    streamrec-trainer export --config job.yaml --online        # ... -> the serving Redis
    streamrec-trainer predict --model serving/ --data part-00000 --out scores.txt

A run prints a line per pass (the demo's: day, pass, samples, predict/train AUC, logloss,
seconds; ``--quiet`` turns them off) and, at its end, where it stopped.

Every runner and hyper_parameters field of the config is also a flag (``--arch-mlp-bot``,
``--split-per-pass``, ...), overriding the file. Run several ranks with torchrun::

    torchrun --nproc-per-node 2 -m streamrec.trainer --config job.yaml

This module alone calls ``sys.exit``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any, get_args

import yaml
from streamrec.config import read_yaml_mapping
from streamrec.control.trainer_config import DataFormat, TrainerConfig, flag_fields
from streamrec.errors import BadRequest, StreamRecError
from streamrec.pass_line import PASS_HEADER, pass_row
from streamrec.trainer.agent.liveness import enable_fault_stacks
from streamrec.trainer.errors import ConfigError

log = logging.getLogger("streamrec.trainer")


def _train_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="DLRM trainer over streaming passes")
    p.add_argument("--config", help="job YAML (PaddleRec config_online.yaml shape)")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--quiet", action="store_true", help="no line per pass")
    for flag, (section, name) in flag_fields().items():
        p.add_argument(
            "--" + flag,
            dest=f"{section}.{name}",
            default=None,
            metavar="VALUE",
            help=f"{section}.{name}",
        )
    return p


def load_config(args: argparse.Namespace) -> TrainerConfig:
    """The YAML file (if any) with every given flag applied on top, validated."""
    data: dict[str, Any] = {}
    if args.config:
        try:
            data = read_yaml_mapping(args.config)
        except BadRequest as exc:
            raise ConfigError(str(exc)) from exc
    for key, raw in vars(args).items():
        if "." not in key or raw is None:
            continue
        section, name = key.split(".", 1)
        value = yaml.safe_load(raw) if raw != "" else None
        if name in ("start_day", "end_day", "end_split"):
            value = str(raw)
        sec = data.setdefault(section, {})
        if not isinstance(sec, dict):
            raise ConfigError(f"{section} must be a mapping, got {sec!r}")
        sec[name] = value
    return TrainerConfig.parse(data, source=args.config or "flags")


def cmd_train(argv: list[str]) -> int:
    args = _train_parser("streamrec-trainer").parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    from streamrec.trainer.runner import OnlineTrainer

    config = load_config(args)
    with OnlineTrainer(config) as trainer:
        rank0 = trainer.rank == 0
        progress = ProgressLines() if rank0 and not args.quiet else None
        plan = trainer.run(progress)
        if rank0:
            last = trainer.last_pass
            print(
                f"streamrec-trainer: done: {plan.describe()}; model at pass "
                f"{'-' if last is None else f'{last[0]}/{last[1]}'} under "
                f"{config.runner.model_save_path}",
                flush=True,
            )
    return 0


class ProgressLines:
    """Prints the demo's row of each finished pass (its header first) to stdout, flushed:
    on a terminal as in a log file."""

    def __init__(self) -> None:
        self.started = False

    def __call__(self, record: dict[str, Any]) -> None:
        if not self.started:
            print(PASS_HEADER, flush=True)
            self.started = True
        print(pass_row(record), flush=True)


def cmd_export(argv: list[str]) -> int:
    p = _train_parser("streamrec-trainer export")
    p.add_argument("--out", default=None, help="serving model directory to write (int8)")
    p.add_argument(
        "--online",
        nargs="?",
        const="",
        default=None,
        metavar="REDIS_URL",
        help="publish a base of the model to the serving Redis: REDIS_URL, else the config's "
        "online.redis_url (keys under online.prefix)",
    )
    args = p.parse_args(argv)
    if args.out is None and args.online is None:
        p.error("give --out DIR (the int8 serving model), --online (the serving Redis) or both")
    from streamrec.trainer.model.online import export_online
    from streamrec.trainer.runner import OnlineTrainer

    config = load_config(args)
    if args.online:
        online = config.online.model_dump() | {"redis_url": args.online}
        config = TrainerConfig.parse(
            config.model_dump(mode="json") | {"online": online}, source="--online"
        )
    result: dict[str, Any] = {}
    with OnlineTrainer(config) as trainer:
        if trainer.warm_start() is None:
            raise ConfigError(
                f"no complete checkpoint under {trainer.config.runner.model_save_path} to export"
            )
        if args.out is not None:
            result["exported"] = str(trainer.export_serving(args.out))
        if args.online is not None:
            result["online"] = export_online(trainer)
    print(json.dumps({**result, "last_pass": trainer.last_pass}))
    return 0


def cmd_predict(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="streamrec-trainer predict", description="score data files with an exported model"
    )
    p.add_argument("--model", required=True, help="directory written by export")
    p.add_argument("--delta", action="append", default=[], help="delta model dir (repeat)")
    p.add_argument(
        "--data", action="extend", nargs="+", required=True, help="data files (or repeat)"
    )
    p.add_argument(
        "--data-format",
        choices=list(get_args(DataFormat)),
        default=None,
        help="default: the model's (parquet and slot read by the model's schema)",
    )
    p.add_argument("--out", default=None, help="write one probability per line here")
    p.add_argument("--batch-size", type=int, default=4096)
    args = p.parse_args(argv)
    from streamrec.trainer.model.export import Predictor

    pred = Predictor(args.model, args.delta)
    try:
        res = pred.score_files(
            [Path(f) for f in args.data],
            Path(args.out) if args.out else None,
            args.data_format,
            args.batch_size,
        )
    finally:
        pred.close()
    print(json.dumps(res))
    if res["held_out"] is False:
        print(
            f"streamrec-trainer predict: note: the model was trained on "
            f"{len(res['trained_on'])} of these {len(args.data)} file(s): the AUC is "
            f"in-sample, not a held-out evaluation (score a later split for that)",
            file=sys.stderr,
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    enable_fault_stacks()
    commands = {"predict": cmd_predict, "export": cmd_export, "train": cmd_train}
    cmd = commands.get(argv[0]) if argv else None
    try:
        return cmd(argv[1:]) if cmd else cmd_train(argv)
    except (StreamRecError, OSError) as exc:
        print(f"streamrec-trainer: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
