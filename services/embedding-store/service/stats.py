"""The statistics of a store served by several shards, summed into one view.

Each shard answers ``stats`` with its ``EmbeddingStore.stats()`` (rows, bytes and counters
per table); :func:`sum_stats` adds them up for the client's ``stats()["total"]``.
"""

from __future__ import annotations

from typing import Any


def sum_stats(shards: list[Any]) -> Any:
    """Sums the numeric leaves of same-shaped dicts; rates and ratios are left out (a sum
    of rates means nothing), and a leaf that is not a number is kept when every shard has
    the same value (e.g. the tier), else left out."""
    first = shards[0]
    if isinstance(first, dict):
        out = {}
        for key in first:
            if any(s in str(key) for s in ("rate", "ratio")):
                continue
            vals = [d.get(key) for d in shards if isinstance(d, dict) and key in d]
            summed = sum_stats(vals) if len(vals) == len(shards) else None
            if summed is not None:
                out[key] = summed
        return out
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in shards):
        return sum(shards)
    return first if all(v == first for v in shards) else None
