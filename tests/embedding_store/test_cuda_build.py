"""The CUDA extension builds, and its loader agrees with its header, on a machine without a GPU.

What needs no GPU: nvcc compiling every ``csrc/cuda/*.cu`` for sm_80 and sm_90 (warnings as
errors), the C API the header declares against what the ctypes loader binds (names, argument
counts, struct layouts), the library's argument checks (nvcc's build and the CPU build), the
loader's refusal without a GPU, and the row math written once (csrc/shared, no device-only
branch). The ops themselves run in test_cuda_ops.py, on the CPU build and on a GPU.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from streamrec.embedding_store.errors import TierUnavailable
from streamrec.embedding_store.tiers import cuda_ext, cuda_lib
from streamrec.embedding_store.tiers.table_tier import table_params
from streamrec.store_schema import (
    TableOptions,
)

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
HEADER = cuda_ext.CUDA_DIR / "streamrec_cuda.h"
MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The library built from the sources as `make cuda` does (ptxas verbose: it names each
    kernel and architecture it compiles) and nvcc's messages."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    out = tmp_path_factory.mktemp("cuda") / "libstreamrec_cuda.so"
    done = subprocess.run(
        cuda_ext.nvcc_command(NVCC, out, ("-Xptxas", "-v")),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out, done.stderr


@pytest.fixture(scope="module")
def library(built: tuple[Path, str]) -> Path:
    return built[0]


def _declarations() -> dict[str, int]:
    """Function name -> argument count, from the header's prototypes."""
    text = re.sub(r"//[^\n]*", "", HEADER.read_text())
    found = {}
    for name, args in re.findall(r"\b(streamrec_cuda_\w+)\s*\(([^;{]*)\)\s*;", text):
        args = args.strip()
        found[name] = 0 if args in ("", "void") else args.count(",") + 1
    return found


@needs_nvcc
@pytest.mark.slow  # nvcc builds every source for two architectures: ~40 s here
def test_every_source_compiles_for_sm80_and_sm90(built: tuple[Path, str]) -> None:
    library, messages = built
    assert library.stat().st_size > 0
    assert "warning" not in messages.lower()  # -Werror all-warnings would have failed anyway
    for arch in ("sm_80", "sm_90"):
        kernels = re.findall(rf"Compiling entry function '(\w+)' for '{arch}'", messages)
        # a kernel of every family, by its name
        for family in (
            "Find", "InitRows", "Gather", "Apply", "Shrink", "PieceSums", "FindOrInsertTables",
            "GatherTables", "KeysTables", "CheckPush", "Claim",
        ):  # fmt: skip
            assert any(family in k for k in kernels), (arch, family, kernels)


def test_makefile_flags_are_the_loaders() -> None:
    text = MAKEFILE.read_text().replace("\\\n", " ")
    match = re.search(r"^NVCCFLAGS := (.*)$", text, re.MULTILINE)
    assert match is not None, "the Makefile has no NVCCFLAGS"
    assert tuple(match.group(1).split()) == cuda_ext.NVCC_FLAGS
    assert re.search(r"^\.PHONY:.*\bcuda\b", text, re.MULTILINE)


def test_header_declares_what_the_loader_binds() -> None:
    declared = _declarations()
    assert set(declared) == set(cuda_ext.BINDINGS)
    for name, (_, argtypes) in cuda_ext.BINDINGS.items():
        assert declared[name] == len(argtypes), name


@needs_nvcc
def test_struct_layouts_match_the_header(tmp_path: Path) -> None:
    """ctypes' offsets and sizes of every struct against the C compiler's (host code only)."""
    structs = {
        "StreamrecRule": cuda_ext.Rule,
        "StreamrecInit": cuda_ext.Init,
        "StreamrecTableParams": cuda_ext.TableParams,
        "StreamrecIndex": cuda_ext.Index,
        "StreamrecNewRows": cuda_ext.NewRows,
        "StreamrecPush": cuda_ext.Push,
        "StreamrecBlockTable": cuda_ext.BlockTable,
        "StreamrecBlock": cuda_ext.Block,
    }
    lines, expected = [], []
    for c_name, py in structs.items():
        lines.append(f'printf("%zu\\n", sizeof({c_name}));')
        expected.append(ctypes.sizeof(py))
        for field, _ in py._fields_:
            lines.append(f'printf("%zu\\n", offsetof({c_name}, {field}));')
            expected.append(getattr(py, field).offset)
    src = tmp_path / "layout.cu"
    src.write_text(
        '#include <cstddef>\n#include <cstdio>\n#include "streamrec_cuda.h"\n'
        "int main() {\n" + "\n".join(lines) + "\nreturn 0;\n}\n"
    )
    exe = tmp_path / "layout"
    subprocess.run(
        [NVCC, "-I", str(cuda_ext.CUDA_DIR), "-o", str(exe), str(src)],
        check=True,
        capture_output=True,
    )
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    assert [int(v) for v in out.split()] == expected


@pytest.mark.parametrize(
    "build", ["cpu", pytest.param("nvcc", marks=[needs_nvcc, pytest.mark.slow])]
)
def test_library_binds_and_checks_arguments_without_a_gpu(
    build: str, request: pytest.FixtureRequest
) -> None:
    library = cuda_lib.build_cpu() if build == "cpu" else request.getfixturevalue("library")
    lib = cuda_ext.open_library(library, build_missing=False)
    assert lib.streamrec_cuda_cpu_device() == (build == "cpu")
    assert lib.streamrec_cuda_api_version() == cuda_ext.API_VERSION
    if not torch.cuda.is_available():
        assert lib.streamrec_cuda_device_count() == 0
    # load() checks the library's own runtime sees torch's devices: a driver older than its
    # statically linked runtime needs (CUDA 13: r580) makes it see fewer, refused by name
    runtime = lib.streamrec_cuda_runtime_version()
    assert runtime == 0 if build == "cpu" else runtime >= 13000
    seen = lib.streamrec_cuda_device_count()
    cuda_ext.check_devices(lib, seen)
    with pytest.raises(
        TierUnavailable,
        match=rf"sees {seen} CUDA device\(s\), torch sees {seen + 1}: .* driver r580 or newer",
    ):
        cuda_ext.check_devices(lib, seen + 1)
    # argument checks run before any CUDA call: no device needed
    bad = cuda_ext.Index(None, 3)
    rc = lib.streamrec_cuda_find(bad, None, 0, None, None, None)
    assert rc == cuda_ext.ERR_ARGUMENT
    assert b"slots is NULL" in lib.streamrec_cuda_last_error()
    slots = ctypes.c_int64(0)
    rc = lib.streamrec_cuda_find(
        cuda_ext.Index(ctypes.addressof(slots), 3), None, 0, None, None, None
    )
    assert rc == cuda_ext.ERR_ARGUMENT
    assert b"power of two, got 3" in lib.streamrec_cuda_last_error()
    rc = lib.streamrec_cuda_gather_pooled(cuda_ext.Rows(), None, None, 1, 2, None, None, None, None)
    assert rc == cuda_ext.ERR_ARGUMENT
    assert b"params is NULL" in lib.streamrec_cuda_last_error()
    # the larger structs by value and the params by pointer reach C intact
    index = cuda_ext.Index(ctypes.addressof(slots), 1)
    params0 = cuda_ext.TableParams.of(table_params(TableOptions(name="t", dim=4)))
    new_rows = cuda_ext.NewRows(None, cuda_ext.Rows(None, None, 3, 5), None, None)
    rc = lib.streamrec_cuda_find_or_insert(index, None, 0, None, new_rows, None, None)
    assert rc == cuda_ext.ERR_ARGUMENT
    assert b"next_row and flag must be set" in lib.streamrec_cuda_last_error()
    flag = ctypes.c_int32(0)
    new_rows.next_row, new_rows.flag = ctypes.addressof(slots), ctypes.addressof(flag)
    rc = lib.streamrec_cuda_find_or_insert(index, None, 0, None, new_rows, None, None)
    assert rc == cuda_ext.ERR_ARGUMENT
    assert b"table.key_chunks is NULL" in lib.streamrec_cuda_last_error()
    bad_shift = cuda_ext.Rows(None, None, 63, 0)
    rc = lib.streamrec_cuda_init_rows(bad_shift, 0, 0, ctypes.byref(params0), None)
    assert rc == cuda_ext.ERR_ARGUMENT
    assert b"shift <= 62" in lib.streamrec_cuda_last_error()
    push = cuda_ext.Push(n=-4)
    params = cuda_ext.TableParams.of(table_params(TableOptions(name="t", dim=4)))
    rc = lib.streamrec_cuda_update(push, None, 0, ctypes.byref(params), None)
    assert rc == cuda_ext.ERR_ARGUMENT
    assert b"n must be >= 0" in lib.streamrec_cuda_last_error()
    params.stride = params.width - 1  # rows would overlap
    rc = lib.streamrec_cuda_update(cuda_ext.Push(n=1), None, 0, ctypes.byref(params), None)
    assert rc == cuda_ext.ERR_ARGUMENT
    assert b"update: params stride 9 is below the width 10" in lib.streamrec_cuda_last_error()
    params.stride = params.width
    params.embedx_rule.kind = 3  # Adam: the columns finalize() gave no longer fit
    rc = lib.streamrec_cuda_update(cuda_ext.Push(n=1), None, 0, ctypes.byref(params), None)
    assert rc == cuda_ext.ERR_ARGUMENT
    assert b"update: params not finalized (dim 4" in lib.streamrec_cuda_last_error()


def test_missing_library_without_build_is_tier_unavailable(tmp_path: Path) -> None:
    with pytest.raises(TierUnavailable, match="not built"):
        cuda_ext.open_library(tmp_path / "absent.so", build_missing=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_load_without_a_gpu_says_the_device_tier_needs_one() -> None:
    with pytest.raises(
        TierUnavailable, match="the device tier needs a CUDA GPU .*; found none: torch"
    ):
        cuda_ext.load()
    assert not torch.cuda.is_initialized()


# ---- one source for the row math ----
SHARED = cuda_ext.CUDA_DIR.parent / "shared"


def test_the_row_math_has_no_device_only_branch() -> None:
    """The row math (csrc/shared) and the kernels hold no ``__CUDA_ARCH__`` branch but the
    index's pause and the warp vote of the aggregated counters (a warp of one in the CPU
    build, the same arithmetic): what the CPU build runs is what the GPU runs (a device-only
    branch once called itself and zeroed every new row, unseen by every host test)."""
    for header in SHARED.glob("*.h"):
        assert "__CUDA_ARCH__" not in header.read_text(), header
    arch = {
        p.name: p.read_text().count("__CUDA_ARCH__")
        for p in cuda_ext.CUDA_DIR.iterdir()
        if "__CUDA_ARCH__" in p.read_text()
    }
    # backoff(): __nanosleep while another thread publishes; common.cuh: voters(), popcount(),
    # from_leader() (__activemask, __popc, __shfl_sync) in one block
    assert arch == {"index.cu": 1, "common.cuh": 1}
    # the kernels include the shared math, not a copy of it
    common = (cuda_ext.CUDA_DIR / "common.cuh").read_text()
    assert '#include "../shared/row_update.h"' in common
    for name in ("kShow", "state_width", "apply_rule", "mix64", "init_row"):
        for p in cuda_ext.CUDA_DIR.iterdir():
            assert not re.search(rf"\b(constexpr|inline)\b[^;{{]*\b{name}\b", p.read_text()), (
                name,
                p,
            )


@needs_nvcc
def test_row_creation_kernels_compute_their_draws_on_the_device(tmp_path: Path) -> None:
    """The device code of row creation holds the draws' float math (a device branch that called
    itself once let nvcc delete it: 0 float multiplies or adds, every new row zero)."""
    ptx = tmp_path / "row_init.ptx"
    subprocess.run(
        [NVCC, "-std=c++17", "-O3", "-fmad=false", "-arch=compute_90", "-ptx", "-o", str(ptx),
         str(cuda_ext.CUDA_DIR / "row_init.cu")],
        check=True,
        capture_output=True,
    )  # fmt: skip
    entries = re.split(r"\.entry\s+", ptx.read_text())[1:]
    ops = {
        e.split("(")[0]: len(re.findall(r"\b(?:mul|add|sub)(?:\.rn)?\.f32\b", e)) for e in entries
    }
    assert any("InitRows" in name for name in ops), ops
    for name, count in ops.items():
        assert count >= 20, (name, count)  # uniform and normal draws: 80 with CUDA 13


@needs_nvcc
def test_gather_of_padded_rows_loads_4_weights_at_once(tmp_path: Path) -> None:
    ptx = tmp_path / "gather.ptx"
    subprocess.run(
        [NVCC, "-std=c++17", "-O3", "-arch=compute_90", "-ptx", "-o", str(ptx),
         str(cuda_ext.CUDA_DIR / "gather.cu")],
        check=True,
        capture_output=True,
    )  # fmt: skip
    text = ptx.read_text()
    # the chunk pointers are read from memory, so nvcc cannot prove them global: a generic
    # ld.v4 (still one 16-byte access) is as good
    assert re.search(r"ld(\.global)?(\.nc)?\.v4\.f32", text) and "st.global.v4.f32" in text
