"""``passes.jsonl``: the trainer's own record of the passes in its model, one JSON per line.

Rank 0 appends a pass's record once the pass and its saves succeeded (the runner's
``record_pass``, which drops any record of that pass or a later one first: each pass once,
in training order). When the job goes back to an earlier checkpoint (a rewind: start after
stop, a group or a shard lost), the records of the passes after it get ``"rolled_back":
true`` (the model the job goes on from lacks them, as the API's pass records say); training
them again replaces those lines.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from streamrec.control import keys

PASSES_FILE = "passes.jsonl"


def write_lines(path: Path, lines: list[str]) -> None:
    """Replaces ``path`` with ``lines`` through a temporary file (a failure leaves the old)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(f"{line}\n" for line in lines))
    os.replace(tmp, path)


def mark_rolled_back(path: Path, after: tuple[str, int] | None) -> list[str]:
    """Marks the records of the passes after ``after`` (every one: None) rolled back;
    returns their ``day/pass_id``. Lines that are not a pass record are kept as they are."""
    if not path.exists():
        return []
    lines, rolled = [], []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
            key = (str(rec["day"]), int(rec["pass_id"]))
        except (ValueError, KeyError, TypeError):
            lines.append(line)
            continue
        if (after is None or key > after) and not rec.get("rolled_back"):
            rec["rolled_back"] = True
            rolled.append(keys.pass_key(*key))
            line = json.dumps(rec)
        lines.append(line)
    if rolled:
        write_lines(path, lines)
    return rolled
