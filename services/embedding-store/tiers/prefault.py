"""Fresh row memory mapped ahead of row creation, on one background thread.

The first write to a fresh page costs ~2 s/GiB here (the kernel maps and zeroes it), so a
host table asks one background thread, shared by every host table of the process, to touch
the row memory its next creations will write (``_C.prefault``). Contents are not changed,
so the mapping may run while rows are written; the task holds the buffers it maps.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import streamrec.embedding_store._C as _C
import torch

#: rows mapped ahead of creation at least
PREFAULT_ROWS = 1 << 16
_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="emb-prefault")


class Prefaulter:
    """How many leading rows of one table's buffers are mapped (or asked to be).

    The buffers are tensors of equal row count (a host table's row matrix and row keys);
    when the table replaces them, it says how many rows the copy mapped with :meth:`reset`.
    """

    def __init__(self) -> None:
        self.mapped = 0

    def map_now(self, buffers: tuple[torch.Tensor, ...], rows: int) -> None:
        """Maps the first ``rows`` rows of every buffer before returning."""
        for t in buffers:
            _C.prefault(t, 0, rows)
        self.mapped = rows

    def reset(self, mapped: int) -> None:
        """The buffers were replaced; their first ``mapped`` rows are mapped already."""
        self.mapped = mapped

    def ahead(self, buffers: tuple[torch.Tensor, ...], size: int, created: int) -> None:
        """Asks the background thread to map the rows the next creations will write: twice
        the last creation (``created`` rows), at least :data:`PREFAULT_ROWS`, past the
        ``size`` rows in use and within the buffers."""
        want = min(size + max(2 * created, PREFAULT_ROWS), buffers[0].shape[0])
        if want <= self.mapped:
            return
        lo, self.mapped = self.mapped, want
        for t in buffers:
            _POOL.submit(_C.prefault, t, lo, want)
