"""Chaos run: kills and freezes of the stack's services at random for as long as asked, then
the verdict.

On a `streamrec up --keep-running` stack in ``--run-dir`` (one trainer group of
``--trainers`` ranks, 2 store shards) a job over REST, its data landing one split every
``--pass-seconds`` for ``--minutes`` (the job cannot finish sooner),
``--checkpoint-per-pass``; meanwhile a fault of one of ``--kinds`` every ``--interval``
seconds (for ``--pass-done-share`` of them, after that, the instant the next ``pass_done``
report of a pass no checkpoint holds lands in Redis), each kind killed once first, in a
seeded order. A fault is a kill -9, or for
``--freeze-share`` of them a freeze (SIGSTOP, SIGCONT ``--freeze-seconds`` later); for
``--double-share`` of them a second fault of another kind follows within a second.
Meanwhile ``--pollers`` REST clients read the job, its passes, events, triggers and
``/metrics``, and every ``--export-every`` seconds an online export is asked for; the days
(``--split-interval`` minutes a split) end with a shrink and a base model, a delta model
every ``--delta-every`` passes. Then the
same job without faults over the same data, and a summary: faults and recoveries per kind
and way (the fault -> the end of the first pass handed out after it), the longest time
without a pass done, whether REST, ``passes.jsonl``
and the checkpoints agree pass by pass (every row in ``RUN/chaos-passes.txt``, the failing
ones printed), the mean predict AUC against the no-fault run, the REST answers by status
(a 5xx is a defect, but a 503 saying when to ask again) and the exports' outcomes, and
whether the model is the no-fault run's bit for bit, checkpoint by checkpoint. With
``--push-order rank`` (the job's ``runner.sparse_push_order``) the model of a run repeats
bit for bit, so it must be: a difference is state a recovery lost or applied twice. Exit
code 0: the job succeeded, all agree, no 5xx, and in rank order the model is the no-fault
one; 1: not; 2: bad arguments.

    .venv/bin/python tools/chaos.py --minutes 5 --seed 7
    .venv/bin/python tools/chaos.py --minutes 30 --interval 20 60 --run-dir /tmp/chaos
    .venv/bin/python tools/chaos.py --minutes 120 --freeze-share 0.5 --double-share 0.2 \
        --split-interval 5 --pass-seconds 4 --delta-every 6 --pollers 2 --export-every 300 \
        --push-order rank

The code is shared with ``tests/e2e/test_chaos.py`` (``tests/e2e/chaos_harness.py``,
``tests/e2e/chaos_checks.py``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "e2e")]

from chaos_checks import (  # noqa: E402
    agreement,
    kept_records,
    mean_predict_auc,
    read_records,
    same_model,
)
from chaos_clients import RestClients  # noqa: E402
from chaos_harness import (  # noqa: E402
    KINDS,
    Schedule,
    Stack,
    run_chaos,
    summary,
    with_push_order,
)
from streamrec.layout import format_day, parse_day, split_names  # noqa: E402

START_DAY = "20190720"  # `streamrec up`'s


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="chaos.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=5.0, help="how long the faults go on")
    p.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    p.add_argument("--run-dir", type=Path, default=Path(".run/chaos"))
    p.add_argument(
        "--interval",
        type=float,
        nargs=2,
        default=(20.0, 60.0),
        metavar=("MIN", "MAX"),
        help="seconds between two faults (uniform)",
    )
    p.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help=f"comma-separated kinds to kill, of {','.join(KINDS)}",
    )
    p.add_argument(
        "--pass-done-share",
        type=float,
        default=0.4,
        help="share of the faults made, after the interval, the instant a pass_done report lands",
    )
    p.add_argument(
        "--freeze-share", type=float, default=0.0, help="share of the faults that are freezes"
    )
    p.add_argument(
        "--freeze-seconds",
        type=float,
        nargs=2,
        default=(5.0, 60.0),
        metavar=("MIN", "MAX"),
        help="how long a freeze lasts (uniform)",
    )
    p.add_argument(
        "--double-share",
        type=float,
        default=0.0,
        help="share of the faults followed within a second by one of another kind",
    )
    p.add_argument("--checkpoint-per-pass", type=int, default=4)
    p.add_argument(
        "--pass-seconds",
        type=float,
        default=2.0,
        help="a split (a pass) lands every this many seconds: the job has minutes*60/this passes",
    )
    p.add_argument("--samples-per-split", type=int, default=300)
    p.add_argument(
        "--push-order",
        choices=("arrival", "rank"),
        default="arrival",
        help="the job's runner.sparse_push_order (rank: the model repeats bit for bit, so a "
        "run with faults can be compared with its no-fault twin checkpoint by checkpoint)",
    )
    p.add_argument(
        "--trainers",
        type=int,
        default=2,
        help="ranks of the trainer group (1: a run whose model is bit for bit repeatable)",
    )
    p.add_argument(
        "--split-interval",
        type=int,
        default=1,
        help="minutes of a day a split (a pass) covers: a day ends every 1440/this passes",
    )
    p.add_argument(
        "--delta-every", type=int, default=0, help="save_delta_frequency (0: no delta models)"
    )
    p.add_argument("--pollers", type=int, default=2, help="REST clients polling the job")
    p.add_argument(
        "--export-every",
        type=float,
        default=0.0,
        help="seconds between two online exports asked over REST (0: none)",
    )
    p.add_argument("--no-baseline", action="store_true", help="skip the no-fault run")
    p.add_argument(
        "--no-faults",
        action="store_true",
        help="the job (named nofault) and its clients without faults: a baseline to run "
        "beside a chaos run (a long one), on a stack of its own",
    )
    p.add_argument(
        "--baseline-model",
        type=Path,
        help="the model directory of a --no-faults run of the same flags (RUN/models/nofault): "
        "the baseline, instead of a no-fault job after the chaos",
    )
    p.add_argument("--every-row", action="store_true", help="print every pass's row")
    return p


def check(args: argparse.Namespace) -> tuple[str, ...]:
    """The kinds asked for; ValueError naming the flag and the value when one is bad."""
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"--kinds must be some of {','.join(KINDS)}, got {args.kinds!r}")
    for flag in ("minutes", "pass_seconds"):
        if not getattr(args, flag) > 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be > 0, got {getattr(args, flag)}")
    if args.split_interval < 1 or 1440 % args.split_interval:
        raise ValueError(f"--split-interval must divide 1440, got {args.split_interval}")
    for flag in ("delta_every", "pollers"):
        if getattr(args, flag) < 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag)}")
    if args.export_every < 0:
        raise ValueError(f"--export-every must be >= 0, got {args.export_every}")
    for flag in ("checkpoint_per_pass", "samples_per_split", "trainers"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    for flag in ("interval", "freeze_seconds"):
        lo, hi = getattr(args, flag)
        if not 0 <= lo <= hi:
            raise ValueError(f"--{flag.replace('_', '-')} must be 0 <= MIN <= MAX, got {lo} {hi}")
    for flag in ("pass_done_share", "freeze_share", "double_share"):
        if not 0 <= getattr(args, flag) <= 1:
            raise ValueError(
                f"--{flag.replace('_', '-')} must be in [0, 1], got {getattr(args, flag)}"
            )
    if args.double_share and len(kinds) < 2:
        raise ValueError(f"--double-share needs two --kinds at least, got {args.kinds!r}")
    return kinds


def job_end(passes: int, split_interval: int = 1) -> tuple[int, str, str]:
    """(days, end_day, end_split) of a job of ``passes`` splits of ``split_interval`` minutes
    from START_DAY."""
    names = split_names(split_interval)
    days = math.ceil(passes / len(names))
    end_day = format_day(parse_day(START_DAY) + dt.timedelta(days=days - 1))
    return days, end_day, names[(passes - 1) % len(names)]


def saves_line(model: Path) -> str:
    """What the job left in ``model``: its day-end base models, delta models (and the rows
    their delete records carry: shrink's evictions), checkpoints."""
    days = [d for d in model.iterdir() if d.is_dir()]
    bases = [d for d in days if (d / "base" / "MANIFEST.json").exists()]
    deltas = [x for d in days for x in d.glob("delta_*") if (x / "MANIFEST.json").exists()]
    checkpoints = [x for d in days for x in d.iterdir() if x.name.isdigit()]
    deleted = sum(len(np.load(f)) for x in deltas for f in x.glob("sparse/*/*.delta.deleted.npy"))
    return (
        f"saves: {len(bases)} day-end base model(s) of {len(days)} day(s), {len(deltas)} delta "
        f"model(s) carrying {deleted} deleted row(s), {len(checkpoints)} checkpoint(s)"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        kinds = check(args)
    except ValueError as exc:
        print(f"chaos.py: {exc}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    passes = max(2, round(args.minutes * 60 / args.pass_seconds))
    days, end_day, end_split = job_end(passes, args.split_interval)
    run = args.run_dir.resolve()
    print(
        f"chaos: seed {seed}; {args.minutes:g} min of faults every {args.interval[0]:g}-"
        f"{args.interval[1]:g}s of {', '.join(kinds)}; a job of {passes} passes (a split "
        f"lands every {args.pass_seconds:g}s), {days} day(s) of {args.split_interval}-minute "
        f"splits, checkpoint_per_pass {args.checkpoint_per_pass}, save_delta_frequency "
        f"{args.delta_every}; {args.pollers} REST poller(s), an online export every "
        f"{args.export_every:g}s (0: none); run directory {run}",
        flush=True,
    )
    schedule = Schedule(
        seed,
        kinds,
        (args.interval[0], args.interval[1]),
        args.pass_done_share,
        freeze_share=args.freeze_share,
        freeze_s=(args.freeze_seconds[0], args.freeze_seconds[1]),
        double_share=args.double_share,
    )
    stack = Stack.up(
        run,
        "--days",
        str(days),
        "--trainers",
        str(args.trainers),
        "--store-shards",
        "2",
        "--max-restarts",
        "100000",
        "--timeout-s",
        str(args.minutes * 60 + 3600),
        split_interval=args.split_interval,
        samples=args.samples_per_split,
        rate=1 / args.pass_seconds,
    )
    try:
        template = with_push_order(stack.drop_demo(), args.push_order)
        window = {"end_day": end_day, "end_split": end_split}
        saves = {"save_delta_frequency": args.delta_every}
        name = "nofault" if args.no_faults else "chaos"
        job_id = stack.submit(template, name, args.checkpoint_per_pass, saves, **window)
        t0 = stack.job(job_id)["created_at"]
        token = (run / "api-token").read_text().strip()
        clients = RestClients(
            stack.state["api_url"], token, job_id, args.pollers, args.export_every, seed=seed
        ).start()
        try:
            faults = (
                []
                if args.no_faults
                else run_chaos(
                    stack, job_id, schedule, args.minutes * 60, say=lambda s: print(s, flush=True)
                )
            )
            print(
                f"faults over at t+{time.time() - t0:.0f}s; waiting for the job's end", flush=True
            )
            job = stack.wait_state(job_id, passes * args.pass_seconds + 1800)
        finally:
            clients.stop()
        passes_rest, events = stack.passes(job_id), stack.events(job_id)
        for line in summary(faults, job, events, t0):
            print(line)
        for line in clients.report():
            print(line)
        print(saves_line(stack.model_path(job)))
        baseline, base_auc, twin = None, None, args.baseline_model
        if args.baseline_model is not None:
            baseline = kept_records(read_records(args.baseline_model))
            if not baseline:
                print(f"! --baseline-model {args.baseline_model}: no pass recorded in passes.jsonl")
            aucs = [float(r["predict_auc"]) for r in baseline if r.get("predict_auc") is not None]
            base_auc = sum(aucs) / len(aucs) if aucs else None
        elif not (args.no_baseline or args.no_faults):
            print("the same job without faults ...", flush=True)
            base_id = stack.submit(template, "nofault", args.checkpoint_per_pass, saves, **window)
            base = stack.wait_state(base_id, passes * 10 + 600)
            if base["state"] != "succeeded":
                print(f"! the no-fault job {base['state']}: {base.get('error')}")
            twin = stack.model_path(base)
            baseline = kept_records(read_records(twin))
            base_auc = mean_predict_auc(stack.passes(base_id))
        verdict = agreement(job, passes_rest, events, stack.model_path(job), baseline)
        rows = run / "chaos-passes.txt"
        rows.write_text("\n".join(verdict.report(every_row=True)) + "\n")
        for line in verdict.report(every_row=args.every_row):
            print(line)
        print(f"every pass's row: {rows}")
        auc = mean_predict_auc(passes_rest)
        if auc is not None and base_auc is not None:
            print(
                f"mean predict AUC: chaos {auc:.4f}, no faults {base_auc:.4f} "
                f"(difference {auc - base_auc:+.4f})"
            )
        else:
            print(f"mean predict AUC: chaos {auc}, no faults {base_auc}")
        match = None if twin is None else same_model(stack.model_path(job), twin)
        if match is not None:
            print(
                match.line()
                + ("" if args.push_order == "rank" else " (arrival order: not expected)")
            )
        # in rank order a recovery must leave the model exactly the no-fault one
        model_ok = match is None or args.push_order != "rank" or match.first_difference is None
        if job["state"] != "succeeded":
            print(f"chaos: FAIL: the job is {job['state']}: {job.get('error')}")
        elif not verdict.ok:
            print("chaos: FAIL: REST, passes.jsonl and the checkpoints disagree")
        elif clients.answers.fives:
            print(f"chaos: FAIL: {clients.answers.fives} REST answer(s) 5xx, not a 503 Retry-After")
        elif not model_ok:
            print("chaos: FAIL: in rank push order the model differs from the no-fault run's")
        else:
            print("chaos: PASS")
        ok = job["state"] == "succeeded" and verdict.ok and not clients.answers.fives and model_ok
        return 0 if ok else 1
    finally:
        stack.down()


if __name__ == "__main__":
    sys.exit(main())
