"""Deduplication of a batch's keys: the one C++ dedup, and when the client uses it.

:func:`unique_keys` is what the store (summing a push's repeats, pooling bags) and the client
(routing) deduplicate with; :func:`unique_groups`, the same over many tables' keys at once,
the trainer's (one row per distinct key of a table in a batch).
:class:`DedupPolicy` decides, per table, whether the client deduplicates a batch before
sending it; the rows come out the same either way (a shard sums repeats in the same float64
order), only the bytes sent and the client's work differ.
"""

from __future__ import annotations

import threading

import streamrec.embedding_store._C as _C
import torch
from streamrec.errors import BadRequest

#: a table whose last measured batch repeated fewer than this share of its keys sends its
#: keys as they are, repeats included (the shard sums them itself, in the same float64 order,
#: so the rows come out the same): for nearly distinct keys the dedup, the spread back and the
#: summing cost more than the few rows they save on the wire (a 100k-key uniform dim-64 step:
#: about 9 ms against 0.1 ms of transport)
DEDUP_MIN_REPEATS = 0.1
#: of the routes a table makes (a push reusing its pull's route does not count), every this
#: many-th deduplicates again to measure anew
DEDUP_RECHECK = 16
DEDUP_MODES = ("auto", "always", "never")


def unique_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct keys in order of first occurrence and the inverse (a C++ hash dedup).

    keys: (n,) int64 -> (uniq (u,) int64, inverse (n,) int64) with uniq[inverse] == keys.
    """
    return _C.unique(keys.contiguous())


def unique_groups(
    keys: torch.Tensor, counts: list[int]
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """:func:`unique_keys` of each group of ``keys`` (``counts[t]`` keys of group ``t``, laid
    end to end), in one C++ call: a trainer's dedup of every table of a batch.

    Returns:
        (distinct (U,) int64: each group's distinct keys in order of first occurrence, group
        after group; inverse (n,) int64: each key's position in ``distinct``; distinct keys
        per group (T,))
    """
    return _C.unique_groups(keys.contiguous(), counts)


class DedupPolicy:
    """Whether a table's next batch is deduplicated before it is sent (thread-safe).

    Args:
        mode: ``"auto"`` (deduplicate unless the table's last measured batch repeated under
            :data:`DEDUP_MIN_REPEATS` of its keys; every :data:`DEDUP_RECHECK`-th batch
            measures again), ``"always"`` or ``"never"``.
    """

    def __init__(self, mode: str = "auto") -> None:
        if mode not in DEDUP_MODES:
            raise BadRequest(f"dedup must be one of {list(DEDUP_MODES)}, got {mode!r}")
        self.mode = mode
        #: per table: (share of repeated keys in its last deduplicated batch, batches since)
        self._repeats: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def decide(self, table: str) -> bool:
        """Whether to deduplicate this batch of ``table`` (counts it towards the next
        measure when not); a deduplicated batch should be reported with :meth:`measured`."""
        with self._lock:
            share, since = self._repeats.get(table, (1.0, 0))
            dedup = self.mode == "always" or (
                self.mode == "auto" and (share >= DEDUP_MIN_REPEATS or since + 1 >= DEDUP_RECHECK)
            )
            self._repeats[table] = (share, 0 if dedup else since + 1)
        return dedup

    def measured(self, table: str, keys: int, distinct: int) -> None:
        """A deduplicated batch of ``table`` held ``keys`` keys, ``distinct`` of them distinct."""
        with self._lock:
            self._repeats[table] = (1.0 - distinct / max(keys, 1), 0)
