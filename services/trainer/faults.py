"""Fault injection for tests: the one place that reads ``STREAMREC_FAULT``.

A test sets ``STREAMREC_FAULT`` in a trainer's environment to make one operation fail the
way the real world would, so the failure path runs end to end in real processes::

    STREAMREC_FAULT=checkpoint_enospc        every model write (checkpoint, base, delta,
                                             batch) fails with ENOSPC after dense.pt, before
                                             the store's save and the manifest: half written
    STREAMREC_FAULT=checkpoint_enospc#2      only the 2nd model write of this process
    STREAMREC_FAULT=checkpoint_enospc@1      only on rank 1 (both: checkpoint_enospc@0#2)

Kill points: a ``pause_*`` fault stops the rank at a named instant so that a test can
kill -9 whatever it wants (this rank, another, the group, a store shard) exactly there::

    pause_after_pass_done    rank 0, just after a pass's ``pass_done`` report reached Redis
    pause_after_pass_log     rank 0, just after the pass's ``passes.jsonl`` line was written
    pause_in_save            inside a model write, after dense.pt, before the store's save

The paused rank writes its pid to ``$STREAMREC_FAULT_DIR/<fault>.<rank>`` and waits until
the test deletes that file (or ``STREAMREC_FAULT_PAUSE_S``, default 120 s, passes), then
goes on. A pause fires once per folder (``<fault>.<rank>.fired``), so the group its kill
restarts, with the same environment, runs through. Unset (production) each point costs one
dictionary lookup.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

#: The faults a test can ask for.
FAULTS = frozenset(
    {"checkpoint_enospc", "pause_after_pass_done", "pause_after_pass_log", "pause_in_save"}
)

#: Calls of each fault point so far in this process (for ``#N``).
_calls: dict[str, int] = {}


def _wanted(name: str) -> bool:
    spec = os.environ.get("STREAMREC_FAULT", "")
    if not spec:
        return False
    fault, _, nth = spec.partition("#")
    fault, _, rank = fault.partition("@")
    if fault not in FAULTS:
        raise ValueError(f"STREAMREC_FAULT {spec!r}: unknown fault (known: {sorted(FAULTS)})")
    if fault != name or (rank and rank != os.environ.get("RANK", "0")):
        return False
    _calls[name] = _calls.get(name, 0) + 1
    return not nth or _calls[name] == int(nth)


def _pause(name: str) -> None:
    """Waits at kill point ``name`` while the test's marker file exists (see the module doc)."""
    if not _wanted(name):
        return
    folder = os.environ.get("STREAMREC_FAULT_DIR")
    if not folder:
        raise ValueError(f"STREAMREC_FAULT {name!r} needs STREAMREC_FAULT_DIR")
    marker = Path(folder) / f"{name}.{os.environ.get('RANK', '0')}"
    fired = marker.with_name(f"{marker.name}.fired")
    if fired.exists():
        return  # once per folder: a group restarted with the same environment goes on
    fired.touch()
    tmp = marker.with_name(f".{marker.name}.tmp")
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, marker)  # the test sees the whole pid or nothing
    deadline = time.monotonic() + float(os.environ.get("STREAMREC_FAULT_PAUSE_S", "120"))
    while marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def checkpoint_write(path: str) -> None:
    """Raises ENOSPC when the test asked for ``checkpoint_enospc``; waits at
    ``pause_in_save`` (see the module doc)."""
    _pause("pause_in_save")
    if _wanted("checkpoint_enospc"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC) + " (STREAMREC_FAULT)", path)


def after_pass_done() -> None:
    """Kill point: a pass's ``pass_done`` report has reached Redis, not yet acknowledged."""
    _pause("pause_after_pass_done")


def after_pass_log() -> None:
    """Kill point: the pass's ``passes.jsonl`` line is written, nothing reported yet."""
    _pause("pause_after_pass_log")
