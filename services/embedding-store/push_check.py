"""A push of one table, checked whole before anything is written (the in-process store's).

:func:`checked_push` validates a table's keys, gradients, shows and clicks (dtypes, shapes,
NaN/Inf, shows and clicks >= 0) and converts them to tensors; the store then writes the
:class:`CheckedPush` (``EmbeddingStore.push``), or every table's of a ``push_many`` once all
of them passed, so a bad part writes nothing anywhere.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from streamrec.embedding_store.errors import InvalidInput, NonFiniteGradient
from streamrec.embedding_store.tiers.table_tier import TableTier
from streamrec.embedding_store.validation import as_floats, as_keys, push_faults


class CheckedPush(NamedTuple):
    """One table's push, validated and converted (see :func:`checked_push`)."""

    table: str
    tier: TableTier
    keys: torch.Tensor  # (n,) int64
    grads: torch.Tensor  # (n, dim) float32
    shows: torch.Tensor  # (n,) float32
    clicks: torch.Tensor  # (n,) float32


class PushDefaults:
    """The shows (1 per occurrence) and clicks (0) of a push that sends none: read-only views
    of kept buffers (filling fresh ones each push costs a parallel pass)."""

    def __init__(self) -> None:
        self._buffers: dict[float, torch.Tensor] = {}

    def constant(self, value: float, n: int) -> torch.Tensor:
        """(n,) float32 of ``value``, a view of the buffer kept for it (grown as needed)."""
        buf = self._buffers.get(value)
        if buf is None or buf.numel() < n:
            buf = torch.full((max(n, 1024),), value)
            self._buffers[value] = buf
        return buf[:n]


def checked_push(
    table: str,
    tier: TableTier,
    keys: Any,
    grads: Any,
    shows: Any | None,
    clicks: Any | None,
    defaults: PushDefaults,
) -> CheckedPush:
    """Validates one table's push (dtypes, shapes, NaN/Inf, shows/clicks >= 0) and converts it
    to tensors; writes nothing.

    Args:
        table: the table's name (named in the errors).
        tier: the table's tier (its dim; a device tier keeps inputs on its GPU).
        keys: (n,) int64 (see :func:`~streamrec.embedding_store.validation.as_keys`).
        grads: (n, dim) float32.
        shows: (n,) float32, or None for 1 per key occurrence.
        clicks: (n,) float32, or None for 0.
        defaults: the store's buffers of the shows and clicks sent as None.

    Raises:
        NonFiniteGradient: a gradient is NaN or Inf (the first such key named).
        InvalidInput: a bad dtype or shape, or shows/clicks not finite and >= 0.
    """
    keys = as_keys(keys, f"table {table!r}: keys")
    n, dim = keys.numel(), tier.dim
    # a device table takes gradients already on its GPU as they are (checked there)
    keep_on = tier.push_device
    grads = as_floats(grads, f"table {table!r}: grads", (n, dim), keep_on)
    shows = (
        defaults.constant(1.0, n)
        if shows is None
        else as_floats(shows, f"table {table!r}: shows", (n,), keep_on)
    )
    clicks = (
        defaults.constant(0.0, n)
        if clicks is None
        else as_floats(clicks, f"table {table!r}: clicks", (n,), keep_on)
    )
    bad_rows, bad_counts = push_faults(grads, shows, clicks)
    if bad_rows:
        bad = ~torch.isfinite(grads).all(dim=1)
        first = int(keys[int(bad.nonzero()[0, 0])])
        raise NonFiniteGradient(
            f"table {table!r}: grads hold NaN or Inf for {bad_rows} of {n} keys "
            f"(first key {first}); nothing of this push was written"
        )
    if bad_counts:
        raise InvalidInput(
            f"table {table!r}: shows and clicks must be finite and >= 0 "
            f"({bad_counts} of {n} keys are not)"
        )
    return CheckedPush(table, tier, keys, grads, shows, clicks)
