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

import torch
from streamrec.pinned import MIN_BYTES, PinnedBuffers

__all__ = ["MIN_BYTES", "Staging", "aligned"]


def aligned(t: torch.Tensor) -> torch.Tensor:
    """t, or a copy of it where its data is not aligned to its element size (a view into a
    received message's bytes can start anywhere; the kernels read whole elements)."""
    return t if t.data_ptr() % t.element_size() == 0 else t.clone()


class Staging(PinnedBuffers):
    """Pinned host buffers per input name, for one device.

    Args:
        device: where inputs go.
        pin: page-lock the buffers (None: where the device is CUDA and CUDA is available).
    """

    def __init__(self, device: torch.device, pin: bool | None = None) -> None:
        self.device = device
        super().__init__(
            (device.type == "cuda" and torch.cuda.is_available()) if pin is None else pin
        )

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
        self.fence(name, stream)
        return out
