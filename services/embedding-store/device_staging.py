"""Host inputs to a CUDA device through pinned staging buffers kept and reused between calls.

Why: ``t.to("cuda", non_blocking=True)`` from pageable memory is a synchronous copy through a
driver bounce buffer (non_blocking does nothing there). A push stages its keys, gradients,
shows and clicks into page-locked buffers (one per input name, grown by doubling, reused
every step), then copies each to the device with one asynchronous H2D copy on the device's
current stream (the stream the CUDA ops launch on, so the kernels see the data)::

    host t --copy_--> pinned buf[name] --async H2D, then fence[name] recorded--> device out

A buffer is overwritten only after its previous copy finished reading it: the fence (a CUDA
event recorded after that copy) is waited first. Where there is no CUDA (the CPU build of the
kernels) nothing is pinned and inputs already on the device are returned as they are.
"""

from __future__ import annotations

from typing import Protocol

import torch

#: the smallest buffer, bytes: small batches share one allocation
MIN_BYTES = 1 << 16


def aligned(t: torch.Tensor) -> torch.Tensor:
    """t, or a copy of it where its data is not aligned to its element size (a view into a
    received message's bytes can start anywhere; the kernels read whole elements)."""
    return t if t.data_ptr() % t.element_size() == 0 else t.clone()


class Fence(Protocol):
    """What a buffer waits on before reuse (a ``torch.cuda.Event`` on a GPU)."""

    def synchronize(self) -> None: ...


class Staging:
    """Pinned host buffers per input name, for one device.

    Args:
        device: where inputs go.
        pin: page-lock the buffers (None: where the device is CUDA and CUDA is available).
    """

    def __init__(self, device: torch.device, pin: bool | None = None) -> None:
        self.device = device
        self.pin = (device.type == "cuda" and torch.cuda.is_available()) if pin is None else pin
        self._bufs: dict[str, torch.Tensor] = {}
        self._fences: dict[str, Fence] = {}
        #: buffers allocated so far (growth; a steady workload stops adding)
        self.allocations = 0

    def buffer(self, name: str, nbytes: int) -> torch.Tensor:
        """The name's buffer, (>= nbytes,) uint8 host, free to overwrite: its last copy has
        finished (the fence waited); grown by doubling when too small."""
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

    def stage(self, name: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """t (host, any layout) as a contiguous dtype tensor in the name's buffer (host)."""
        nbytes = t.numel() * dtype.itemsize
        staged = self.buffer(name, nbytes)[:nbytes].view(dtype).view(t.shape)
        staged.copy_(t)  # converts and packs in one pass
        return staged

    def to_device(self, name: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """t as a contiguous dtype tensor on the device: as it is (or cast there) when it is
        already on the device, no host round trip; from the host through the name's buffer."""
        if t.device == self.device:
            return aligned(t.to(dtype=dtype).contiguous())
        if self.device.type != "cuda" or t.device.type != "cpu":
            return aligned(t.to(device=self.device, dtype=dtype).contiguous())  # another GPU
        staged = self.stage(name, t, dtype)
        out = torch.empty(t.shape, dtype=dtype, device=self.device)
        stream = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(stream):
            out.copy_(staged, non_blocking=self.pin)
        fence = torch.cuda.Event()
        fence.record(stream)
        self._fences[name] = fence
        return out

    def nbytes(self) -> int:
        """Host bytes the buffers hold."""
        return sum(b.numel() for b in self._bufs.values())

    def release(self) -> None:
        """Drops every buffer (after their copies finished)."""
        for fence in self._fences.values():
            fence.synchronize()
        self._bufs, self._fences = {}, {}
