"""Fault injection for tests: the one place that reads ``STREAMREC_FAULT``.

A test sets ``STREAMREC_FAULT`` in a trainer's environment to make one operation fail the
way the real world would, so the failure path runs end to end in real processes::

    STREAMREC_FAULT=checkpoint_enospc        every model write (checkpoint, base, delta,
                                             batch) fails with ENOSPC after dense.pt, before
                                             the store's save and the manifest: half written
    STREAMREC_FAULT=checkpoint_enospc#2      only the 2nd model write of this process
    STREAMREC_FAULT=checkpoint_enospc@1      only on rank 1 (both: checkpoint_enospc@0#2)

Unset (production) it costs one dictionary lookup per checkpoint.
"""

from __future__ import annotations

import errno
import os

#: The faults a test can ask for.
FAULTS = frozenset({"checkpoint_enospc"})

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


def checkpoint_write(path: str) -> None:
    """Raises ENOSPC when the test asked for ``checkpoint_enospc`` (see the module doc)."""
    if _wanted("checkpoint_enospc"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC) + " (STREAMREC_FAULT)", path)
