"""What a caller hands the store, checked once: the same rules in-process and remote.

:class:`~streamrec.embedding_store.store.EmbeddingStore` and
:class:`~streamrec.embedding_store.service.client.EmbeddingStoreClient` both call these, so an input
is accepted by both or refused by both, with the same error (tested on both). The rule for
keys (:func:`as_keys`)::

    accepted  a torch.Tensor or numpy array, 1-D, of an integer dtype: int64 as it is,
              int8/16/32 and uint8/16/32 widened, uint64 viewed as int64 (the bit pattern
              of a PaddleRec feasign is kept); a list or tuple of python ints (one in
              [2**63, 2**64) is a uint64 feasign, its bit pattern kept too)
    refused   floats, bools, complex, anything else, anything not 1-D: InvalidInput
              (a ValueError) naming the field, the dtype and the shape

Weights, gradients, shows and clicks (:func:`as_floats`) must be float32 tensors or arrays
of the expected shape; nothing is converted, so a float64 push is refused, not rounded. The
client checks a push's values (:func:`first_bad_value`) before anything is sent.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, TypeAlias

import numpy as np
import streamrec.embedding_store._C as _C
import torch
from streamrec.embedding_store.errors import InvalidInput, NonFiniteGradient

#: torch dtypes taken as keys: int64, those that widen to it without loss, uint64 (viewed)
_INTEGER = (
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint64,
    torch.uint32,
    torch.uint16,
    torch.uint8,
)


#: Keys as a caller may hand them (:func:`as_keys`): (n,) an integer tensor or array, or ints.
KeysLike: TypeAlias = torch.Tensor | np.ndarray | Sequence[int]
#: Float32 values as a caller may hand them (:func:`as_floats`): gradients, shows, clicks.
FloatsLike: TypeAlias = torch.Tensor | np.ndarray


def as_keys(keys: Any, field: str = "keys") -> torch.Tensor:
    """Checks keys and returns them as a contiguous CPU (n,) int64 tensor (no copy when they
    already are one). See the module doc for what is accepted.

    Raises:
        InvalidInput: not an integer 1-D tensor, array or list of ints; the message names
            ``field``, the dtype and the shape.
    """
    # the common case first: no message text built (pull/push check every table's keys)
    if isinstance(keys, torch.Tensor) and keys.dtype == torch.int64 and keys.dim() == 1:
        return keys.detach().to("cpu").contiguous()
    if isinstance(keys, np.ndarray) and keys.dtype == np.int64 and keys.ndim == 1:
        return _tensor(keys)
    if isinstance(keys, torch.Tensor):
        dtype, shape = str(keys.dtype), tuple(keys.shape)
        integer = keys.dtype in _INTEGER
    else:
        arr = _as_array(keys, field)
        dtype, shape = _numpy_dtype(keys, arr), arr.shape
        integer = arr.dtype.kind in "iu"
    if not integer:
        raise InvalidInput(f"{field} must be int64, got {dtype} with shape {shape}")
    if len(shape) != 1:
        raise InvalidInput(f"{field} must be 1-D (n,), got shape {shape} ({dtype})")
    if isinstance(keys, torch.Tensor):
        if keys.dtype == torch.uint64:
            return keys.detach().cpu().view(torch.int64).contiguous()
        return keys.detach().to("cpu", torch.int64).contiguous()
    arr = arr.view(np.int64) if arr.dtype == np.uint64 else arr.astype(np.int64, copy=False)
    return _tensor(arr)


def _as_array(keys: Any, field: str) -> np.ndarray:
    """An ndarray of keys given as an ndarray or a list/tuple of python ints."""
    if isinstance(keys, np.ndarray):
        return keys
    if isinstance(keys, list | tuple):
        kind = type(keys).__name__
        for k in keys:  # numpy would take True as 1 and truncate 1.5 to 1
            if not isinstance(k, int | np.integer) or isinstance(k, bool):
                raise InvalidInput(
                    f"{field} must be int64, got a {kind} of {len(keys)} holding "
                    f"{type(k).__name__} {k!r:.40}"
                )
        try:  # a key in [2**63, 2**64) is a uint64 feasign: keep its bit pattern
            values = [int(k) for k in keys]
            return np.array([k - 2**64 if 2**63 <= k < 2**64 else k for k in values], np.int64)
        except OverflowError as exc:
            raise InvalidInput(
                f"{field} must be 64-bit keys, got a {kind} of {len(keys)} holding a value "
                f"out of [-2**63, 2**64)"
            ) from exc
    raise InvalidInput(
        f"{field} must be a torch.Tensor, numpy array or list of ints, got {type(keys).__name__}"
    )


def _tensor(arr: np.ndarray) -> torch.Tensor:
    """``arr`` as a CPU tensor, sharing its memory when C-contiguous (else a contiguous copy:
    torch takes no negative strides; a 0-D array stays 0-D).

    The service's arrays are zero-copy views of the received frames, which are read-only;
    the store never writes its inputs (see ``EmbeddingStore.push``), so torch's warning
    about wrapping a read-only array is noise here (a copy of 25 MB per push is not) and is
    silenced for this call only."""
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if arr.flags.writeable:
        return torch.from_numpy(arr)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(arr)


def _numpy_dtype(given: Any, arr: np.ndarray) -> str:
    where = "numpy" if isinstance(given, np.ndarray) else f"{type(given).__name__} of"
    return f"{where} {arr.dtype}"


def as_floats(
    value: Any, field: str, shape: tuple[int, ...], keep_on: torch.device | None = None
) -> torch.Tensor:
    """Checks a float32 tensor or array of exactly ``shape`` and returns it as a contiguous
    CPU tensor (no copy when it already is one), or left on ``keep_on`` when it is already
    there (a device tier's gradients: no trip through host memory and back).

    Raises:
        InvalidInput: another type, dtype or shape; the message names ``field``.
    """
    if isinstance(value, np.ndarray):
        value = _tensor(value)
    if not isinstance(value, torch.Tensor):
        raise InvalidInput(
            f"{field} must be a torch.Tensor or numpy array, got {type(value).__name__}"
        )
    if value.dtype != torch.float32:
        raise InvalidInput(f"{field} must be float32, got {value.dtype}")
    if tuple(value.shape) != shape:
        raise InvalidInput(f"{field} must have shape {shape}, got {tuple(value.shape)}")
    stays = keep_on is not None and _on(value, keep_on)
    return value.detach().to(value.device if stays else "cpu").contiguous()


def _on(t: torch.Tensor, device: torch.device) -> bool:
    """Whether ``t`` lives on ``device``, a GPU (``cuda`` without an index: the current one)."""
    if device.type == "cpu" or t.device.type != device.type:
        return False
    index = torch.cuda.current_device() if device.index is None else device.index
    return t.device.index == index


def push_faults(grads: torch.Tensor, shows: torch.Tensor, clicks: torch.Tensor) -> tuple[int, int]:
    """(rows of ``grads`` holding NaN or Inf, keys whose show or click is NaN, Inf or < 0),
    counted before a push writes anything. CPU inputs: the C++ core's parallel check. Inputs
    on a GPU: the same counts by torch ops on that device, read back in one sync (the
    gradients never cross to the host)."""
    if grads.device.type == "cpu" and shows.device.type == "cpu" and clicks.device.type == "cpu":
        return _C.check_push(grads, shows, clicks)
    return push_faults_where(grads, shows.to(grads.device), clicks.to(grads.device))


def push_faults_where(
    grads: torch.Tensor, shows: torch.Tensor, clicks: torch.Tensor
) -> tuple[int, int]:
    """:func:`push_faults` by torch ops on the inputs' device (one sync)."""
    bad_rows = (~torch.isfinite(grads).all(dim=1)).sum()
    good_counts = torch.isfinite(shows) & (shows >= 0) & torch.isfinite(clicks) & (clicks >= 0)
    rows, counts = torch.stack([bad_rows, (~good_counts).sum()]).tolist()
    return int(rows), int(counts)


def check_aligned(tables: Any, **lists: Any) -> int:
    """Checks that ``tables`` is a list of names and every given list (None allowed)
    has one entry per table (the arguments of ``pull_many``/``push_many``); returns the
    table count."""
    if not isinstance(tables, list | tuple) or not all(isinstance(t, str) for t in tables):
        raise InvalidInput(f"tables must be a list of table names, got {tables!r:.200}")
    for name, value in lists.items():
        if value is None:
            continue
        if not isinstance(value, list | tuple):
            raise InvalidInput(
                f"{name} must be a list with one entry per table, got {type(value).__name__}"
            )
        if len(value) != len(tables):
            raise InvalidInput(
                f"{name} has {len(value)} entries for {len(tables)} tables {list(tables)[:8]}"
            )
    return len(tables)


def first_bad_value(columns: Mapping[str, Any]) -> tuple[str, int, bool] | None:
    """The first value of push columns that may not be applied: (column, row, whether it is
    NaN/Inf rather than negative), or None. grads must be finite, shows and clicks finite and
    >= 0; a column is (n,) or (n, dim), a tensor or an array; other columns are skipped."""
    for name in ("grads", "shows", "clicks"):
        value = columns.get(name)
        if value is None:
            continue
        v = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
        if not _C.all_finite(v):
            finite = torch.isfinite(v.reshape(v.shape[0], -1)).all(dim=1)
            return name, int((~finite).nonzero()[0, 0]), True
        if name != "grads" and bool((v < 0).any()):
            return name, int((v < 0).nonzero()[0, 0]), False
    return None


def refuse_push(bad: tuple[str, int, bool], table: str, where: str) -> NoReturn:
    """Raises the error for :func:`first_bad_value`'s finding in ``table`` (``where``: which
    row)."""
    name, _row, non_finite = bad
    if non_finite:
        raise NonFiniteGradient(
            f"{name}: holds NaN or Inf ({where}); nothing was pushed to table {table!r}"
        )
    raise InvalidInput(f"{name}: must be >= 0 ({where}); nothing was pushed to table {table!r}")
