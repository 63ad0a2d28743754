"""A batch's host tensors to the dense model's GPU through pinned buffers reused every step.

Why: ``t.to("cuda", non_blocking=True)`` from pageable memory is a synchronous copy through a
driver bounce buffer (non_blocking does nothing there). The rows the store pulled, pooled on
the host by the sparse forward ((B, S, d) float32, or S tensors (B, d_k)), and the dense
features ((B, F) float32) are copied into page-locked buffers (``slots`` per name, used in
turn, grown by doubling, reused every step), then to the GPU with one asynchronous copy each,
on the current stream (the one the dense model computes on, so it sees the data); the rows'
gradient comes back to the host in backward, where the store's push reads it::

    forward   host t --copy_--> pinned buf[name#k] --async H2D, then fence[name#k]--> device
    backward  grad (device) --D2H--> host grad of t (the sparse gather's backward, the push)

    step      0       1       2       3
    buffer    name#0  name#1  name#0  name#1     (slots=2: double-buffered)
    waits     -       -       fence 0 fence 1

A buffer is refilled only after its previous copy finished reading it: the fence (a CUDA event
recorded after that copy) is waited first. Double-buffered, that copy is the one of two
stagings ago: filling the next batch's buffer never waits for the H2D copy of the batch the
GPU is about to run. On a CPU model nothing is staged: every call gives its input back as it
is (no copy, no autograd node).
"""

from __future__ import annotations

from typing import Any

import torch
from streamrec.pinned import MIN_BYTES, PinnedBuffers

__all__ = ["MIN_BYTES", "Staging"]


class Staging(PinnedBuffers):
    """Pinned host buffers by name, for the device the dense model runs on.

    Args:
        device: where the dense model runs.
        stage: copy host tensors through the buffers (None: where ``device`` is CUDA). True
            on a CPU device runs the same staging ending in a host copy instead of the H2D
            one (how the tests check its logic without a GPU).
        pin: page-lock the buffers (None: where staging to a CUDA device).
        slots: buffers per name, used in turn (>= 1; 2: double-buffered).

    Example:
        >>> st = Staging(torch.device("cuda"))
        >>> ly = st.rows(sparse.forward(pulled))          # (B, S, d) on the GPU
        >>> p = dense(st.to_device("dense", batch.dense), ly)
        >>> loss(p).backward()                            # pulled.weights.grad on the host
    """

    def __init__(
        self,
        device: torch.device,
        stage: bool | None = None,
        pin: bool | None = None,
        slots: int = 2,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.device = device
        self.active = device.type == "cuda" if stage is None else stage
        self.slots = slots
        #: per name, the slot its next staging fills
        self._turn: dict[str, int] = {}
        super().__init__((self.active and device.type == "cuda") if pin is None else pin)

    def slot(self, name: str) -> str:
        """The buffer the next staging of ``name`` fills (``name#k``, k in turn over the
        slots); moves the name's turn on."""
        k = self._turn.get(name, 0)
        self._turn[name] = (k + 1) % self.slots
        return f"{name}#{k}"

    def slot_names(self, name: str) -> list[str]:
        """The buffers of ``name``, in the order they are filled."""
        return [f"{name}#{k}" for k in range(self.slots)]

    def staged(self, t: torch.Tensor) -> bool:
        """Whether :meth:`to_device` copies ``t`` through a buffer (a host tensor while
        staging); else it is moved as it is (or already there)."""
        return self.active and t.device.type == "cpu"

    def to_device(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the device (not differentiable: see :meth:`rows`): itself where it is
        there already and nothing is staged; a host tensor through the name's buffer."""
        if not self.staged(t):
            return t.to(self.device, non_blocking=True)  # no-op where it is there already
        slot = self.slot(name)
        staged = self.stage(slot, t)
        if self.device.type != "cuda":
            return staged.clone()  # a host "device": the copy is done when clone returns
        out = staged.to(self.device, non_blocking=self.pin)
        self.fence(slot, torch.cuda.current_stream(self.device))
        return out

    def release(self) -> None:
        """Drops every buffer (after their copies finished); the turns start again."""
        super().release()
        self._turn = {}

    def rows(
        self, ly: torch.Tensor | list[torch.Tensor], name: str = "rows"
    ) -> torch.Tensor | list[torch.Tensor]:
        """The sparse forward's output ((B, S, d), or S tensors (B, d_k)) on the device,
        differentiable: backward brings each tensor's gradient back to where it was."""
        if isinstance(ly, torch.Tensor):
            return self._rows(ly, name)
        return [self._rows(t, f"{name}.{k}") for k, t in enumerate(ly)]

    def _rows(self, t: torch.Tensor, name: str) -> torch.Tensor:
        if not self.staged(t):
            return t.to(self.device, non_blocking=True)
        out = _StagedCopy.apply(t, self, name)
        assert isinstance(out, torch.Tensor)
        return out


class _StagedCopy(torch.autograd.Function):
    """out = t on the staging's device through its buffer; backward: the gradient back to
    t's device and dtype (a synchronous D2H copy: the push needs it on the host anyway)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, staging: Staging, name: str) -> torch.Tensor:
        ctx.source = (t.device, t.dtype)
        return staging.to_device(name, t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        device, dtype = ctx.source
        return grad.to(device, dtype), None, None
