"""The CUDA library's C API through ctypes (``csrc/cuda/streamrec_cuda.h``), and its builds.

One source, two builds:

- nvcc's (``make cuda``: ``build/cuda/libstreamrec_cuda.so``): the kernels on a GPU, taking
  raw device pointers (``tensor.data_ptr()``) and a torch stream;
- the CPU build (``make cuda-cpu``, :func:`build_cpu`: ``build/cuda-cpu/libstreamrec_cuda_cpu.so``):
  the same kernel bodies compiled by g++ against the CUDA toolkit's CCCL headers, run on CPU
  threads by Thrust's OpenMP backend, over CPU tensors. It is how the kernels' code runs in CI
  on machines without a GPU; a real GPU run stays the final word.

:mod:`streamrec.embedding_store.tiers.cuda_ext` wraps either in :class:`~streamrec.embedding_store.
cuda_ext.CudaOps`. Importing this module needs neither torch's CUDA nor a library.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from streamrec.embedding_store.errors import EmbeddingStoreError, TierUnavailable
from streamrec.embedding_store.tiers.table_tier import TABLE_SCALARS

#: the C API version this loader binds (streamrec_cuda_api_version)
API_VERSION = 6
#: the sources and the header
#: (this module is in the package's tiers/, the sources in its csrc/)
CUDA_DIR = Path(__file__).resolve().parents[1] / "csrc" / "cuda"
#: the row math both builds (and the CPU core) include
SHARED_DIR = CUDA_DIR.parent / "shared"
_BUILD = Path(__file__).resolve().parents[3] / "build"
#: where ``make cuda`` puts the library (the repository's build/cuda)
DEFAULT_LIBRARY = _BUILD / "cuda" / "libstreamrec_cuda.so"
#: where ``make cuda-cpu`` (or :func:`build_cpu` on first use) puts the CPU build
DEFAULT_CPU_LIBRARY = _BUILD / "cuda-cpu" / "libstreamrec_cuda_cpu.so"
#: nvcc flags, the Makefile's NVCCFLAGS (tests/embedding_store/test_cuda_build.py checks
#: they agree): SASS for sm_80 and sm_90 and compute_90 PTX (newer GPUs JIT it), no fused
#: multiply-add (the CPU core's -ffp-contract=off)
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
    "-gencode",
    "arch=compute_90,code=compute_90",
)
#: g++ flags of the CPU build: the kernels' bodies on OpenMP threads (Thrust's OMP backend),
#: no fused multiply-add (as nvcc's -fmad=false), the sources read as C++
CPU_FLAGS = (
    "-std=c++17",
    "-O2",
    "-fopenmp",
    "-fPIC",
    "-shared",
    "-ffp-contract=off",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-DSTREAMREC_CPU_DEVICE",
    "-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP",
)
#: where the CUDA toolkit keeps its CCCL headers (Thrust, CUB, libcu++), newest layout first
CCCL_DIRS = ("include/cccl", "targets/x86_64-linux/include/cccl", "include")

# error codes of streamrec_cuda.h
(
    OK,
    ERR_CUDA,
    ERR_ARGUMENT,
    ERR_INDEX_FULL,
    ERR_ROWS_FULL,
    ERR_ROW_OUTSIDE,
    ERR_NONFINITE,
    ERR_BAD_COUNT,
) = range(8)


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
class _Struct(ctypes.Structure):
    """A C struct whose keyword arguments must name its fields: plain ctypes sets any other
    name as a Python attribute the library never sees (a renamed field passed silently)."""

    def __init__(self, *args: Any, **fields: Any) -> None:
        names = [f[0] for f in self._fields_]
        unknown = sorted(set(fields) - set(names))
        if unknown:
            raise TypeError(
                f"{type(self).__name__} has no field {', '.join(unknown)}; "
                f"its fields: {', '.join(names)}"
            )
        super().__init__(*args, **fields)


class Rule(_Struct):
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


class Init(_Struct):
    """StreamrecInit."""

    _fields_ = [("kind", ctypes.c_int64), ("a", ctypes.c_double), ("b", ctypes.c_double)]


class TableParams(_Struct):
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
        ("stride", ctypes.c_int64),
        ("dtype", ctypes.c_int64),
        ("round_step", ctypes.c_uint64),
    ]

    @classmethod
    def of(cls, p: Any, pad: bool = False) -> TableParams:
        """From the CPU core's finalized TableParams (``tier.table_params``); pad: rows
        padded to a multiple of 4 floats (16 bytes: the gather loads 4 weights at once)."""
        out = cls()
        out.stride = -(-p.width // 4) * 4 if pad else p.width
        names = ("dim", "width", "embed_state", "embedx_state", "seed", "dtype", "round_step")
        for name in (*names, *TABLE_SCALARS):
            setattr(out, name, getattr(p, name))
        for part in ("embed", "embedx"):
            rule, src = getattr(out, f"{part}_rule"), getattr(p, f"{part}_rule")
            for field in Rule._fields_:
                setattr(rule, field[0], getattr(src, field[0]))
            init, isrc = getattr(out, f"{part}_init"), getattr(p, f"{part}_init")
            init.kind, init.a, init.b = isrc.kind, isrc.a, isrc.b
        return out


class Index(_Struct):
    """StreamrecIndex: slots (capacity, 2) int64 device."""

    _fields_ = [("slots", ctypes.c_void_p), ("capacity", ctypes.c_int64)]


class Rows(_Struct):
    """StreamrecRows: a table's rows in chunks of ``2**shift`` rows (device pointer arrays)."""

    _fields_ = [
        ("chunks", ctypes.c_void_p),
        ("key_chunks", ctypes.c_void_p),
        ("shift", ctypes.c_int64),
        ("R", ctypes.c_int64),
    ]


class NewRows(_Struct):
    """StreamrecNewRows."""

    _fields_ = [
        ("next_row", ctypes.c_void_p),
        ("table", Rows),
        ("created", ctypes.c_void_p),
        ("flag", ctypes.c_void_p),
    ]


class Push(_Struct):
    """StreamrecPush."""

    _fields_ = [
        ("table", Rows),
        ("rows", ctypes.c_void_p),
        ("grads", ctypes.c_void_p),
        ("shows", ctypes.c_void_p),
        ("clicks", ctypes.c_void_p),
        ("n", ctypes.c_int64),
        ("expanded", ctypes.c_void_p),
        ("flag", ctypes.c_void_p),
    ]


class BlockTable(_Struct):
    """StreamrecBlockTable: one table of a block (an array of these lives on the device)."""

    _fields_ = [
        ("index", Index),
        ("table", Rows),
        ("next_row", ctypes.c_void_p),
        ("error", ctypes.c_void_p),
        ("counters", ctypes.c_void_p),
        ("params", TableParams),
    ]


class Block(_Struct):
    """StreamrecBlock: P parts over n positions, part p of table part_table[p]."""

    _fields_ = [
        ("tables", ctypes.c_void_p),
        ("offsets", ctypes.c_void_p),
        ("part_table", ctypes.c_void_p),
        ("parts", ctypes.c_int64),
        ("n", ctypes.c_int64),
        ("dim", ctypes.c_int64),
        ("max_rows", ctypes.c_int64),
        ("part_bits", ctypes.c_int64),
    ]


_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIZE, _U64 = ctypes.c_size_t, ctypes.c_uint64
_PARAMS = ctypes.POINTER(TableParams)

#: every function of the C API: name -> (restype, argtypes); the stream is the last c_void_p
BINDINGS: dict[str, tuple[Any, list[Any]]] = {
    "streamrec_cuda_last_error": (ctypes.c_char_p, []),
    "streamrec_cuda_api_version": (_INT, []),
    "streamrec_cuda_device_count": (_INT, []),
    "streamrec_cuda_driver_version": (_INT, []),
    "streamrec_cuda_runtime_version": (_INT, []),
    "streamrec_cuda_cpu_device": (_INT, []),
    "streamrec_cuda_status": (_INT, [_P, _P]),
    "streamrec_cuda_launch_count": (_U64, []),
    "streamrec_cuda_sync_count": (_U64, []),
    "streamrec_cuda_index_init": (_INT, [Index, _P]),
    "streamrec_cuda_find": (_INT, [Index, _P, _I64, _P, _P, _P]),
    "streamrec_cuda_find_or_insert": (_INT, [Index, _P, _I64, _P, NewRows, _PARAMS, _P]),
    "streamrec_cuda_insert_or_assign": (_INT, [Index, _P, _P, _I64, _P, _P]),
    "streamrec_cuda_erase": (_INT, [Index, _P, _I64, _P, _P]),
    "streamrec_cuda_size": (_INT, [Index, _P, _P]),
    "streamrec_cuda_export": (_INT, [Index, _P, _P, _P, _P]),
    "streamrec_cuda_index_rebuild": (_INT, [Index, Index, _P, _P]),
    "streamrec_cuda_init_rows": (_INT, [Rows, _I64, _I64, _PARAMS, _P]),
    "streamrec_cuda_initial_weights": (_INT, [_P, _I64, _INT, _P, _PARAMS, _P]),
    "streamrec_cuda_gather": (_INT, [Rows, _P, _I64, _P, _P, _PARAMS, _P]),
    "streamrec_cuda_gather_pooled": (_INT, [Rows, _P, _P, _I64, _INT, _P, _P, _PARAMS, _P]),
    "streamrec_cuda_read_rows": (_INT, [Rows, _P, _I64, _I64, _I64, _P, _P, _P, _PARAMS, _P]),
    "streamrec_cuda_write_rows": (_INT, [Rows, _P, _I64, _I64, _I64, _P, _P, _P, _PARAMS, _P]),
    "streamrec_cuda_update": (_INT, [Push, _P, ctypes.c_size_t, _PARAMS, _P]),
    "streamrec_cuda_update_scratch_bytes": (ctypes.c_size_t, [_I64, _I64]),
    "streamrec_cuda_find_tables": (_INT, [Block, _P, _P, _P]),
    "streamrec_cuda_find_or_insert_tables": (_INT, [Block, _P, _P, _P, _P]),
    "streamrec_cuda_gather_tables": (_INT, [Block, _P, _P, _P]),
    "streamrec_cuda_check_push_tables": (_INT, [Block, _P, _P, _P, _P, _P]),
    "streamrec_cuda_update_tables": (_INT, [Block, _P, _P, _P, _P, _P, _P, _SIZE, _P]),
    "streamrec_cuda_update_tables_scratch_bytes": (_SIZE, [_I64, _I64]),
    "streamrec_cuda_block_sizes": (_INT, [_P, _I64, _P, _P]),
    "streamrec_cuda_unique_tables": (
        _INT,
        [_P, _I64, _P, _I64, _P, _P, _P, _P, _P, _SIZE, _P],
    ),
    "streamrec_cuda_unique_tables_scratch_bytes": (_SIZE, [_I64]),
    "streamrec_cuda_advance_day": (_INT, [Rows, _I64, _PARAMS, _P]),
    "streamrec_cuda_shrink": (_INT, [Rows, _I64, _P, _PARAMS, _P]),
    "streamrec_cuda_select_rows": (_INT, [Rows, _I64, _INT, _P, _PARAMS, _P]),
    "streamrec_cuda_clear_dirty": (_INT, [Rows, _I64, _PARAMS, _P]),
    "streamrec_cuda_mark_dirty": (_INT, [Rows, _P, _I64, _PARAMS, _P]),
}


def library_path() -> Path:
    """The library to load: ``$STREAMREC_CUDA_LIB`` if set, else build/cuda's."""
    env = os.environ.get("STREAMREC_CUDA_LIB")
    return Path(env) if env else DEFAULT_LIBRARY


def _sources() -> list[Path]:
    return sorted(CUDA_DIR.glob("*.cu"))


def nvcc_command(nvcc: str, out: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """The one nvcc command line that builds the library from every ``csrc/cuda/*.cu``."""
    sources = [str(p) for p in _sources()]
    return [nvcc, *NVCC_FLAGS, *extra, "-shared", "-o", str(out), *sources]


def _compile(command: list[str], out: Path, what: str) -> Path:
    """Runs command, its ``{out}`` argument a temporary file, then moves that to out (atomic)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    done = subprocess.run(
        [part if part != "{out}" else str(tmp) for part in command],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise CudaOpError("build", ERR_CUDA, f"{what} failed:\n{done.stderr[-4000:]}")
    tmp.replace(out)  # atomic: a concurrent loader sees the old file or the new one
    return out


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
    return _compile(nvcc_command(nvcc, Path("{out}")), out, "nvcc")


def cccl_include() -> Path:
    """The CUDA toolkit's CCCL headers (Thrust, CUB, libcu++): $CUDA_HOME, then /usr/local/cuda."""
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        for sub in CCCL_DIRS:
            if home and (Path(home) / sub / "thrust" / "version.h").exists():
                return Path(home) / sub
    raise TierUnavailable(
        "the CPU build of the CUDA kernels needs the CUDA toolkit's CCCL headers "
        "(thrust/, cuda/atomic); none under $CUDA_HOME or /usr/local/cuda"
    )


def cpu_command(
    out: Path, extra: tuple[str, ...] = (), flags: tuple[str, ...] = CPU_FLAGS
) -> list[str]:
    """The one g++ command line of the CPU build (every ``csrc/cuda/*.cu`` as C++); flags
    replace :data:`CPU_FLAGS` (the ThreadSanitizer build's), extra come after them."""
    cxx = os.environ.get("CXX", "g++")
    sources = [str(p) for p in _sources()]
    include = ["-isystem", str(cccl_include())]
    return [cxx, *flags, *extra, *include, "-x", "c++", *sources, "-o", str(out)]


def cpu_library_path() -> Path:
    """The CPU build to load: ``$STREAMREC_CUDA_CPU_LIB`` if set, else build/cuda-cpu's."""
    env = os.environ.get("STREAMREC_CUDA_CPU_LIB")
    return Path(env) if env else DEFAULT_CPU_LIBRARY


def _stale(out: Path) -> bool:
    if not out.exists():
        return True
    built = out.stat().st_mtime
    sources = [*CUDA_DIR.iterdir(), *SHARED_DIR.iterdir()]
    return any(p.stat().st_mtime > built for p in sources)


def build_cpu(out: Path | None = None, extra: tuple[str, ...] = (), force: bool = False) -> Path:
    """The CPU build at out (default :func:`cpu_library_path`), compiled when missing or older
    than a source (or when force); extra: more g++ flags (the sanitizers')."""
    out = out or cpu_library_path()
    if force or _stale(out):
        _compile(cpu_command(Path("{out}"), extra), out, "the CPU build (g++)")
    return out


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def check_devices(lib: ctypes.CDLL, torch_devices: int) -> None:
    """Refuses (TierUnavailable) a library whose own CUDA runtime sees other than torch's
    ``torch_devices`` devices: nvcc links CUDA's runtime into it statically (CUDA 13's needs
    a driver of r580 or newer), so on an older driver than that it sees none, where torch (its
    own runtime) may see them all, and every op would fail later with ERR_CUDA."""
    seen = int(lib.streamrec_cuda_device_count())
    if seen == torch_devices:
        return
    runtime = int(lib.streamrec_cuda_runtime_version())
    driver = int(lib.streamrec_cuda_driver_version())
    linked = f"CUDA {_cuda_version(runtime)}'s runtime" if runtime else "no CUDA runtime"
    need = "r580 or newer" if runtime == 0 or runtime >= 13000 else "supporting it"
    found = f"this one supports CUDA {_cuda_version(driver)}" if driver else "none answered"
    raise TierUnavailable(
        f"the CUDA extension sees {seen} CUDA device(s), torch sees {torch_devices}: it links "
        f"{linked} statically, which needs an NVIDIA driver {need}; {found}. Upgrade the "
        "driver (nvidia-smi shows its version)"
    )


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
