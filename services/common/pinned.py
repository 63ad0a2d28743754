"""Page-locked host buffers by name, reused between calls, for copies to a GPU.

Why: ``t.to("cuda", non_blocking=True)`` from pageable memory is a synchronous copy through a
driver bounce buffer (non_blocking does nothing there). A tensor is staged into its name's
page-locked buffer (grown by doubling, reused every call), then copied to the device with
one asynchronous H2D copy; a fence (a CUDA event recorded after that copy) is waited before
the buffer is overwritten. The store's device tier stages its pushes this way
(``embedding_store/device_staging.py``), the trainer a batch's rows and dense features
(``trainer/model/staging.py``).
"""

from __future__ import annotations

from typing import Protocol

import torch

#: the smallest buffer, bytes: small tensors share one allocation's worth of growth
MIN_BYTES = 1 << 16


class Fence(Protocol):
    """What a buffer waits on before reuse (a ``torch.cuda.Event`` on a GPU)."""

    def synchronize(self) -> None: ...


class PinnedBuffers:
    """Host buffers by name, page-locked where ``pin``.

    Attributes:
        allocations: buffers allocated so far (growth: a steady workload stops adding).
    """

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self._bufs: dict[str, torch.Tensor] = {}
        self._fences: dict[str, Fence] = {}
        self.allocations = 0

    def buffer(self, name: str, nbytes: int) -> torch.Tensor:
        """The name's buffer, (>= nbytes,) uint8 on the host, free to overwrite: its last
        copy has finished (the fence waited); replaced by one of double the size when too
        small."""
        fence = self._fences.pop(name, None)
        if fence is not None:
            fence.synchronize()  # the previous H2D copy out of this buffer is done
        buf = self._bufs.get(name)
        if buf is None or buf.numel() < nbytes:
            size = max(nbytes, MIN_BYTES, 2 * buf.numel() if buf is not None else 0)
            buf = torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)
            self._bufs[name] = buf
            self.allocations += 1
        return buf

    def stage(self, name: str, t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``t`` (host, any layout) as a contiguous tensor of ``dtype`` (None: t's) in the
        name's buffer, converted and packed in one pass (valid until the name is staged
        again)."""
        dtype = t.dtype if dtype is None else dtype
        nbytes = t.numel() * dtype.itemsize
        staged = self.buffer(name, nbytes)[:nbytes].view(dtype).view(t.shape)
        staged.copy_(t)
        return staged

    def fence(self, name: str, stream: torch.cuda.Stream) -> None:
        """Records, on ``stream``, the point the name's buffer is free again (after the copy
        out of it just queued there)."""
        event = torch.cuda.Event()
        event.record(stream)
        self._fences[name] = event

    def nbytes(self) -> int:
        """Host bytes the buffers hold."""
        return sum(b.numel() for b in self._bufs.values())

    def release(self) -> None:
        """Drops every buffer (after their copies finished)."""
        for fence in self._fences.values():
            fence.synchronize()
        self._bufs, self._fences = {}, {}
