"""How every CUDA op reaches the library: :class:`CudaCalls`, the base of ``CudaOps``.

A call runs under a device guard for the ops' device, on that device's current stream, and
raises :class:`~streamrec.embedding_store.tiers.cuda_lib.CudaOpError` (``IndexFull``,
``RowsFull``) with the library's message; a kernel's error comes back through an error flag
of the call's own. Tensors are checked (device, dtype, rank, contiguity, width) before any
pointer reaches the library.

Counted: :meth:`CudaCalls.counts` gives the calling thread's launches (the library's kernels,
memsets, sorts and scans, each counted once, plus the torch fills the wrapper queues), host
syncs (a kernel flag read back, a value read to the host) and host-to-device copies, the same
on the CPU build as on a GPU. Inside :meth:`CudaCalls.no_syncs` a sync raises
:class:`HostSync` instead (tests assert a step never waits).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from streamrec.embedding_store.tiers.cuda_lib import (
    ERR_INDEX_FULL,
    ERR_ROWS_FULL,
    OK,
    CudaOpError,
    Index,
    IndexFull,
    RowsFull,
    TableParams,
)

if TYPE_CHECKING:
    import torch
    from streamrec.embedding_store.tiers.device_rows import RowChunks


def ptr(t: torch.Tensor | None) -> int | None:
    """A tensor's data pointer for the C API (None: a null pointer)."""
    return None if t is None else int(t.data_ptr())


class HostSync(AssertionError):
    """A host synchronisation inside :meth:`CudaOps.no_syncs` (a step that must not wait)."""


class OpCounts(NamedTuple):
    """What a thread asked of the device: ops queued (kernels, memsets, a sort or a scan
    counted once, torch fills), waits for the device, host-to-device copies."""

    launches: int = 0
    syncs: int = 0
    copies: int = 0

    def __sub__(self, other: tuple[int, ...]) -> OpCounts:  # type: ignore[override]
        return OpCounts(*(a - b for a, b in zip(self, other, strict=True)))


class _ThreadCounts(threading.local):
    """The wrapper's own counts per thread (the library keeps its launches and syncs)."""

    def __init__(self) -> None:
        self.launches = 0
        self.syncs = 0
        self.copies = 0
        self.forbidden: str | None = None  # inside no_syncs: what must not wait


_COUNTS = _ThreadCounts()


class CudaCalls:
    """The library over torch tensors on one device (a CUDA GPU, or the CPU for the CPU
    build): device guard, stream, errors, tensor checks, counts and the sync guard.

    Args:
        lib: the library (:func:`~streamrec.embedding_store.tiers.cuda_lib.open_library`).
        device: where its tensors live; ``cpu`` only for the CPU build.
    """

    def __init__(self, lib: ctypes.CDLL, device: torch.device) -> None:
        import torch

        self.lib = lib
        self._torch = torch
        cpu_build = bool(lib.streamrec_cuda_cpu_device())
        if cpu_build != (device.type == "cpu"):
            raise ValueError(
                f"the {'CPU' if cpu_build else 'CUDA'} build of the library cannot run on {device}"
            )
        self.device = device

    # -- plumbing ----------------------------------------------------------------------------
    def _guard(self) -> contextlib.AbstractContextManager[Any]:
        if self.device.type == "cuda":
            return self._torch.cuda.device(self.device)
        return contextlib.nullcontext()

    def _stream(self) -> int | None:
        if self.device.type == "cuda":
            return int(self._torch.cuda.current_stream(self.device).cuda_stream)
        return None

    def _run(self, op: str, fn: Callable[..., int], *args: Any) -> None:
        """fn(*args, stream) under the device guard; raises its error."""
        with self._guard():
            self._raise(op, fn(*args, self._stream()))

    # -- counts ------------------------------------------------------------------------------
    def counts(self) -> OpCounts:
        """The calling thread's launches, syncs and copies so far (subtract two readings for
        a step's)."""
        lib = self.lib
        return OpCounts(
            int(lib.streamrec_cuda_launch_count()) + _COUNTS.launches,
            int(lib.streamrec_cuda_sync_count()) + _COUNTS.syncs,
            _COUNTS.copies,
        )

    @contextlib.contextmanager
    def no_syncs(self, what: str) -> Iterator[None]:
        """Inside, any host sync of this thread through these ops raises :class:`HostSync`
        naming ``what`` (a step that must not wait)."""
        before, _COUNTS.forbidden = _COUNTS.forbidden, what
        try:
            yield
        finally:
            _COUNTS.forbidden = before

    def note_launch(self, count: int = 1) -> None:
        """Counts device work queued outside the library (a torch fill or copy kernel)."""
        _COUNTS.launches += count

    def note_copy(self, count: int = 1) -> None:
        """Counts a host-to-device copy (asynchronous: not a sync)."""
        _COUNTS.copies += count

    def _may_sync(self, what: str) -> None:
        if _COUNTS.forbidden is not None:
            raise HostSync(f"{what}: a host sync inside {_COUNTS.forbidden}")

    def synced(self, what: str) -> None:
        """Counts a sync the caller makes through torch (refused in no_syncs)."""
        self._may_sync(what)
        _COUNTS.syncs += 1

    def read(self, t: torch.Tensor, what: str = "read") -> torch.Tensor:
        """t on the host: a sync where t is on a GPU, counted (and refused in no_syncs)."""
        self._may_sync(what)
        _COUNTS.syncs += 1
        return t.cpu()

    def item(self, t: torch.Tensor, what: str = "item") -> int:
        """The one int of t, read to the host (a counted sync)."""
        self.synced(what)
        return int(t.item())

    def _raise(self, op: str, rc: int) -> None:
        if rc != OK:
            message = self.lib.streamrec_cuda_last_error().decode(errors="replace")
            raise {ERR_INDEX_FULL: IndexFull, ERR_ROWS_FULL: RowsFull}.get(rc, CudaOpError)(
                op, rc, message
            )

    def _flag(self) -> torch.Tensor:
        """A call's own error flag, zeroed: never shared, so no other call reads or clears it."""
        return self._zeros(1, self._torch.int32)

    def _check_flag(self, op: str, flag: torch.Tensor) -> None:
        self._may_sync(op)  # the library counts the wait
        self._run(op, self.lib.streamrec_cuda_status, ptr(flag))

    def _empty(self, shape: tuple[int, ...] | int, dtype: Any) -> torch.Tensor:
        return self._torch.empty(shape, dtype=dtype, device=self.device)

    def _zeros(self, n: int, dtype: Any) -> torch.Tensor:
        self.note_launch()  # a fill
        return self._torch.zeros(n, dtype=dtype, device=self.device)

    def _check(
        self, op: str, name: str, t: torch.Tensor, dtype: Any, dims: int, width: int | None = None
    ) -> None:
        """Refuses a tensor the kernels would misread: device, dtype, rank, contiguity, width."""
        problem = None
        if t.device != self.device:
            problem = f"is on {t.device}, the ops run on {self.device}"
        elif t.dtype != dtype:
            problem = f"has dtype {t.dtype}, needs {dtype}"
        elif t.dim() != dims:
            problem = f"has shape {tuple(t.shape)}, needs {dims} dimension(s)"
        elif not t.is_contiguous():
            problem = "is not contiguous"
        elif t.data_ptr() % t.element_size():
            problem = f"is not aligned to its {t.element_size()}-byte elements"
        elif width is not None and t.shape[1] != width:
            problem = f"has shape {tuple(t.shape)}, needs {width} columns"
        if problem is not None:
            raise ValueError(f"{op}: {name} {problem}")

    def _keys(self, op: str, keys: torch.Tensor, name: str = "keys") -> None:
        self._check(op, name, keys, self._torch.int64, 1)

    def _slots(self, op: str, slots: torch.Tensor) -> Index:
        self._check(op, "slots", slots, self._torch.int64, 2, 2)
        return Index(slots.data_ptr(), slots.shape[0])

    def _table(
        self,
        op: str,
        data: torch.Tensor | RowChunks | None,
        p: TableParams | None,
        row_keys: torch.Tensor | None = None,
        keys: bool = False,
    ) -> RowChunks:
        """A chunked table as it is, or an (R, stride) matrix and (R,) keys as one chunk."""
        from streamrec.embedding_store.tiers.device_rows import RowChunks

        if isinstance(data, RowChunks):
            problem = None
            if data.device != self.device:
                problem = f"is on {data.device}, the ops run on {self.device}"
            elif p is not None and data.stride not in (0, p.stride):  # 0: keys only
                problem = f"has stride {data.stride}, the params {p.stride}"
            elif keys and not data.has_keys():
                problem = "has no row keys"
            if problem is not None:
                raise ValueError(f"{op}: table {problem}")
            return data
        if data is not None:
            assert p is not None, "params come with data"
            self._check(op, "data", data, self._torch.float32, 2, p.stride)
        if row_keys is not None:
            self._keys(op, row_keys, "row_keys")
        elif keys:
            raise ValueError(f"{op}: row_keys must be given")
        return RowChunks.single(data, row_keys)
