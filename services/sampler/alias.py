"""Alias tables for many groups (categories) in flat arrays: O(1) weighted draws.

Items of positive weight are laid out in *slots* sorted by group; group ``j`` owns slots
``start[j] .. start[j] + count[j]``. Slot ``s`` keeps its own item with probability
``prob[s]`` and otherwise gives the item of slot ``alias[s]`` (always in the same group)::

    group 7, weights [1, 1, 4, 2] (scaled to mean 1: [0.5, 0.5, 2, 1])
    slot        s0    s1    s2    s3
    prob        0.5   0.5   1.0   1.0      a draw: pick a slot uniformly in the group,
    alias       s2    s2    s2    s3       keep it with prob[s], else take alias[s]

A draw is one uniform number: ``x = u * count``; slot ``start + floor(x)``, kept when
``frac(x) < prob``. No loop per item anywhere.

Construction (Hübschle-Schneider & Sanders' *sweep*, vectorised): inside a group, light
items (scaled weight p < 1) lack ``d = 1 - p``, heavy ones (p >= 1) have ``e = p - 1`` to
spare. Lights are filled, in order, from the heavies' spare mass, in order; a heavy whose
remaining mass drops below 1 becomes a bucket of its own, topped up by the next heavy.
With ``D`` the running sum of deficits and ``E`` the running sum of excesses, light ``i``
takes its alias from the first heavy with ``E_h >= D_(i-1)``, and heavy ``h`` keeps
``1 + E_h - D_k`` where ``D_k`` is the first running deficit above ``E_h`` (1 if none),
its alias being the next heavy. Both are merge-searches done with one ``lexsort`` each.
Every step is numpy over all groups at once; the exact probabilities are checked in the
tests against ``weights / sum``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Group keys below this (or below 4x the number of groups) get a dense key -> group array.
DENSE_KEYS = 1 << 16


@dataclass(frozen=True)
class AliasTable:
    """Flat alias tables for ``g`` groups over ``m`` slots.

    Args:
        keys: (g,) int64 sorted group keys (category ids).
        start: (g,) int64 first slot of each group; count: (g,) int64 its number of slots.
        prob: (m,) float64 probability of keeping the slot's own item.
        alias: (m,) int64 slot that gives the item otherwise.
        row: (m,) int64 table row of each slot's own item.
        weight: (m,) float64 weight of each slot's own item (> 0).
        total: (g,) float64 sum of weights per group.
        group_of_row: (n,) int64 group index of every table row, -1 for weight 0.
        slot_of_row: (n,) int64 slot of every table row, -1 for weight 0.
        dense_group: (keys[-1] + 1,) int64 group index of every key value, -1 for none, when
            the keys are small non-negative integers (category ids usually are); else None.
    """

    keys: np.ndarray
    start: np.ndarray
    count: np.ndarray
    prob: np.ndarray
    alias: np.ndarray
    row: np.ndarray
    weight: np.ndarray
    total: np.ndarray
    group_of_row: np.ndarray
    slot_of_row: np.ndarray
    dense_group: np.ndarray | None = None

    @property
    def num_groups(self) -> int:
        return len(self.keys)

    @classmethod
    def build(cls, groups: np.ndarray, weights: np.ndarray) -> AliasTable:
        """Builds the tables.

        Args:
            groups: (n,) int64 group key of each table row.
            weights: (n,) float64, finite and >= 0; rows of weight 0 are never drawn.
        """
        n = len(groups)
        rows = np.flatnonzero(weights > 0)
        keys, inv, count = np.unique(groups[rows], return_inverse=True, return_counts=True)
        inv = inv.astype(np.int64).ravel()
        count = count.astype(np.int64)
        g = len(keys)
        start = np.zeros(g, np.int64)
        np.cumsum(count[:-1], out=start[1:])
        w = weights[rows]
        total = np.bincount(inv, weights=w, minlength=g)
        p = w * count[inv] / total[inv]
        heavy = p >= 1.0
        _ensure_one_heavy(heavy, p, inv, g)
        # Slots: by group, lights before heavies (lexsort is stable).
        order = np.lexsort((heavy, inv))
        row, gi, w, p, heavy = rows[order], inv[order], w[order], p[order], heavy[order]
        m = len(row)
        slot = np.arange(m, dtype=np.int64)

        # Running deficit D (lights) and excess E (heavies) within each group.
        d = np.where(heavy, 0.0, 1.0 - p)
        e = np.where(heavy, p - 1.0, 0.0)
        run_d = _segmented_cumsum(d, start, count, gi)
        run_e = _segmented_cumsum(e, start, count, gi)
        light_slots = slot[~heavy]
        heavy_slots = slot[heavy]
        last_heavy = start + count - 1  # heavies sit at the end of every group

        prob = np.ones(m, np.float64)
        alias = slot.copy()
        # Lights: alias = first heavy h of the group with E_h >= D_(i-1).
        # D_(i-1) must be *the same float* the heavies' search compares with (run_d of the
        # previous light; recomputing it as run_d - d differs in the last bit and breaks ties).
        # Lights sit first in their group, so the previous light is the previous slot.
        first_light = light_slots == start[gi[light_slots]]
        d_prev = np.where(first_light, 0.0, run_d[np.maximum(light_slots - 1, 0)])
        found = _first_at_or_after(
            gi[light_slots],
            d_prev,
            gi[heavy_slots],
            run_e[heavy_slots],
            heavy_slots,
            ties_target_first=False,
        )
        fallback = last_heavy[gi[light_slots]]
        alias[light_slots] = np.where(found >= 0, found, fallback)
        prob[light_slots] = p[light_slots]
        # Heavies: keep 1 + E_h - D_k, D_k the first running deficit > E_h; alias = next heavy.
        first_d = _first_at_or_after(
            gi[heavy_slots],
            run_e[heavy_slots],
            gi[light_slots],
            run_d[light_slots],
            light_slots,
            ties_target_first=True,
        )
        rem = np.ones(len(heavy_slots))
        has = first_d >= 0
        rem[has] = 1.0 + run_e[heavy_slots[has]] - run_d[first_d[has]]
        prob[heavy_slots] = np.clip(rem, 0.0, 1.0)
        alias[heavy_slots] = np.minimum(heavy_slots + 1, last_heavy[gi[heavy_slots]])

        group_of_row = np.full(n, -1, np.int64)
        group_of_row[row] = gi
        slot_of_row = np.full(n, -1, np.int64)
        slot_of_row[row] = slot
        dense_group = None
        if g and keys[0] >= 0 and keys[-1] < max(DENSE_KEYS, 4 * g):
            dense_group = np.full(int(keys[-1]) + 1, -1, np.int64)
            dense_group[keys] = np.arange(g)
        return cls(
            keys=keys.astype(np.int64),
            start=start,
            count=count,
            prob=prob,
            alias=alias,
            row=row,
            weight=w,
            total=total,
            group_of_row=group_of_row,
            slot_of_row=slot_of_row,
            dense_group=dense_group,
        )

    def group_of(self, keys: np.ndarray) -> np.ndarray:
        """Group index of each key ((k,) int64), -1 where the table has no such group."""
        if not self.num_groups:
            return np.full(len(keys), -1, np.int64)
        if self.dense_group is not None:  # one gather instead of a binary search per key
            size = len(self.dense_group)
            inside = (keys >= 0) & (keys < size)
            return np.where(inside, self.dense_group.take(np.where(inside, keys, 0)), -1)
        pos = np.searchsorted(self.keys, keys)
        pos = np.minimum(pos, self.num_groups - 1)
        return np.where(self.keys.take(pos) == keys, pos, -1)

    def draw(self, groups: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One weighted draw per entry of ``groups`` ((k,) int64, all valid): (k,) int64 slots."""
        x = rng.random(len(groups))
        # u <= 1 - 2**-53 times an integer count < 2**53 always rounds to less than count, so
        # floor(x) stays inside the group without a clip.
        x *= self.count.take(groups)
        b = x.astype(np.int64)
        x -= b  # the fraction, uniform in [0, 1) and independent of b
        b += self.start.take(groups)
        keep = x < self.prob.take(b)
        return np.where(keep, b, self.alias.take(b))

    def probabilities(self) -> np.ndarray:
        """(m,) float64 probability of drawing each slot's item within its group (for tests)."""
        m = len(self.row)
        groups = np.repeat(np.arange(self.num_groups), self.count)
        per_slot = 1.0 / self.count[groups]
        out = np.bincount(np.arange(m), weights=self.prob * per_slot, minlength=m)
        out += np.bincount(self.alias, weights=(1.0 - self.prob) * per_slot, minlength=m)
        return out


def _ensure_one_heavy(heavy: np.ndarray, p: np.ndarray, inv: np.ndarray, g: int) -> None:
    """Rounding can leave a group with no p >= 1; its largest item then counts as heavy."""
    has_heavy = np.bincount(inv, weights=heavy, minlength=g) > 0
    if has_heavy.all():
        return
    order = np.lexsort((p, inv))
    last = np.flatnonzero(np.r_[inv[order][1:] != inv[order][:-1], True])
    heavy[order[last][~has_heavy]] = True


def _segmented_cumsum(
    x: np.ndarray, start: np.ndarray, count: np.ndarray, gi: np.ndarray
) -> np.ndarray:
    """Inclusive cumulative sum restarting at every group (slots sorted by group)."""
    run = np.cumsum(x)
    base = np.where(start > 0, run[np.maximum(start - 1, 0)], 0.0)
    base[count == 0] = 0.0
    return run - base[gi]


def _first_at_or_after(
    q_group: np.ndarray,
    q_value: np.ndarray,
    t_group: np.ndarray,
    t_value: np.ndarray,
    t_slot: np.ndarray,
    ties_target_first: bool,
) -> np.ndarray:
    """For each query, the slot of the first target of its group at or after it in value.

    Targets are sorted by value inside each group. With ``ties_target_first`` a target equal
    to the query comes before it (so the result is the first target > query); otherwise
    after it (first target >= query). Returns (q,) int64 slots, -1 where none.
    """
    nq = len(q_group)
    if nq == 0:
        return np.zeros(0, np.int64)
    group = np.concatenate([q_group, t_group])
    value = np.concatenate([q_value, t_value])
    is_target = np.concatenate([np.zeros(nq, bool), np.ones(len(t_group), bool)])
    tie = is_target if not ties_target_first else ~is_target
    order = np.lexsort((tie, value, group))
    big = np.iinfo(np.int64).max
    positions = np.where(is_target[order], np.arange(len(order)), big)
    nxt = np.minimum.accumulate(positions[::-1])[::-1]
    # position of each query in the sorted order
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    qpos = rank[:nq]
    tpos = nxt[qpos]
    ok = tpos != big
    result = np.full(nq, -1, np.int64)
    tidx = order[tpos[ok]] - nq  # index into the target arrays
    same = t_group[tidx] == q_group[ok]
    okidx = np.flatnonzero(ok)[same]
    result[okidx] = t_slot[tidx[same]]
    return result


def pack_slots(at: AliasTable, slot_ids: np.ndarray) -> np.ndarray:
    """One 32-byte record per slot for the compiled draw (``AliasSlot`` in csrc/ops.h).

    A draw then reads one cache line instead of three arrays: keep threshold, alias slot,
    and the ids of both, so slots are mapped to ids in the same pass. The threshold
    ``ceil(prob * 2**53)`` lets the kernel compare :meth:`AliasTable.draw`'s 53-bit
    fraction as an integer: ``f < ceil(prob * 2**53)`` exactly when ``f * 2**-53 < prob``.

    Args:
        at: the alias tables (``m`` slots).
        slot_ids: (m,) int64 dedup id of each slot's own item.

    Returns:
        (m, 4) int64: ``ceil(prob * 2**53)``, ``alias``, ``slot_ids``, ``slot_ids[alias]``.
    """
    out = np.empty((len(at.row), 4), np.int64)
    out[:, 0] = np.ceil(np.ldexp(at.prob, 53))  # exact: prob in [0, 1] scaled by a power of 2
    out[:, 1] = at.alias
    out[:, 2] = slot_ids
    out[:, 3] = slot_ids.take(at.alias)
    return out
