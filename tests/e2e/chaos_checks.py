"""Whether REST, ``passes.jsonl`` and the checkpoints agree pass by pass after a job (the
chaos test's and ``tools/chaos.py``'s verdict).

What is checked, for every pass of the job's plan (``Agreement.rows``, one row each)::

    REST        listed once, ``done``; a pass a rollback event named was handed out again
                (``attempts`` > its rollbacks)
    passes.jsonl  one line not rolled back (the kept line) per pass, the kept lines in
                training order and exactly REST's done set; a rolled-back line only for a
                pass a REST rollback event named, none left beside a kept line
    lineage     each kept line trained on the model after the pass before it in the plan (its
                ``after``, when the records carry it); ``step`` grows, and with a no-fault
                run of the same data the model is at the same step after each pass (it
                holds every pass before it, each once)
    checkpoints ``<model_root>/<day>/<pass_id>/`` with a verified manifest (checksums) at every
                ``checkpoint_per_pass``-th pass and each day's last; a manifest names its own
                directory's pass, one REST calls done, with the kept line's ``step``; the
                job's ``last_checkpoint`` is a complete one

A pass fails when any of these does; ``Agreement.ok`` is True when none did.

:func:`same_model` compares the model itself with a no-fault twin's, checkpoint by
checkpoint, bit for bit: with ``runner.sparse_push_order: rank`` they must be equal.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from streamrec.control.keys import pass_key
from streamrec.layout import MANIFEST_NAME, iter_passes
from streamrec.trainer.errors import CheckpointError
from streamrec.trainer.model.checkpoint_dirs import read_model_manifest
from streamrec.trainer.model.pass_log import PASSES_FILE


def job_plan(spec: dict[str, Any]) -> list[str]:
    """Every pass of a job (its REST ``spec``), in training order, as ``day/pass_id``."""
    d = spec["data"]
    passes = iter_passes(
        d["start_day"], d["end_day"], d["split_interval"], d["split_per_pass"], d.get("end_split")
    )
    return [pass_key(p.day, p.pass_id) for p in passes]


def record_key(rec: dict[str, Any]) -> str:
    return pass_key(str(rec["day"]), int(rec["pass_id"]))


def read_records(model_path: Path) -> list[dict[str, Any]]:
    """The pass records of ``model_path/passes.jsonl`` in file order (other lines skipped)."""
    path = model_path / PASSES_FILE
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
            record_key(rec)
        except (ValueError, KeyError, TypeError):
            continue
        out.append(rec)
    return out


def kept_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lines of passes the model holds (not rolled back), in file order."""
    return [r for r in records if not r.get("rolled_back")]


@dataclass
class Checkpoint:
    """One ``<day>/<pass_id>/`` directory: its manifest, or why it has none we can trust."""

    key: str
    manifest: dict[str, Any] | None
    error: str | None = None


def read_checkpoints(model_path: Path) -> dict[str, Checkpoint]:
    """Every full-checkpoint directory under ``model_path`` (base, batch and delta models
    aside), its manifest read and verified
    (:func:`streamrec.trainer.model.checkpoint_dirs.read_model_manifest`)."""
    found: dict[str, Checkpoint] = {}
    if not model_path.is_dir():
        return found
    for day_dir in sorted(model_path.iterdir()):
        if not (day_dir.is_dir() and len(day_dir.name) == 8 and day_dir.name.isdigit()):
            continue
        for pass_dir in day_dir.iterdir():
            if not (pass_dir.is_dir() and pass_dir.name.isdigit()):
                continue
            key = pass_key(day_dir.name, int(pass_dir.name))
            if not (pass_dir / MANIFEST_NAME).exists():
                found[key] = Checkpoint(key, None, "no manifest (incomplete)")
                continue
            try:
                found[key] = Checkpoint(key, read_model_manifest(pass_dir))
            except CheckpointError as exc:
                found[key] = Checkpoint(key, None, str(exc))
    return found


def expected_checkpoints(plan: list[str], checkpoint_per_pass: int) -> set[str]:
    """The passes after which the trainer must have written a full checkpoint: every
    ``checkpoint_per_pass``-th (by pass id) and the last pass of each day (and of the job)."""
    last_of_day: dict[str, str] = {}
    for key in plan:
        last_of_day[key.split("/")[0]] = key
    every = {
        k for k in plan if checkpoint_per_pass and int(k.split("/")[1]) % checkpoint_per_pass == 0
    }
    return every | set(last_of_day.values())


def rollbacks(events: list[dict[str, Any]]) -> Counter[str]:
    """How many times REST's rollback events named each pass."""
    named: Counter[str] = Counter()
    for e in events:
        if e.get("type") == "rollback":
            named.update(str(k) for k in (e.get("data") or {}).get("rolled_back") or [])
    return named


def step_deltas(kept: list[dict[str, Any]]) -> dict[str, int]:
    """Steps each kept pass added to the model (its ``step`` less the previous kept line's)."""
    out, before = {}, 0
    for rec in kept:
        out[record_key(rec)] = int(rec["step"]) - before
        before = int(rec["step"])
    return out


@dataclass
class PassRow:
    """One pass: what each source says, and what disagrees."""

    key: str
    rest: str = "-"
    jsonl: str = "-"
    lineage: str = "-"
    checkpoint: str = ""
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        verdict = "ok" if not self.problems else "FAIL: " + "; ".join(self.problems)
        ckpt = f"  ckpt {self.checkpoint}" if self.checkpoint else ""
        return (
            f"{self.key:>14}  rest {self.rest:<18} jsonl {self.jsonl:<12} {self.lineage}{ckpt}"
            f"  {verdict}"
        )


@dataclass
class Agreement:
    """The verdict: a row per pass of the plan, and problems that belong to no pass."""

    rows: list[PassRow]
    problems: list[str]
    notes: list[str]

    @property
    def failed_rows(self) -> list[PassRow]:
        return [r for r in self.rows if r.problems]

    @property
    def ok(self) -> bool:
        return not self.problems and not self.failed_rows

    def summary(self) -> str:
        good = len(self.rows) - len(self.failed_rows)
        return (
            f"agreement: {good}/{len(self.rows)} passes agree (REST, passes.jsonl, checkpoints)"
            + ("" if not self.problems else f"; {len(self.problems)} job-level problem(s)")
        )

    def report(self, every_row: bool = False) -> list[str]:
        rows = self.rows if every_row else self.failed_rows
        return (
            [self.summary()]
            + [f"  ! {p}" for p in self.problems]
            + [f"  note: {n}" for n in self.notes]
            + [r.line() for r in rows]
        )


def agreement(
    job: dict[str, Any],
    rest_passes: list[dict[str, Any]],
    events: list[dict[str, Any]],
    model_path: Path,
    baseline: list[dict[str, Any]] | None = None,
) -> Agreement:
    """Checks a finished job (its REST ``job``, pass list and events, its model directory)
    as the module docstring says; ``baseline``: the kept records of a no-fault run of the
    same data, for the steps each pass adds."""
    plan = job_plan(job["spec"])
    cpp = int(job["spec"]["checkpoint"].get("checkpoint_per_pass") or 0)
    rows = {k: PassRow(k) for k in plan}
    problems: list[str] = []
    notes: list[str] = []
    if job["state"] != "succeeded":
        problems.append(f"job {job['id']} is {job['state']}, not succeeded: {job.get('error')}")
    # ---- REST
    listed = Counter(pass_key(p["day"], p["pass_id"]) for p in rest_passes)
    by_key = {pass_key(p["day"], p["pass_id"]): p for p in rest_passes}
    done = {k for k, p in by_key.items() if p["state"] == "done"}
    named = rollbacks(events)
    for extra in sorted(set(listed) - set(plan)):
        problems.append(f"REST lists {extra}, not a pass of the job's plan")
    for key, row in rows.items():
        p = by_key.get(key)
        if p is None:
            row.rest = "missing"
            row.problems.append("not in REST")
            continue
        row.rest = f"{p['state']} x{listed[key]} att {p.get('attempts')}"
        if listed[key] != 1:
            row.problems.append(f"in REST {listed[key]} times")
        if p["state"] != "done":
            row.problems.append(f"REST says {p['state']}")
        if named[key] and int(p.get("attempts") or 0) <= named[key]:
            row.problems.append(
                f"rolled back {named[key]} time(s) but handed out only {p.get('attempts')}"
            )
    if job.get("passes_done") != len(done):
        problems.append(f"passes_done {job.get('passes_done')} but {len(done)} passes are done")
    # ---- passes.jsonl
    records = read_records(model_path)
    kept = kept_records(records)
    kept_count = Counter(record_key(r) for r in kept)
    rolled_count = Counter(record_key(r) for r in records if r.get("rolled_back"))
    for extra in sorted((set(kept_count) | set(rolled_count)) - set(plan)):
        problems.append(f"passes.jsonl has {extra}, not a pass of the job's plan")
    for key, row in rows.items():
        n, rb = kept_count[key], rolled_count[key]
        row.jsonl = f"kept x{n}" + (f" +{rb} rb" if rb else "")
        if n != 1:
            row.problems.append(f"{n} kept lines in passes.jsonl")
        if (n == 1) != (key in done):
            row.problems.append(
                "kept in passes.jsonl, not done in REST"
                if n
                else "done in REST, not in passes.jsonl"
            )
        if rb and not named[key]:
            row.problems.append("rolled back in passes.jsonl, no REST rollback event names it")
        if rb and n:
            row.problems.append("a rolled-back line left beside the kept one")
    order = [record_key(r) for r in kept]
    in_plan = [k for k in order if k in rows]
    expected_order = sorted(in_plan, key=plan.index)
    if in_plan != expected_order:
        pairs = enumerate(zip(in_plan, expected_order, strict=True))
        first = next(i for i, (a, b) in pairs if a != b)
        rows[in_plan[first]].problems.append(
            f"kept line out of training order (line {first + 1} of the kept lines, expected "
            f"{expected_order[first]})"
        )
    # ---- lineage: what each kept pass was trained on
    with_after = any("after" in r for r in kept)
    if kept and not with_after:
        notes.append("passes.jsonl records carry no `after`: lineage checked by steps only")
    deltas = step_deltas(kept)
    clean = kept_records(baseline) if baseline else []
    base_step = {record_key(r): int(r["step"]) for r in clean}
    base_delta = step_deltas(clean)
    before = {k: (plan[i - 1] if i else None) for i, k in enumerate(plan)}
    last_step = 0
    for rec in kept:
        key = record_key(rec)
        row = rows.get(key)
        if row is None:
            continue
        step = int(rec["step"])
        parts = [f"after {rec.get('after', '?')}"] if with_after else []
        added = f"+{deltas[key]}" + (f", no-fault +{base_delta[key]}" if key in base_delta else "")
        parts.append(f"step {step} ({added})")
        row.lineage = " ".join(parts)
        if with_after and rec.get("after") != before[key]:
            row.problems.append(
                f"trained after {rec.get('after')}, not after {before[key]}: the model it was "
                "trained on lacks the passes between"
            )
        if step <= last_step:
            row.problems.append(f"step {step} not after the previous pass's {last_step}")
        if key in base_step and step != base_step[key]:
            row.problems.append(
                f"the model is at step {step} after it, {base_step[key]} without faults: it "
                "lacks passes before it (or holds some twice)"
            )
        last_step = step
    # ---- checkpoints
    checkpoints = read_checkpoints(model_path)
    kept_by_key = {record_key(r): r for r in kept}
    for key in sorted(expected_checkpoints(plan, cpp) - set(checkpoints), key=plan.index):
        rows[key].checkpoint = "missing"
        rows[key].problems.append("no checkpoint directory where one is due")
    expected = expected_checkpoints(plan, cpp)
    for key, c in checkpoints.items():
        row = rows.get(key)
        if row is None:
            problems.append(f"checkpoint {key} is of no pass of the job's plan")
            continue
        if c.manifest is None:
            row.checkpoint = "incomplete"
            if key in expected:
                row.problems.append(f"checkpoint {c.error}")
            else:
                notes.append(f"checkpoint {key} (none due there): {c.error}")
            continue
        m = c.manifest
        row.checkpoint = f"step {m.get('step')}"
        if pass_key(str(m.get("day")), int(m.get("pass_id") or 0)) != key:
            row.problems.append(f"manifest names {m.get('day')}/{m.get('pass_id')}")
        if key not in done:
            row.problems.append("checkpoint of a pass REST does not call done")
        rec = kept_by_key.get(key)
        if rec is not None and int(rec["step"]) != int(m.get("step") or -1):
            row.problems.append(
                f"manifest step {m.get('step')} but passes.jsonl step {rec['step']}: another "
                "training of the pass"
            )
    last = job.get("last_checkpoint")
    if job["state"] == "succeeded":
        c = checkpoints.get(str(last))
        if c is None or c.manifest is None:
            problems.append(f"the job's last_checkpoint {last} is not a complete checkpoint")
    return Agreement(list(rows.values()), problems, notes)


def mean_predict_auc(rest_passes: list[dict[str, Any]]) -> float | None:
    """Mean ``predict_auc`` of the done passes (None: none has one)."""
    aucs = [
        float(p["predict_auc"])
        for p in rest_passes
        if p["state"] == "done" and p.get("predict_auc") is not None
    ]
    return sum(aucs) / len(aucs) if aucs else None


@dataclass
class ModelMatch:
    """Checkpoint by checkpoint, a model against its no-fault twin's (:func:`same_model`)."""

    compared: int
    equal: int
    #: the first checkpoint that differs and what differs in it; None: every one is equal
    first_difference: str | None = None

    def line(self) -> str:
        head = f"model: {self.equal}/{self.compared} checkpoints the no-fault run's bit for bit"
        return head if self.first_difference is None else f"{head}; {self.first_difference}"


def _same_tree(a: Any, b: Any) -> bool:
    """Nested dicts / lists of tensors and plain values equal, tensors bit for bit."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_tree(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_tree(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


#: The row's flags word and its "changed since the last base/delta save" bit
#: (csrc/shared/row_layout.h): save bookkeeping, not training state. An export asked over REST
#: lands at a moment, so at another pass in two runs; it clears the bit in the rows it takes.
FLAGS_COLUMN, DIRTY_BIT = 3, 2


def _training_state(rows: np.ndarray) -> np.ndarray:
    """``rows`` with the dirty bit of every flags word cleared (the rest as it is)."""
    if rows.ndim != 2 or rows.shape[1] <= FLAGS_COLUMN or rows.dtype != np.float32:
        return rows
    out = rows.copy()
    flags = out[:, FLAGS_COLUMN].astype(np.int64)
    out[:, FLAGS_COLUMN] = (flags & ~DIRTY_BIT).astype(np.float32)
    return out


def _sparse_differences(a: Path, b: Path) -> list[str]:
    """The tables of two sparse saves that differ (rows compared key by key: a shard's save
    lists its keys in its hash table's order, which the order of inserts decides), the dirty
    bit aside (:func:`_training_state`)."""
    out = []
    names = sorted(p.relative_to(a).as_posix() for p in a.glob("*/*.keys.npy"))
    if names != sorted(p.relative_to(b).as_posix() for p in b.glob("*/*.keys.npy")):
        return ["the shards' tables"]
    for name in names:
        stem = name[: -len(".keys.npy")]
        ka, kb = np.load(a / name), np.load(b / name)
        ra = _training_state(np.load(a / f"{stem}.rows.npy"))
        rb = _training_state(np.load(b / f"{stem}.rows.npy"))
        oa, ob = np.argsort(ka, kind="stable"), np.argsort(kb, kind="stable")
        if not (np.array_equal(ka[oa], kb[ob]) and np.array_equal(ra[oa], rb[ob], equal_nan=True)):
            out.append(stem)
    return out


def same_model(model_path: Path, twin_path: Path) -> ModelMatch:
    """Whether every checkpoint both model directories hold is the same model bit for bit:
    the dense state (weights, optimizer, LR scheduler, step) and every shard's rows, key by
    key (but the saves' dirty bit). With ``runner.sparse_push_order: rank`` a run repeats
    bit for bit, so a run with faults must equal its no-fault twin at every checkpoint: a
    difference is state a recovery lost or applied twice."""
    ours, theirs = read_checkpoints(model_path), read_checkpoints(twin_path)
    both = sorted(
        (k for k in ours.keys() & theirs.keys() if ours[k].manifest and theirs[k].manifest),
        key=lambda k: (k.split("/")[0], int(k.split("/")[1])),
    )
    match = ModelMatch(len(both), 0)
    for key in both:
        day, pass_id = key.split("/")
        a, b = model_path / day / pass_id, twin_path / day / pass_id
        diffs = [] if _same_tree(_dense(a), _dense(b)) else ["dense.pt"]
        diffs += _sparse_differences(a / "sparse", b / "sparse")
        if diffs:
            if match.first_difference is None:
                match.first_difference = f"first difference at {key}: {', '.join(diffs[:6])}"
        else:
            match.equal += 1
    return match


def _dense(directory: Path) -> dict[str, Any]:
    state = torch.load(directory / "dense.pt", map_location="cpu", weights_only=True)
    return {k: state[k] for k in ("model", "optimizer", "scheduler", "trainer")}
