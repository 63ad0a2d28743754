"""The items each positive already holds while drawing without replacement
(``put_back=False``, :meth:`streamrec.sampler.table.NegativeTable.sample`)."""

from __future__ import annotations

import numpy as np


class HeldItems:
    """The items each positive already holds (``put_back=False``), as sorted int64 keys
    ``positive * m + slot``, kept sorted across rounds so a round costs a search of its
    fresh draws and one linear merge."""

    def __init__(self, m: int) -> None:
        self.m = m
        self.keys = np.zeros(0, np.int64)

    def add(self, owners: np.ndarray, drawn: np.ndarray, skip: np.ndarray) -> np.ndarray:
        """Accepts fresh draws in slot order; returns which repeat an item already held (or
        drawn earlier in this round) by their positive. Draws in ``skip`` are ignored."""
        idx = np.flatnonzero(~skip)
        keys = owners.take(idx) * self.m + drawn.take(idx)
        # A stable sort keeps equal keys in slot order: the first of a run is the earliest
        # draw, as in a draw stream. Sorted queries also make the searches cache-friendly.
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys.take(order)
        first = np.ones(len(keys), bool)
        first[1:] = sorted_keys[1:] != sorted_keys[:-1]
        pos = np.searchsorted(self.keys, sorted_keys)
        if len(self.keys):
            known = self.keys.take(np.minimum(pos, len(self.keys) - 1)) == sorted_keys
            first &= ~known
        self.keys = np.insert(self.keys, pos[first], sorted_keys[first])
        fresh = np.empty(len(keys), bool)
        fresh[order] = first
        repeated = np.zeros(len(drawn), bool)
        repeated[idx[~fresh]] = True
        return repeated
