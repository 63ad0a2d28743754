"""The CUDA extension's loader: ``build/cuda/libstreamrec_cuda.so`` through ctypes (issue #14).

Torch on the CPU machines has no CUDA, so the kernels (``csrc/cuda/``, the C API in
``csrc/cuda/streamrec_cuda.h``) are built with plain ``nvcc`` into a shared library taking raw
device pointers (``tensor.data_ptr()``) and the current torch stream. :func:`load` checks for
a GPU first and raises :class:`~streamrec.embedding_store.errors.TierUnavailable` where there
is none; :func:`open_library` binds the library without that check (the build test binds it on
a CPU machine: its symbols and argument checks need no GPU).

Importing this module needs neither torch's CUDA nor the library: both are looked up on call.

Example (on a GPU machine)::

    ops = load()
    rows = ops.find(slots, keys)  # slots (capacity, 2) int64 cuda, keys (n,) int64 cuda
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamrec.embedding_store.errors import EmbeddingStoreError, TierUnavailable
from streamrec.embedding_store.tier import TABLE_SCALARS

if TYPE_CHECKING:
    import torch

#: the C API version this loader binds (streamrec_cuda_api_version)
API_VERSION = 1
#: the sources and the header
CUDA_DIR = Path(__file__).resolve().parent / "csrc" / "cuda"
#: where ``make cuda`` puts the library (the repository's build/cuda)
DEFAULT_LIBRARY = Path(__file__).resolve().parents[2] / "build" / "cuda" / "libstreamrec_cuda.so"
#: nvcc flags, the Makefile's NVCCFLAGS (tests/embedding_store/test_cuda_build.py checks
#: they agree): sm_80 and sm_90, no fused multiply-add (the CPU core's -ffp-contract=off)
NVCC_FLAGS = (
    "-std=c++17",
    "-O3",
    "-fmad=false",
    "-Xcompiler",
    "-fPIC",
    "-Xcompiler",
    "-Wall,-Wextra,-Werror",
    "-Werror",
    "all-warnings",
    "-gencode",
    "arch=compute_80,code=sm_80",
    "-gencode",
    "arch=compute_90,code=sm_90",
)

# error codes of streamrec_cuda.h
OK, ERR_CUDA, ERR_ARGUMENT, ERR_INDEX_FULL, ERR_ROWS_FULL, ERR_ROW_OUTSIDE = range(6)


class CudaOpError(EmbeddingStoreError):
    """A CUDA op failed: ``code`` is the C API's error code, the message its last error."""

    code = "cuda_op_failed"

    def __init__(self, op: str, rc: int, message: str) -> None:
        super().__init__(f"{op}: {message} (error code {rc})")
        self.rc = rc


class IndexFull(CudaOpError):
    """The GPU hash index has no empty slot for a new key: rebuild it larger and retry."""

    code = "cuda_index_full"


class RowsFull(CudaOpError):
    """The row matrix has no free row for a new key: grow it and retry."""

    code = "cuda_rows_full"


# ---- the header's structs ----
class Rule(ctypes.Structure):
    """StreamrecRule."""

    _fields_ = [
        ("kind", ctypes.c_int64),
        ("learning_rate", ctypes.c_double),
        ("initial_g2sum", ctypes.c_double),
        ("lower_bound", ctypes.c_double),
        ("upper_bound", ctypes.c_double),
        ("beta1", ctypes.c_double),
        ("beta2", ctypes.c_double),
        ("epsilon", ctypes.c_double),
    ]


class Init(ctypes.Structure):
    """StreamrecInit."""

    _fields_ = [("kind", ctypes.c_int64), ("a", ctypes.c_double), ("b", ctypes.c_double)]


class TableParams(ctypes.Structure):
    """StreamrecTableParams: a finalized ``_C.TableParams`` copied field by field."""

    _fields_ = [
        ("dim", ctypes.c_int64),
        ("width", ctypes.c_int64),
        ("embed_state", ctypes.c_int64),
        ("embedx_state", ctypes.c_int64),
        ("embed_rule", Rule),
        ("embedx_rule", Rule),
        ("embed_init", Init),
        ("embedx_init", Init),
        *[(name, ctypes.c_double) for name in TABLE_SCALARS],
        ("seed", ctypes.c_uint64),
    ]

    @classmethod
    def of(cls, p: Any) -> TableParams:
        """From the CPU core's finalized TableParams (``tier.table_params``)."""
        out = cls()
        for name in ("dim", "width", "embed_state", "embedx_state", "seed", *TABLE_SCALARS):
            setattr(out, name, getattr(p, name))
        for part in ("embed", "embedx"):
            rule, src = getattr(out, f"{part}_rule"), getattr(p, f"{part}_rule")
            for field in Rule._fields_:
                setattr(rule, field[0], getattr(src, field[0]))
            init, isrc = getattr(out, f"{part}_init"), getattr(p, f"{part}_init")
            init.kind, init.a, init.b = isrc.kind, isrc.a, isrc.b
        return out


class Index(ctypes.Structure):
    """StreamrecIndex: slots (capacity, 2) int64 device."""

    _fields_ = [("slots", ctypes.c_void_p), ("capacity", ctypes.c_int64)]


class NewRows(ctypes.Structure):
    """StreamrecNewRows."""

    _fields_ = [
        ("next_row", ctypes.c_void_p),
        ("max_rows", ctypes.c_int64),
        ("row_keys", ctypes.c_void_p),
        ("data", ctypes.c_void_p),
        ("created", ctypes.c_void_p),
        ("flag", ctypes.c_void_p),
    ]


class Push(ctypes.Structure):
    """StreamrecPush."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("R", ctypes.c_int64),
        ("row_keys", ctypes.c_void_p),
        ("rows", ctypes.c_void_p),
        ("grads", ctypes.c_void_p),
        ("shows", ctypes.c_void_p),
        ("clicks", ctypes.c_void_p),
        ("n", ctypes.c_int64),
        ("expanded", ctypes.c_void_p),
        ("flag", ctypes.c_void_p),
    ]


_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_PARAMS = ctypes.POINTER(TableParams)

#: every function of the C API: name -> (restype, argtypes); the stream is the last c_void_p
BINDINGS: dict[str, tuple[Any, list[Any]]] = {
    "streamrec_cuda_last_error": (ctypes.c_char_p, []),
    "streamrec_cuda_api_version": (_INT, []),
    "streamrec_cuda_device_count": (_INT, []),
    "streamrec_cuda_status": (_INT, [_P, _P]),
    "streamrec_cuda_index_init": (_INT, [Index, _P]),
    "streamrec_cuda_find": (_INT, [Index, _P, _I64, _P, _P, _P]),
    "streamrec_cuda_find_or_insert": (_INT, [Index, _P, _I64, _P, NewRows, _PARAMS, _P]),
    "streamrec_cuda_insert_or_assign": (_INT, [Index, _P, _P, _I64, _P, _P]),
    "streamrec_cuda_erase": (_INT, [Index, _P, _I64, _P, _P]),
    "streamrec_cuda_size": (_INT, [Index, _P, _P]),
    "streamrec_cuda_export": (_INT, [Index, _P, _P, _P, _P]),
    "streamrec_cuda_index_rebuild": (_INT, [Index, Index, _P, _P]),
    "streamrec_cuda_init_rows": (_INT, [_P, _P, _I64, _I64, _PARAMS, _P]),
    "streamrec_cuda_initial_weights": (_INT, [_P, _I64, _INT, _P, _PARAMS, _P]),
    "streamrec_cuda_gather": (_INT, [_P, _I64, _P, _I64, _P, _P, _PARAMS, _P]),
    "streamrec_cuda_gather_pooled": (_INT, [_P, _I64, _P, _P, _I64, _INT, _P, _P, _PARAMS, _P]),
    "streamrec_cuda_update": (_INT, [Push, _PARAMS, _P]),
    "streamrec_cuda_advance_day": (_INT, [_P, _I64, _PARAMS, _P]),
    "streamrec_cuda_shrink": (_INT, [_P, _I64, _P, _PARAMS, _P]),
    "streamrec_cuda_select_rows": (_INT, [_P, _I64, _INT, _P, _PARAMS, _P]),
    "streamrec_cuda_clear_dirty": (_INT, [_P, _I64, _PARAMS, _P]),
    "streamrec_cuda_mark_dirty": (_INT, [_P, _I64, _P, _I64, _PARAMS, _P]),
}


def library_path() -> Path:
    """The library to load: ``$STREAMREC_CUDA_LIB`` if set, else build/cuda's."""
    env = os.environ.get("STREAMREC_CUDA_LIB")
    return Path(env) if env else DEFAULT_LIBRARY


def nvcc_command(nvcc: str, out: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """The one nvcc command line that builds the library from every ``csrc/cuda/*.cu``."""
    sources = sorted(str(p) for p in CUDA_DIR.glob("*.cu"))
    return [nvcc, *NVCC_FLAGS, *extra, "-shared", "-o", str(out), *sources]


def build(out: Path | None = None, nvcc: str | None = None) -> Path:
    """Compiles every ``csrc/cuda/*.cu`` into ``out`` (as ``make cuda``); returns its path.

    Raises TierUnavailable when nvcc is missing, CudaOpError(ERR_CUDA) when it fails.
    """
    out = out or library_path()
    nvcc = nvcc or shutil.which("nvcc")
    if nvcc is None:
        raise TierUnavailable(
            f"the CUDA extension {out} is not built and nvcc is not on PATH to build it"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    done = subprocess.run(
        nvcc_command(nvcc, tmp),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise CudaOpError("build", ERR_CUDA, f"nvcc failed:\n{done.stderr[-4000:]}")
    tmp.replace(out)  # atomic: a concurrent loader sees the old file or the new one
    return out


def open_library(path: Path | None = None, build_missing: bool = True) -> ctypes.CDLL:
    """The library with every function of :data:`BINDINGS` declared; no GPU needed.

    Builds it first when it is missing and nvcc exists (``build_missing``).
    """
    path = path or library_path()
    if not path.exists():
        if not build_missing:
            raise TierUnavailable(f"the CUDA extension {path} is not built (run `make cuda`)")
        build(path)
    lib = ctypes.CDLL(str(path))
    for name, (restype, argtypes) in BINDINGS.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    version = lib.streamrec_cuda_api_version()
    if version != API_VERSION:
        raise TierUnavailable(
            f"{path} has C API version {version}, this loader binds {API_VERSION}: rebuild it"
        )
    return lib


def _no_gpu_reason() -> str | None:
    """Why this process cannot use a CUDA GPU through torch, or None when it can."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a dependency
        return f"torch is not importable ({exc})"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device"
    return None


def load(path: Path | None = None) -> CudaOps:
    """The CUDA ops on this machine's GPU; TierUnavailable where there is none."""
    reason = _no_gpu_reason()
    if reason is not None:
        raise TierUnavailable(
            f"the device tier needs a CUDA GPU for the store's CUDA extension; found none: {reason}"
        )
    return CudaOps(open_library(path))


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else int(t.data_ptr())


class CudaOps:
    """The C API over torch CUDA tensors, on the current torch stream.

    Every method takes contiguous tensors on the GPU (shapes as in ``streamrec_cuda.h``),
    raises CudaOpError (IndexFull, RowsFull) with the library's message, and, where a kernel
    can fail, synchronises the stream to read its error flag.
    """

    def __init__(self, lib: ctypes.CDLL) -> None:
        import torch

        self.lib = lib
        self._torch = torch
        self._flag = torch.zeros(1, dtype=torch.int32, device="cuda")

    # -- plumbing ----------------------------------------------------------------------------
    def _stream(self) -> int:
        return int(self._torch.cuda.current_stream().cuda_stream)

    def _call(self, op: str, rc: int) -> None:
        if rc != OK:
            message = self.lib.streamrec_cuda_last_error().decode(errors="replace")
            raise {ERR_INDEX_FULL: IndexFull, ERR_ROWS_FULL: RowsFull}.get(rc, CudaOpError)(
                op, rc, message
            )

    def _check_flag(self, op: str) -> None:
        self._call(op, self.lib.streamrec_cuda_status(_ptr(self._flag), self._stream()))

    def _zeros(self, n: int, dtype: Any) -> torch.Tensor:
        return self._torch.zeros(n, dtype=dtype, device="cuda")

    @staticmethod
    def _index(slots: torch.Tensor) -> Index:
        return Index(slots.data_ptr(), slots.shape[0])

    # -- hash index --------------------------------------------------------------------------
    def index_new(self, capacity: int) -> torch.Tensor:
        """An empty index: (capacity, 2) int64 cuda, capacity a power of two."""
        slots = self._torch.empty((capacity, 2), dtype=self._torch.int64, device="cuda")
        self._call(
            "index_init", self.lib.streamrec_cuda_index_init(self._index(slots), self._stream())
        )
        return slots

    def find(self, slots: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Row per key, -1 where absent. keys: (n,) int64 -> (n,) int64."""
        rows = self._torch.empty_like(keys)
        self._call(
            "find",
            self.lib.streamrec_cuda_find(
                self._index(slots), _ptr(keys), keys.numel(), _ptr(rows), None, self._stream()
            ),
        )
        return rows

    def find_or_insert(
        self,
        slots: torch.Tensor,
        keys: torch.Tensor,
        next_row: torch.Tensor,
        row_keys: torch.Tensor,
        data: torch.Tensor | None = None,
        params: TableParams | None = None,
    ) -> torch.Tensor:
        """Row per key, inserting absent keys with ids from next_row ((1,) int64 cuda,
        updated); row_keys (R,) int64 gets each new row's key; data (R, width) float32, when
        given, gets new rows initialised. Raises IndexFull / RowsFull."""
        rows = self._torch.empty_like(keys)
        nr = NewRows(
            _ptr(next_row), row_keys.numel(), _ptr(row_keys), _ptr(data), None, _ptr(self._flag)
        )
        if data is not None:
            nr.max_rows = min(row_keys.numel(), data.shape[0])
        pp = ctypes.byref(params) if params is not None else None
        self._call(
            "find_or_insert",
            self.lib.streamrec_cuda_find_or_insert(
                self._index(slots), _ptr(keys), keys.numel(), _ptr(rows), nr, pp, self._stream()
            ),
        )
        self._check_flag("find_or_insert")
        return rows

    def insert_or_assign(self, slots: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor) -> None:
        """Sets key -> val. keys, vals: (n,) int64 cuda, vals >= 0. Raises IndexFull."""
        self._call(
            "insert_or_assign",
            self.lib.streamrec_cuda_insert_or_assign(
                self._index(slots),
                _ptr(keys),
                _ptr(vals),
                keys.numel(),
                _ptr(self._flag),
                self._stream(),
            ),
        )
        self._check_flag("insert_or_assign")

    def erase(self, slots: torch.Tensor, keys: torch.Tensor) -> int:
        """Erases keys; returns how many were present. keys: (n,) int64 cuda."""
        erased = self._zeros(1, self._torch.int64)
        self._call(
            "erase",
            self.lib.streamrec_cuda_erase(
                self._index(slots), _ptr(keys), keys.numel(), _ptr(erased), self._stream()
            ),
        )
        return int(erased.item())

    def size(self, slots: torch.Tensor) -> int:
        """Live entries of the index."""
        out = self._zeros(1, self._torch.int64)
        self._call(
            "size", self.lib.streamrec_cuda_size(self._index(slots), _ptr(out), self._stream())
        )
        return int(out.item())

    def export(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every live (key, row), unordered: ((m,) int64, (m,) int64) cuda."""
        cap = slots.shape[0]
        keys = self._torch.empty(cap, dtype=self._torch.int64, device="cuda")
        rows = self._torch.empty_like(keys)
        count = self._zeros(1, self._torch.int64)
        self._call(
            "export",
            self.lib.streamrec_cuda_export(
                self._index(slots), _ptr(keys), _ptr(rows), _ptr(count), self._stream()
            ),
        )
        m = int(count.item())
        return keys[:m], rows[:m]

    def rebuild(self, slots: torch.Tensor, capacity: int) -> torch.Tensor:
        """A new index of capacity slots holding every live entry of slots (growth)."""
        dst = self._torch.empty((capacity, 2), dtype=self._torch.int64, device="cuda")
        self._call(
            "index_rebuild",
            self.lib.streamrec_cuda_index_rebuild(
                self._index(slots), self._index(dst), _ptr(self._flag), self._stream()
            ),
        )
        self._check_flag("index_rebuild")
        return dst

    # -- rows --------------------------------------------------------------------------------
    def init_rows(
        self, data: torch.Tensor, row_keys: torch.Tensor, start: int, count: int, p: TableParams
    ) -> None:
        """Initialises rows [start, start + count) of data (R, width) from row_keys (R,)."""
        if start < 0 or count < 0 or start + count > min(data.shape[0], row_keys.numel()):
            raise ValueError(f"rows [{start}, {start} + {count}) outside the table")
        self._call(
            "init_rows",
            self.lib.streamrec_cuda_init_rows(
                _ptr(data), _ptr(row_keys), start, count, ctypes.byref(p), self._stream()
            ),
        )

    def initial_weights(
        self, keys: torch.Tensor, p: TableParams, with_embedx: bool
    ) -> torch.Tensor:
        """keys (n,) int64 cuda -> (n, dim) float32 cuda, as init_rows draws them."""
        out = self._torch.empty((keys.numel(), p.dim), dtype=self._torch.float32, device="cuda")
        self._call(
            "initial_weights",
            self.lib.streamrec_cuda_initial_weights(
                _ptr(keys),
                keys.numel(),
                int(with_embedx),
                _ptr(out),
                ctypes.byref(p),
                self._stream(),
            ),
        )
        return out

    def gather(self, data: torch.Tensor, rows: torch.Tensor, p: TableParams) -> torch.Tensor:
        """Weights of rows (n,) int64 cuda, zeros where < 0 -> (n, dim) float32 cuda."""
        out = self._torch.empty((rows.numel(), p.dim), dtype=self._torch.float32, device="cuda")
        self._call(
            "gather",
            self.lib.streamrec_cuda_gather(
                _ptr(data),
                data.shape[0],
                _ptr(rows),
                rows.numel(),
                _ptr(out),
                _ptr(self._flag),
                ctypes.byref(p),
                self._stream(),
            ),
        )
        self._check_flag("gather")
        return out

    def gather_pooled(
        self,
        data: torch.Tensor,
        rows: torch.Tensor,
        offsets: torch.Tensor,
        p: TableParams,
        mean: bool = False,
    ) -> torch.Tensor:
        """Bags rows[offsets[b]:offsets[b + 1]] summed (or averaged) -> (bags, dim) float32."""
        bags = offsets.numel() - 1
        out = self._torch.empty((bags, p.dim), dtype=self._torch.float32, device="cuda")
        self._call(
            "gather_pooled",
            self.lib.streamrec_cuda_gather_pooled(
                _ptr(data),
                data.shape[0],
                _ptr(rows),
                _ptr(offsets),
                bags,
                int(mean),
                _ptr(out),
                _ptr(self._flag),
                ctypes.byref(p),
                self._stream(),
            ),
        )
        self._check_flag("gather_pooled")
        return out

    def update(
        self,
        data: torch.Tensor,
        row_keys: torch.Tensor,
        rows: torch.Tensor,
        grads: torch.Tensor,
        shows: torch.Tensor,
        clicks: torch.Tensor,
        p: TableParams,
    ) -> int:
        """The fused push; returns the rows expanded. rows (n,) int64; grads (n, dim);
        shows, clicks (n,) float32, all cuda."""
        expanded = self._zeros(1, self._torch.int64)
        push = Push(
            _ptr(data),
            data.shape[0],
            _ptr(row_keys),
            _ptr(rows),
            _ptr(grads),
            _ptr(shows),
            _ptr(clicks),
            rows.numel(),
            _ptr(expanded),
            _ptr(self._flag),
        )
        self._call("update", self.lib.streamrec_cuda_update(push, ctypes.byref(p), self._stream()))
        self._check_flag("update")
        return int(expanded.item())

    # -- day, shrink, save selection, dirty marks --------------------------------------------
    def advance_day(self, data: torch.Tensor, size: int, p: TableParams) -> None:
        self._call(
            "advance_day",
            self.lib.streamrec_cuda_advance_day(_ptr(data), size, ctypes.byref(p), self._stream()),
        )

    def shrink(self, data: torch.Tensor, size: int, p: TableParams) -> torch.Tensor:
        """Decays show/click of rows [0, size); the keep mask (size,) bool cuda."""
        keep = self._torch.empty(size, dtype=self._torch.uint8, device="cuda")
        self._call(
            "shrink",
            self.lib.streamrec_cuda_shrink(
                _ptr(data), size, _ptr(keep), ctypes.byref(p), self._stream()
            ),
        )
        return keep.bool()

    def select_rows(self, data: torch.Tensor, size: int, mode: int, p: TableParams) -> torch.Tensor:
        """Rows a save mode takes (0 all, 1 base, 2 delta): (size,) bool cuda."""
        sel = self._torch.empty(size, dtype=self._torch.uint8, device="cuda")
        self._call(
            "select_rows",
            self.lib.streamrec_cuda_select_rows(
                _ptr(data), size, mode, _ptr(sel), ctypes.byref(p), self._stream()
            ),
        )
        return sel.bool()

    def clear_dirty(self, data: torch.Tensor, size: int, p: TableParams) -> None:
        self._call(
            "clear_dirty",
            self.lib.streamrec_cuda_clear_dirty(_ptr(data), size, ctypes.byref(p), self._stream()),
        )

    def mark_dirty(self, data: torch.Tensor, rows: torch.Tensor, p: TableParams) -> None:
        """Sets the changed-since-save flag of rows (n,) int64 cuda (< 0 skipped)."""
        self._call(
            "mark_dirty",
            self.lib.streamrec_cuda_mark_dirty(
                _ptr(data),
                data.shape[0],
                _ptr(rows),
                rows.numel(),
                ctypes.byref(p),
                self._stream(),
            ),
        )
