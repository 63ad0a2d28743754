"""The negative table held by the server, and the in-process sampling core.

A :class:`NegativeTable` is immutable once built: ``reload`` builds a new one completely and
the server swaps one reference, so a request sees the old table or the new one, never a mix.

Sampling (:meth:`NegativeTable.sample`), for positive ``i`` with ``cnts[i]`` negatives:

1. Draw from the alias table of the positive's category (or of the whole table when no
   categories are given), O(1) per draw.
2. Conflicts: the positive's own id (``avoid_conflict``), any dedup id of the batch
   (``avoid_all``), and with ``put_back=False`` an item already drawn for the same positive.
   Conflicting draws are drawn again, at most ``max_rounds`` times.
   With ``put_back=True`` steps 1-2 are one compiled kernel (``_C.sample_put_back``,
   csrc/sample_put_back.cpp: threads over positives, counter-based SplitMix64 numbers from
   one seed drawn from the caller's Generator, so a seed gives the same ids on any thread
   count; each try reads one packed 32-byte slot record that also holds the ids). With
   ``put_back=False`` they run vectorised in numpy, all draws of a round at once.
   Redrawing a rejected draw is rejection sampling, so the result is exactly a weighted
   draw among the allowed items (for ``put_back=False``: successive sampling without
   replacement, the first ``cnts[i]`` distinct items of an endless weighted stream, which is
   what ``numpy``'s ``choice(replace=False, p=...)`` draws).
3. Draws still in conflict after ``max_rounds`` (the excluded items hold almost all of the
   category's weight), and with ``put_back=False`` positives asking for at least half of
   the allowed items of their category, go to an exact fallback: the allowed items of the
   category are listed for each such positive and drawn from directly (inverse CDF with
   replacement; Efraimidis-Spirakis keys without). It costs O(category size) per
   positive, so it is kept for these cases; it never loops.

Too few items: a positive whose category is unknown to the table, or has no allowed item
left (every item excluded or of weight 0), gets ``missing_id`` in its slots. With
``put_back=False`` a positive asking for more items than its category allows gets every
allowed item once (in random order) and ``missing_id`` in the remaining slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import streamrec.sampler._C as _C
import torch
from streamrec.errors import BadRequest
from streamrec.sampler.alias import AliasTable, pack_slots
from streamrec.sampler.columns import Column, ragged_arange, ragged_gather, single_values
from streamrec.sampler.errors import BadTable
from streamrec.sampler.held_items import HeldItems

#: Above this many candidate (positive, item) pairs the exact fallback works in chunks.
FALLBACK_CHUNK = 8_000_000
#: ... and at most this many positives per chunk (positive indexes fit uint16).
FALLBACK_ROWS = 1 << 16


@dataclass(frozen=True)
class Tags:
    """Names of the four columns every negative table must have (RecIS's arguments)."""

    sample_tag: str
    dedup_tag: str
    weight_tag: str
    skey_name: str

    def as_dict(self) -> dict[str, str]:
        return {
            "sample_tag": self.sample_tag,
            "dedup_tag": self.dedup_tag,
            "weight_tag": self.weight_tag,
            "skey_name": self.skey_name,
        }


@dataclass(frozen=True)
class _DrawTables:
    """What the compiled draw reads of one :class:`AliasTable` (torch views, built once).

    slots: (m, 4) int64 packed records (:func:`pack_slots`); start, count: (g,) int64.
    """

    slots: torch.Tensor
    start: torch.Tensor
    count: torch.Tensor

    @classmethod
    def of(cls, at: AliasTable, slot_ids: np.ndarray) -> _DrawTables:
        return cls(
            slots=torch.from_numpy(pack_slots(at, slot_ids)),
            start=torch.from_numpy(np.ascontiguousarray(at.start, np.int64)),
            count=torch.from_numpy(np.ascontiguousarray(at.count, np.int64)),
        )


@dataclass
class SampleResult:
    """ids: (sum(cnts),) int64; ``unfilled`` slots hold ``missing_id``; ``rounds`` used."""

    ids: np.ndarray
    unfilled: int = 0
    rounds: int = 0
    fallback_positives: int = 0


class NegativeTable:
    """A validated negative table with its id index and alias tables.

    Args:
        columns: name -> :class:`Column`, all with ``n`` rows.
        tags: the names of the category, dedup id, weight and (unused) skey columns.

    Raises:
        BadTable: a tag column is missing, a column has the wrong length or kind, a dedup id
            appears twice, or a weight is NaN, infinite or negative.
    """

    def __init__(self, columns: dict[str, Column], tags: Tags) -> None:
        for role, name in tags.as_dict().items():
            if name not in columns:
                raise BadTable(
                    f"{role} column {name!r} is missing; table has columns {sorted(columns)}"
                )
        n = columns[tags.dedup_tag].num_rows
        if n == 0:
            raise BadTable("table has no rows")
        for name, col in columns.items():
            if col.num_rows != n:
                raise BadTable(
                    f"column {name!r} has {col.num_rows} rows, {tags.dedup_tag!r} has {n}"
                )
        self.columns = columns
        self.tags = tags
        self.num_rows = n
        self.ids = single_values(columns[tags.dedup_tag], tags.dedup_tag, integer=True)
        self.categories = single_values(columns[tags.sample_tag], tags.sample_tag, integer=True)
        self.weights = single_values(
            columns[tags.weight_tag], tags.weight_tag, integer=False
        ).astype(np.float64)
        bad = np.flatnonzero(~np.isfinite(self.weights) | (self.weights < 0))
        if len(bad):
            raise BadTable(
                f"column {tags.weight_tag!r}: weights must be finite and >= 0; "
                f"row {int(bad[0])} has {float(self.weights[bad[0]])} "
                f"({len(bad)} bad rows)"
            )
        self._id_order = np.argsort(self.ids, kind="stable")
        self._id_sorted = self.ids[self._id_order]
        dup = np.flatnonzero(self._id_sorted[1:] == self._id_sorted[:-1])
        if len(dup):
            value = int(self._id_sorted[dup[0]])
            count = int(np.count_nonzero(self.ids == value))
            raise BadTable(
                f"column {tags.dedup_tag!r}: dedup ids must be unique; id {value} "
                f"appears {count} times ({len(dup)} duplicates in all)"
            )
        self.by_category = AliasTable.build(self.categories, self.weights)
        self.overall = AliasTable.build(np.zeros(n, np.int64), self.weights)
        self._slot_ids = {
            id(self.by_category): self.ids.take(self.by_category.row),
            id(self.overall): self.ids.take(self.overall.row),
        }
        self._draw_tables = {
            id(at): _DrawTables.of(at, self._slot_ids[id(at)])
            for at in (self.by_category, self.overall)
        }

    # ---- lookups ----------------------------------------------------------------------------

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Table row of each id ((k,) int64), -1 where the id is not in the table.

        The queries are sorted first so the binary searches walk the sorted ids in order
        (3-5x fewer cache misses than searching in arrival order, measured; a numpy hash
        table was slower still).
        """
        order = np.argsort(ids)
        pos = np.empty(len(ids), np.int64)
        pos[order] = np.searchsorted(self._id_sorted, ids.take(order))
        np.minimum(pos, self.num_rows - 1, out=pos)
        return np.where(self._id_sorted.take(pos) == ids, self._id_order.take(pos), -1)

    def pack(self, ids: np.ndarray, default_value: int) -> dict[str, Column]:
        """Every column for ``ids`` ((k,) int64), in order.

        An id not in the table gets the row of ``default_value`` if that id is in the table;
        otherwise zeros (dense) / empty rows (ragged, str), with ``default_value`` in the
        dedup column.
        """
        rows = self.rows_of(ids)
        missing = rows < 0
        if missing.any():
            default_row = int(self.rows_of(np.array([default_value], np.int64))[0])
            rows[missing] = default_row
        out = {name: col.take(rows) for name, col in self.columns.items()}
        still = rows < 0
        if still.any():
            dedup = out[self.tags.dedup_tag]
            if dedup.offsets is None:
                dedup.values[still] = default_value
            else:
                lens = np.diff(dedup.offsets)
                lens[still] = 1
                starts = np.where(still, 0, dedup.offsets[:-1])
                src = np.concatenate(
                    [dedup.values.astype(np.int64), np.array([default_value], np.int64)]
                )
                starts = np.where(still, len(src) - 1, starts)
                values, offsets = ragged_gather(src.astype(dedup.values.dtype), starts, lens)
                out[self.tags.dedup_tag] = Column(dedup.kind, values, offsets)
        return out

    def stats(self) -> dict[str, int]:
        return {
            "rows": self.num_rows,
            "categories": self.by_category.num_groups,
            "sampleable_rows": len(self.by_category.row),
        }

    # ---- sampling ---------------------------------------------------------------------------

    def sample(
        self,
        pos_ids: np.ndarray,
        pos_categories: np.ndarray | None,
        cnts: np.ndarray,
        *,
        avoid_conflict: bool = True,
        avoid_all: bool = False,
        put_back: bool = True,
        max_rounds: int = 16,
        missing_id: int = -1,
        rng: np.random.Generator,
        threads: int = 0,
    ) -> SampleResult:
        """Draws ``cnts[i]`` negatives for every positive (see the module docstring).

        ``threads`` caps the compiled kernel's threads (0: torch's intra-op count, adapted to
        load); a server running requests side by side passes its share of the cores.

        Args:
            pos_ids: (b,) int64 dedup ids of the positives.
            pos_categories: (b,) int64 their categories, or ``None`` to draw from the whole
                table.
            cnts: (b,) int64 >= 0 negatives per positive.

        Returns:
            :class:`SampleResult` whose ``ids`` is (sum(cnts),) int64: positive ``i``'s
            negatives at ``[cumsum(cnts)[i] - cnts[i], cumsum(cnts)[i])``.
        """
        at = self.by_category if pos_categories is not None else self.overall
        slot_ids = self._slot_ids[id(at)]
        b = len(pos_ids)
        if pos_categories is not None:
            group = at.group_of(pos_categories)
        else:
            group = np.full(b, 0 if at.num_groups else -1, np.int64)
        offsets = np.zeros(b + 1, np.int64)
        np.cumsum(cnts, out=offsets[1:])
        # With counts >= 0, an int64 sum that wraps makes an offset decrease: one check
        # covers both, before any array is sized from them.
        if b and (int(cnts.min()) < 0 or bool((offsets[1:] < offsets[:-1]).any())):
            raise BadRequest(
                f"cnts must be >= 0 and sum to at most {np.iinfo(np.int64).max}, got "
                f"min {int(cnts.min())}"
            )
        if put_back:
            return self._sample_put_back(
                at,
                pos_ids,
                group,
                offsets,
                avoid_conflict,
                avoid_all,
                max_rounds,
                missing_id,
                rng,
                threads,
            )
        own_slot = np.full(b, -1, np.int64)
        own_rows = self.rows_of(pos_ids) if (avoid_conflict or avoid_all) else None
        if avoid_conflict and own_rows is not None:
            found = own_rows >= 0
            own_slot[found] = at.slot_of_row.take(own_rows[found])
        banned: np.ndarray | None = None
        allowed = _group_sizes(at, group)  # allowed items of each positive's category
        if avoid_all and own_rows is not None:
            banned, per_group = _banned_slots(at, own_rows)
            allowed -= np.where(group >= 0, per_group.take(np.maximum(group, 0)), 0)
        elif avoid_conflict and own_rows is not None:
            own_group = np.where(own_rows >= 0, at.group_of_row.take(np.maximum(own_rows, 0)), -1)
            allowed -= (own_slot >= 0) & (group >= 0) & (own_group == group)
        exact = (2 * cnts >= allowed) & (cnts > 0)
        sampled_rows = ~exact & (group >= 0) & (cnts > 0)

        held = HeldItems(len(at.row))
        rounds = 0
        result_slots = np.full(int(offsets[-1]), -1, np.int64)  # slot drawn, -1: none yet
        slot_owner = np.repeat(np.arange(b, dtype=np.int64), cnts)
        todo = np.flatnonzero(np.repeat(sampled_rows, cnts))
        slot_owner = slot_owner.take(todo)
        # slot_owner[k] is the positive of slot todo[k] from here on.
        while len(todo) and rounds < max_rounds:
            drawn = at.draw(group.take(slot_owner), rng)
            result_slots[todo] = drawn
            bad = self._conflicts(
                drawn, slot_owner, own_slot.take(slot_owner), banned, held, avoid_conflict
            )
            result_slots[todo[bad]] = -1
            todo = todo[bad]
            slot_owner = slot_owner[bad]
            rounds += 1
        if len(todo):
            # Rounds ran out: finish these positives exactly.
            exact[slot_owner] = True
        fallback_rows = np.flatnonzero(exact)
        if len(fallback_rows):
            self._exact_fill(
                at, fallback_rows, group, own_slot, banned, offsets, result_slots, put_back, rng
            )
        unfilled = result_slots < 0
        n_unfilled = int(np.count_nonzero(unfilled))
        if not n_unfilled:
            return SampleResult(
                ids=slot_ids.take(result_slots),
                rounds=rounds,
                fallback_positives=len(fallback_rows),
            )
        ids = (
            slot_ids.take(np.maximum(result_slots, 0))
            if len(slot_ids)
            else np.zeros(len(result_slots), np.int64)
        )
        ids[unfilled] = missing_id
        return SampleResult(
            ids=ids, unfilled=n_unfilled, rounds=rounds, fallback_positives=len(fallback_rows)
        )

    def _sample_put_back(
        self,
        at: AliasTable,
        pos_ids: np.ndarray,
        group: np.ndarray,
        offsets: np.ndarray,
        avoid_conflict: bool,
        avoid_all: bool,
        max_rounds: int,
        missing_id: int,
        rng: np.random.Generator,
        threads: int = 0,
    ) -> SampleResult:
        """Draws with replacement in the compiled kernel, then fills what it left exactly.

        Own-id conflicts are found by comparing ids (dedup ids are unique), so this path
        needs no id -> row lookup unless ``avoid_all`` or a positive reaches the fallback.

        Args:
            pos_ids: (b,) int64 dedup ids of the positives.
            group: (b,) int64 alias group of each positive, -1 if unknown.
            offsets: (b + 1,) int64 output range of each positive.
        """
        banned: np.ndarray | None = None
        kernel_group = group
        if avoid_all:
            banned, per_group = _banned_slots(at, self.rows_of(pos_ids))
            # A category whose items are all batch ids goes straight to the fallback.
            allowed = _group_sizes(at, group)
            allowed -= np.where(group >= 0, per_group.take(np.maximum(group, 0)), 0)
            kernel_group = np.where(allowed > 0, group, -1)
        own_ids = None
        if avoid_conflict and banned is None:
            own_ids = torch.from_numpy(np.require(pos_ids, np.int64, ["C", "W"]))
        tables = self._draw_tables[id(at)]
        seed = int(rng.integers(-(1 << 63), (1 << 63) - 1, dtype=np.int64, endpoint=True))
        ids_t, left_t, rounds = _C.sample_put_back(
            tables.slots,
            tables.start,
            tables.count,
            torch.from_numpy(kernel_group),
            torch.from_numpy(offsets),
            own_ids,
            None if banned is None else torch.from_numpy(banned),
            seed,
            max_rounds,
            missing_id,
            threads,
        )
        ids, left = ids_t.numpy(), left_t.numpy()
        # Positives with slots left: unknown category, no allowed item, or tries ran out.
        # Their left slots are the tail of their range and hold missing_id.
        rows = np.flatnonzero(left)
        unfilled = 0
        if len(rows):
            need = left.take(rows)
            own_slot = np.full(len(rows), -1, np.int64)
            if own_ids is not None:
                own_rows = self.rows_of(pos_ids.take(rows))
                found = own_rows >= 0
                own_slot[found] = at.slot_of_row.take(own_rows[found])
            sub_offsets = np.zeros(len(rows) + 1, np.int64)
            np.cumsum(need, out=sub_offsets[1:])
            sub_slots = np.full(int(sub_offsets[-1]), -1, np.int64)
            self._exact_fill(
                at,
                np.arange(len(rows)),
                group.take(rows),
                own_slot,
                banned,
                sub_offsets,
                sub_slots,
                True,
                rng,
            )
            tails = ragged_arange(offsets.take(rows + 1) - need, need)
            got = sub_slots >= 0
            ids[tails[got]] = self._slot_ids[id(at)].take(sub_slots[got])
            unfilled = int(np.count_nonzero(~got))
        return SampleResult(ids=ids, unfilled=unfilled, rounds=rounds, fallback_positives=len(rows))

    @staticmethod
    def _conflicts(
        drawn: np.ndarray,
        owners: np.ndarray | None,
        own: np.ndarray,
        banned: np.ndarray | None,
        held: HeldItems | None,
        avoid_conflict: bool,
    ) -> np.ndarray:
        """Which fresh draws (items ``drawn`` for positives ``owners``) must be drawn again.

        ``own`` is the own slot of each fresh draw's positive (used without ``banned``);
        ``held`` tracks the items each positive already holds (``put_back=False``).
        """
        if banned is not None:
            bad = banned.take(drawn)
        elif avoid_conflict:
            bad = drawn == own
        else:
            bad = np.zeros(len(drawn), bool)
        if held is not None and owners is not None:
            bad |= held.add(owners, drawn, bad)
        return bad

    def _exact_fill(
        self,
        at: AliasTable,
        rows: np.ndarray,
        group: np.ndarray,
        own_slot: np.ndarray,
        banned: np.ndarray | None,
        offsets: np.ndarray,
        result_slots: np.ndarray,
        put_back: bool,
        rng: np.random.Generator,
    ) -> None:
        """Fills the empty slots of positives ``rows`` by listing their allowed items."""
        rows = rows[group.take(rows) >= 0]
        if not len(rows):
            return
        sizes = at.count.take(group.take(rows))
        # Bound memory: a chunk of positives at a time (a loop over chunks, not over ids).
        cuts = np.diff(np.cumsum(sizes) // FALLBACK_CHUNK) | np.diff(
            np.arange(len(rows)) // FALLBACK_ROWS
        )
        chunks = np.split(np.arange(len(rows)), np.flatnonzero(cuts) + 1)
        all_rows = rows
        for chunk in chunks:
            rows = all_rows[chunk]
            g = group.take(rows)
            size = at.count.take(g)
            cand = ragged_arange(at.start.take(g), size)  # candidate slots, per positive
            owner = np.repeat(np.arange(len(rows)), size)
            ok = np.ones(len(cand), bool)
            if banned is not None:
                ok &= ~banned.take(cand)
            else:
                ok &= cand != own_slot.take(rows).take(owner)
            # Empty slots of each positive, and (put_back=False) items it already holds.
            slot_lo, slot_hi = offsets.take(rows), offsets.take(rows + 1)
            mine = ragged_arange(slot_lo, slot_hi - slot_lo)
            mine_owner = np.repeat(np.arange(len(rows)), slot_hi - slot_lo)
            held = result_slots.take(mine)
            empty = held < 0
            if not put_back:
                m = len(at.row)
                have = np.sort(mine_owner[~empty] * m + held[~empty])
                if len(have):
                    keys = owner * m + cand
                    pos = np.minimum(np.searchsorted(have, keys), len(have) - 1)
                    ok &= have.take(pos) != keys
            need = np.bincount(mine_owner[empty], minlength=len(rows))
            empty_slots = mine[empty]
            w = np.where(ok, at.weight.take(cand), 0.0)
            if put_back:
                # Inverse CDF over each positive's allowed items.
                cum = np.cumsum(w)
                seg_end = np.cumsum(size)
                seg_start = seg_end - size
                base = np.where(seg_start > 0, cum[np.maximum(seg_start - 1, 0)], 0.0)
                tot = cum[np.maximum(seg_end - 1, 0)] - base
                tot[size == 0] = 0.0
                has = tot > 0
                who = np.repeat(np.arange(len(rows)), need)
                fill = has.take(who)
                target = base.take(who) + rng.random(len(who)) * tot.take(who)
                idx = np.searchsorted(cum, target, side="right")
                # rounding at the very end of a segment: step back to its last allowed item
                last_ok = np.maximum.accumulate(np.where(w > 0, np.arange(len(w)), -1))
                idx = np.minimum(idx, np.maximum(seg_end.take(who) - 1, 0))
                idx = last_ok.take(idx) if len(idx) else idx
                chosen = np.where(fill, cand.take(np.maximum(idx, 0)) if len(cand) else -1, -1)
                result_slots[empty_slots] = chosen
                continue
            # Without replacement: the smallest Exp(1)/w keys per positive (Efraimidis-Spirakis).
            keys = np.full(len(cand), np.inf)
            keys[ok] = rng.standard_exponential(int(ok.sum())) / w[ok]
            # Sort by key, then stably by positive: radix sort on uint16 (chunks hold < 2**16).
            order = np.argsort(keys)
            order = order[np.argsort(owner.astype(np.uint16).take(order), kind="stable")]
            rank = np.arange(len(order)) - np.repeat(np.cumsum(size) - size, size)
            sorted_owner = owner[order]
            take = (rank < need.take(sorted_owner)) & np.isfinite(keys[order])
            picked_owner = sorted_owner[take]
            picked = cand[order][take]
            # Place the picks into each positive's empty slots, in order.
            first_empty = np.cumsum(need) - need
            k = np.arange(len(picked)) - (
                np.cumsum(np.bincount(picked_owner, minlength=len(rows)))
                - np.bincount(picked_owner, minlength=len(rows))
            ).take(picked_owner)
            result_slots[empty_slots.take(first_empty.take(picked_owner) + k)] = picked


def _group_sizes(at: AliasTable, group: np.ndarray) -> np.ndarray:
    """(b,) int64 number of drawable items of each group in ``group`` ((b,) int64, -1: 0)."""
    if not at.num_groups:
        return np.zeros(len(group), np.int64)
    return np.where(group >= 0, at.count.take(np.maximum(group, 0)), 0)


def _banned_slots(at: AliasTable, own_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The slots of the batch's dedup ids (``avoid_all``).

    Args:
        own_rows: (b,) int64 table rows of the batch's ids, -1 where not in the table.

    Returns:
        ``banned`` (m,) bool, and (g,) int64 how many banned slots each group has. The own
        ids are among the batch's ids, so the mask covers ``avoid_conflict`` too.
    """
    banned = np.zeros(len(at.row), bool)
    slots = at.slot_of_row.take(own_rows[own_rows >= 0])
    banned[slots[slots >= 0]] = True
    banned_groups = at.group_of_row.take(at.row.take(np.flatnonzero(banned)))
    return banned, np.bincount(banned_groups, minlength=at.num_groups)
