"""What data a model was trained on, from its lineage (``passes.jsonl``), so that scoring can
say whether an AUC is held out or in-sample.

An exported model carries, in ``model.json``::

    "lineage": {"train_data_dir": "/abs/data", "last_pass": ["20190720", 6],
                "trained": {"20190720": ["0000", "0005", ...]}}

the splits of every pass recorded up to the exported one, less the skipped ones. A data
file ``<train_data_dir>/<day>/<split>/<file>`` (paths resolved) is part of the training
when its (day, split) is listed; any other file is held out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def trained_splits(passes_file: Path, last_pass: tuple[str, int] | None) -> dict[str, list[str]]:
    """day -> splits trained, from the pass records up to and including ``last_pass``."""
    trained: dict[str, list[str]] = {}
    if last_pass is None or not passes_file.is_file():
        return trained
    for line in passes_file.read_text().splitlines():
        try:
            rec = json.loads(line)
            here = (str(rec["day"]), int(rec["pass_id"]))
            splits = [str(s) for s in rec["splits"]]
            skipped = {str(s) for s in rec.get("skipped_splits") or []}
        except (ValueError, KeyError, TypeError):
            continue  # not a pass record: not ours to judge
        if rec.get("rolled_back"):
            continue  # trained into a model the job went back from: not in this one
        if here <= tuple(last_pass):
            day = trained.setdefault(here[0], [])
            day.extend(s for s in splits if s not in skipped and s not in day)
    return trained


def lineage(
    passes_file: Path, last_pass: tuple[str, int] | None, train_data_dir: str | Path
) -> dict[str, Any]:
    """The ``lineage`` entry of an exported model's model.json."""
    return {
        "train_data_dir": str(Path(train_data_dir).resolve()),
        "last_pass": list(last_pass) if last_pass else None,
        "trained": trained_splits(passes_file, last_pass),
    }


def trained_on(files: list[Path], lin: dict[str, Any] | None) -> list[str] | None:
    """Those of ``files`` the model was trained on; None when the model has no lineage
    (exported before models carried one: unknown)."""
    if not lin:
        return None
    root = Path(lin["train_data_dir"])
    trained = {day: set(splits) for day, splits in lin["trained"].items()}
    out = []
    for f in files:
        rel = (
            Path(f).resolve().relative_to(root) if Path(f).resolve().is_relative_to(root) else None
        )
        if (
            rel is not None
            and len(rel.parts) == 3
            and rel.parts[1] in trained.get(rel.parts[0], ())
        ):
            out.append(str(f))
    return out
