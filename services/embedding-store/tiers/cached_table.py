"""A GPU cache of hot rows in front of a host or ssd table (``gpu_cache_budget_mb``).

:class:`CachedTable` is a :class:`~streamrec.embedding_store.tiers.table_tier.TableTier` wrapping a
:class:`~streamrec.embedding_store.tiers.host_table.HostTable` or
:class:`~streamrec.embedding_store.tiers.ssd_table.SsdTable` (the *backing* table). It keeps full
rows (weights, statistics, optimizer state) of recently used keys on ``device``, at most
``gpu_cache_budget_mb`` MiB, and runs pulls and the fused push on them there; a row leaves
the cache only when evicted (written back to the backing table if a push changed it) or when
an operation on the whole table flushes the cache first (save/export, shrink, day, load).

The bookkeeping (:class:`SlotMap`) is plain torch ops on ``device``, no per-key Python loop,
and the rows' gather and fused update are the CUDA extension's ops, so the same code runs on
``"cuda"`` and, for the tests, on ``"cpu"`` (the CPU build of the kernels: only pinned
staging and streams are left to a GPU)::

    slots  (sets * ways,)  a key lives in one set, set = mix(key) mod sets, any of its ways
    set 0  [ way 0 | way 1 | ... | way W-1 ]   keys, valid, dirty, stamp per slot
    set 1  [ ...                           ]
    data   (sets * ways, width) float32: the cached rows, slot-indexed

Eviction is LRU by call: every pull/push is one tick, the slots it touches get that tick as
stamp; a miss takes, within its set, an empty way first, then the oldest stamp (ties: the
lower way), never a way touched by the same call. A miss finding no such way (more misses in
one set than ways) is served from the backing table directly (*bypass*), not cached.

Invariant: a cached key is present in the backing table (a pull creates it there first), and
its cached row is the newest (``dirty`` when it differs from the backing table's).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import streamrec.embedding_store._C as _C
import torch
from streamrec.embedding_store.dedup import unique_keys
from streamrec.embedding_store.errors import InvalidInput, TierUnavailable
from streamrec.embedding_store.tiers import cuda_ext
from streamrec.embedding_store.tiers.device_staging import Staging
from streamrec.embedding_store.tiers.table_tier import TableTier

#: ways per set: a key's row can sit in any of this many slots
WAYS = 8
#: the multiplier of the key mix (2**64 / golden ratio, as a signed int64)
_MIX = 0x9E3779B97F4A7C15 - 2**64


def cache_slots(budget_mb: float, width: int) -> int:
    """Slots a budget of ``budget_mb`` MiB holds: a row (4 * width), its key and stamp (8 + 8)
    and its valid and dirty flags (1 + 1) per slot."""
    return max(int(budget_mb * 2**20 // (4 * width + 18)), 1)


class SlotMap:
    """Which key each slot of a set-associative cache holds; torch ops on ``device``.

    Args:
        slots: slots wanted (rounded down to a multiple of ``ways``, at least one set).
        ways: slots per set.
        device: where the bookkeeping lives (the cache's device).
    """

    def __init__(self, slots: int, ways: int = WAYS, device: str | torch.device = "cpu") -> None:
        if slots < 1 or ways < 1:
            raise InvalidInput(f"a cache needs slots >= 1 and ways >= 1, got {slots}, {ways}")
        self.device = torch.device(device)
        self.ways = min(ways, slots)
        self.sets = slots // self.ways
        n = self.sets * self.ways
        self.keys = torch.zeros(n, dtype=torch.int64, device=self.device)  # (slots,)
        self.valid = torch.zeros(n, dtype=torch.bool, device=self.device)
        self.dirty = torch.zeros(n, dtype=torch.bool, device=self.device)
        self.stamp = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.tick = 0
        self._way = torch.arange(self.ways, dtype=torch.int64, device=self.device)

    @property
    def slots(self) -> int:
        return self.keys.numel()

    def begin(self) -> None:
        """Starts a call: what it touches is stamped with a new tick."""
        self.tick += 1

    def set_of(self, keys: torch.Tensor) -> torch.Tensor:
        """Set of each key. keys: (n,) int64 -> (n,) int64 in [0, sets)."""
        h = keys * _MIX
        return torch.remainder(h ^ (h >> 29), self.sets)

    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        """Slot of each key, -1 where not cached. keys: (n,) int64 -> (n,) int64."""
        base = self.set_of(keys) * self.ways
        cand = base[:, None] + self._way  # (n, ways)
        match = (self.keys[cand] == keys[:, None]) & self.valid[cand]
        way = match.to(torch.int8).argmax(dim=1)
        return torch.where(match.any(dim=1), base + way, -1)

    def touch(self, slots: torch.Tensor) -> None:
        """Stamps ``slots`` (m,) int64 (all >= 0) with this call's tick."""
        self.stamp[slots] = self.tick

    def claim(self, keys: torch.Tensor) -> torch.Tensor:
        """Slots for ``keys`` (m,) int64, distinct and not cached: per set, the k-th key (in
        order) takes the k-th way by eviction order (empty, then oldest stamp, then lower
        way), -1 (bypass) when that way was touched in this call or k >= ways. Writes
        nothing: the caller writes back the dirty rows there, then calls :meth:`fill`."""
        m = keys.numel()
        if m == 0:
            return keys.new_empty(0)
        sets = self.set_of(keys)
        order = torch.argsort(sets, stable=True)
        in_order = sets[order]
        rank = torch.empty_like(sets)
        rank[order] = torch.arange(m, device=self.device) - torch.searchsorted(in_order, in_order)
        base = sets * self.ways
        cand = base[:, None] + self._way  # (m, ways)
        prio = torch.where(self.valid[cand], self.stamp[cand], -1)  # empty ways first
        way_order = torch.argsort(prio, dim=1, stable=True)
        pick = way_order.gather(1, rank.clamp(max=self.ways - 1)[:, None])  # (m, 1)
        free = prio.gather(1, pick).squeeze(1) < self.tick  # not touched by this call
        return torch.where(free & (rank < self.ways), base + pick.squeeze(1), -1)

    def occupied(self, slots: torch.Tensor) -> torch.Tensor:
        """Of ``slots`` (m,) int64, those holding a dirty row: (k,) int64."""
        return slots[self.valid[slots] & self.dirty[slots]]

    def fill(self, slots: torch.Tensor, keys: torch.Tensor) -> None:
        """Slots (m,) int64 now hold ``keys`` (m,) int64, clean, stamped with this tick."""
        self.keys[slots] = keys
        self.valid[slots] = True
        self.dirty[slots] = False
        self.stamp[slots] = self.tick

    def changed(self) -> torch.Tensor:
        """Slots holding a row that differs from the backing table's: (k,) int64."""
        return (self.valid & self.dirty).nonzero().squeeze(1)

    def size(self) -> int:
        return int(self.valid.sum())

    def clear(self) -> None:
        self.valid.zero_()
        self.dirty.zero_()


class _RowOps:
    """gather and the fused update over a row matrix on ``device``: the CUDA extension's ops,
    on a GPU or, on ``"cpu"``, from the CPU build of the same kernels (the tests run the
    cache's GPU code path there; the math is the CPU core's, bit for bit)."""

    def __init__(self, params: _C.TableParams, device: torch.device) -> None:
        # under a guard for this device, on its current stream
        self.cuda = cuda_ext.load_cpu() if device.type == "cpu" else cuda_ext.load(device)
        self._gp = cuda_ext.TableParams.of(params)

    def gather(self, data: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Weights (n, dim) float32 of ``rows`` (n,) int64 of ``data``; -1 reads zeros."""
        return self.cuda.gather(data, rows.contiguous(), self._gp)

    def set_round_step(self, step: int) -> None:
        """The push counter of the update's stochastic rounding (a compact row's)."""
        self._gp.round_step = step

    def update(
        self,
        data: torch.Tensor,
        row_keys: torch.Tensor,
        rows: torch.Tensor,
        grads: torch.Tensor,
        shows: torch.Tensor,
        clicks: torch.Tensor,
    ) -> int:
        """The fused push of rows (n,) int64 (all >= 0); returns the rows expanded."""
        return self.cuda.update(data, row_keys, rows.contiguous(), grads, shows, clicks, self._gp)


class _Misses(NamedTuple):
    """The keys of a call not found in the cache, as fetched from the backing table."""

    at: torch.Tensor  # (m,) int64 on the device: their positions among the call's keys
    full: torch.Tensor  # (m, width) float32 CPU: their rows (zeros where absent)
    present: torch.Tensor  # (m,) bool CPU: present in the backing table


class CachedTable(TableTier):
    """A host or ssd table with its hot rows cached on ``device`` (write-back).

    Args:
        backing: the table holding every row (its counters are this table's counters).
        budget_mb: the cache's memory on ``device``, MiB (rows, keys and bookkeeping).
        device: ``"cuda"`` (or ``"cuda:N"``); ``"cpu"`` runs the same cache in RAM on the CPU
            build of the kernels (tests).
        ways: slots per set.

    Raises:
        TierUnavailable: ``device`` is a CUDA device and none is present.
    """

    def __init__(
        self,
        backing: TableTier,
        budget_mb: float,
        device: str | torch.device = "cuda",
        ways: int = WAYS,
    ) -> None:
        # the backing table's layout, parameters and counters, not a second copy of them
        self.options, self.params = backing.options, backing.params
        self.dim, self.width, self.counters = backing.dim, backing.width, backing.counters
        self.payload = backing.payload
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise TierUnavailable(
                f"table {self.options.name!r}: gpu_cache_budget_mb caches rows in GPU memory "
                f"and needs a CUDA GPU; torch {torch.__version__} sees none"
            )
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.backing = backing
        self.map = SlotMap(cache_slots(budget_mb, self.width), ways, self.device)
        self.data = torch.zeros(self.map.slots, self.width, device=self.device)
        self._ops = _RowOps(self.params, self.device)
        self._staging = Staging(self.device)  # a push's cached part, through pinned buffers
        self.gpu_counters = {"gpu_cache_hits": 0, "gpu_cache_misses": 0}
        self.kind = backing.kind
        self.resident_device = self.device

    # -- the backing table, through its public methods -----------------------------------
    def _fetch(self, keys: torch.Tensor, create: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Full rows (m, width) and present (m,) bool of distinct ``keys`` (m,) int64 (CPU),
        created first when ``create`` (the backing table's admission applies)."""
        full = torch.zeros(keys.numel(), self.width)
        present = torch.zeros(keys.numel(), dtype=torch.bool)
        step = self.backing.rows_per_call()
        for a in range(0, keys.numel(), step):
            part = keys[a : a + step]
            got, found = self.backing.full_rows(part, create)
            present[a : a + part.numel()] = found
            full[a : a + part.numel()] = got
        return full, present

    def _write_back(self, slots: torch.Tensor) -> None:
        """Writes the rows at ``slots`` (k,) int64 to the backing table (they are present
        there: the invariant)."""
        if slots.numel() == 0:
            return
        keys, rows = self.map.keys[slots].cpu(), self.data[slots].cpu()
        step = self.backing.rows_per_call()
        for a in range(0, keys.numel(), step):
            self.backing.write_rows(keys[a : a + step], rows[a : a + step])
        self.map.dirty[slots] = False

    def flush(self, clear: bool = False) -> None:
        """Writes every changed row back; empties the cache when ``clear``."""
        self._write_back(self.map.changed())
        if clear:
            self.map.clear()

    # -- pull / push ------------------------------------------------------------------------
    def _slots(self, keys: torch.Tensor, create: bool) -> tuple[torch.Tensor, _Misses | None]:
        """Slots (u,) int64 on the device of distinct ``keys`` (u,) int64 (CPU) after
        bringing the misses in, -1 for keys left out of the cache (absent, or bypassed); and
        the misses as fetched (None when every key hit)."""
        self.map.begin()
        kd = keys.to(self.device, non_blocking=True)
        slots = self.map.lookup(kd)
        hit = slots >= 0
        self.map.touch(slots[hit])
        miss = (~hit).nonzero().squeeze(1)
        self.gpu_counters["gpu_cache_hits"] += keys.numel() - miss.numel()
        self.gpu_counters["gpu_cache_misses"] += miss.numel()
        if miss.numel() == 0:
            return slots, None
        full, present = self._fetch(keys[miss.cpu()], create)
        pd = present.to(self.device)
        place = self.map.claim(kd[miss][pd])  # (p,), -1 bypass
        ok = place >= 0
        into = place[ok]
        self._write_back(self.map.occupied(into))
        self.map.fill(into, kd[miss][pd][ok])
        self.data[into] = full[present].to(self.device)[ok]
        slots[miss[pd]] = place
        return slots, _Misses(miss, full, present)

    def pull_resident(self, keys: torch.Tensor, create: bool) -> torch.Tensor:
        """Weights (n, dim) float32 on the cache's device of ``keys`` (n,) int64 (CPU)."""
        uniq, inverse = unique_keys(keys)
        slots, misses = self._slots(uniq, create)
        out = self._ops.gather(self.data, slots)
        if misses is not None:
            left = (slots[misses.at] < 0).cpu()  # bypassed or absent: their fetched rows
            if bool(left.any()):
                m = misses.present.numel()
                rows = torch.where(misses.present, torch.arange(m), -1)[left]
                w = _C.gather(misses.full, rows.contiguous(), self.params)
                out[misses.at[left.to(self.device)]] = w.to(self.device)
        return out.index_select(0, inverse.to(self.device))

    def pull(self, keys: torch.Tensor, create: bool, hint: object = None) -> torch.Tensor:
        return self.pull_resident(keys, create).cpu()

    def push(
        self, keys: torch.Tensor, grads: torch.Tensor, shows: torch.Tensor, clicks: torch.Tensor
    ) -> bool:
        uniq, _ = unique_keys(keys)
        if uniq.numel() != keys.numel():
            return False  # the store sums repeats (in float64, as the host tier) and retries
        slots, _ = self._slots(keys, False)
        cached = slots >= 0
        if bool(cached.any()):
            at = cached.nonzero().squeeze(1)
            rows = slots[at]
            on = at.cpu() if self.device.type == "cuda" else at

            def dev(name: str, t: torch.Tensor) -> torch.Tensor:
                return self._staging.to_device(name, t[on], torch.float32)

            # a compact row's stochastic rounding: new bits per push (the backing table's
            # counter, which its own pushes bump too)
            self.params.round_step += 1
            self._ops.set_round_step(self.params.round_step)

            self.counters["rows_expanded"] += self._ops.update(
                self.data,
                self.map.keys,
                rows,
                dev("grads", grads),
                dev("shows", shows),
                dev("clicks", clicks),
            )
            self.map.dirty[rows] = True
        rest = (~cached).nonzero().squeeze(1).cpu()
        if rest.numel():  # absent (the backing table creates them, admission) or bypassed
            pushed = self.backing.push(
                keys[rest], grads[rest].contiguous(), shows[rest], clicks[rest]
            )
            assert pushed, "distinct keys reported as repeated"
        return True

    # -- operations on the whole table: the backing table's, after a flush -----------------
    def size(self) -> int:
        return self.backing.size()

    def inspect(self, keys: torch.Tensor) -> dict[str, torch.Tensor]:
        self.flush()
        return self.backing.inspect(keys)

    def advance_day(self) -> None:
        self.flush(clear=True)
        self.backing.advance_day()

    def shrink(self) -> torch.Tensor:
        self.flush(clear=True)
        return self.backing.shrink()

    def erase(self, keys: torch.Tensor) -> torch.Tensor:
        self.flush(clear=True)
        return self.backing.erase(keys)

    def export(self, select: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.flush()
        return self.backing.export(select)

    def full_rows(self, keys: torch.Tensor, create: bool) -> tuple[torch.Tensor, torch.Tensor]:
        self.flush()
        return self.backing.full_rows(keys, create)

    def write_rows(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        self.flush(clear=True)
        self.backing.write_rows(keys, rows)

    def rows_per_call(self) -> int:
        return self.backing.rows_per_call()

    def clear_dirty(self) -> None:
        self.flush(clear=True)
        self.backing.clear_dirty()

    def import_rows(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        self.flush(clear=True)
        self.backing.import_rows(keys, rows)

    def import_weights(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.flush(clear=True)
        self.backing.import_weights(keys, values)

    def mark_dirty(self, keys: torch.Tensor) -> None:
        self.flush(clear=True)
        self.backing.mark_dirty(keys)

    def reset(self) -> None:
        self.map.clear()
        self.backing.reset()

    def bytes_used(self) -> dict[str, int]:
        m = self.map
        own = self.data.numel() * 4 + m.keys.numel() * 8 + m.stamp.numel() * 8
        own += m.valid.numel() + m.dirty.numel()
        return {**self.backing.bytes_used(), "device": int(own)}

    def stats(self) -> dict[str, Any]:
        s = self.backing.stats()
        s["bytes"] = self.bytes_used()
        below = s.get("rows_by_tier", {self.backing.kind: s["rows"]})
        s["rows_by_tier"] = {**below, "device": self.map.size()}
        hits, misses = self.gpu_counters["gpu_cache_hits"], self.gpu_counters["gpu_cache_misses"]
        looked = hits + misses
        s.update(self.gpu_counters)
        s["gpu_cache_hit_rate"] = hits / looked if looked else 1.0
        s["gpu_cache_rows_max"] = self.map.slots
        return s

    def close(self) -> None:
        self._staging.release()
        self.map.clear()
        self.data = torch.zeros(0, self.width, device=self.device)
        self.backing.close()
