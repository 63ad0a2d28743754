"""The CUDA extension builds, and its loader agrees with its header, on a machine without a GPU.

What needs no GPU: nvcc compiling every ``csrc/cuda/*.cu`` for sm_80 and sm_90 (warnings as
errors), the C API the header declares against what the ctypes loader binds (names, argument
counts, struct layouts), the library's argument checks (they run before any CUDA call), the
loader's refusal without a GPU, and the per-row math the kernels call (row creation, the
push step: host-and-device functions) built as host code against the CPU core. The ops
themselves are checked on a GPU by test_cuda_ops.py.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import streamrec.embedding_store._C as _C
import torch
from streamrec.embedding_store import cuda_ext
from streamrec.embedding_store.errors import TierUnavailable
from streamrec.embedding_store.options import (
    NormalInitializer,
    SgdRuleParam,
    TableOptions,
    UniformInitializer,
    ZerosInitializer,
)
from streamrec.embedding_store.tier import table_params

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
def test_every_source_compiles_for_sm80_and_sm90(built: tuple[Path, str]) -> None:
    library, messages = built
    assert library.stat().st_size > 0
    assert "warning" not in messages.lower()  # -Werror all-warnings would have failed anyway
    for arch in ("sm_80", "sm_90"):
        kernels = re.findall(rf"Compiling entry function '(\w+)' for '{arch}'", messages)
        # a kernel of every family, by its name
        for family in (
            "find_kernel",
            "init_rows_kernel",
            "gather_kernel",
            "apply_kernel",
            "shrink_kernel",
        ):
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


@needs_nvcc
def test_library_binds_and_checks_arguments_without_a_gpu(library: Path) -> None:
    lib = cuda_ext.open_library(library, build_missing=False)
    assert lib.streamrec_cuda_api_version() == cuda_ext.API_VERSION
    if not torch.cuda.is_available():
        assert lib.streamrec_cuda_device_count() == 0
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
    rc = lib.streamrec_cuda_gather_pooled(None, 0, None, None, 1, 2, None, None, None, None)
    assert rc == cuda_ext.ERR_ARGUMENT
    assert b"params is NULL" in lib.streamrec_cuda_last_error()
    # the larger structs by value and the params by pointer reach C intact
    index = cuda_ext.Index(ctypes.addressof(slots), 1)
    new_rows = cuda_ext.NewRows(None, 5, None, None, None, None)
    rc = lib.streamrec_cuda_find_or_insert(index, None, 0, None, new_rows, None, None)
    assert rc == cuda_ext.ERR_ARGUMENT
    assert b"next_row, row_keys and flag must be set" in lib.streamrec_cuda_last_error()
    push = cuda_ext.Push(n=-4)
    params = cuda_ext.TableParams.of(table_params(TableOptions(name="t", dim=4)))
    rc = lib.streamrec_cuda_update(push, ctypes.byref(params), None)
    assert rc == cuda_ext.ERR_ARGUMENT
    assert b"n and R must be >= 0" in lib.streamrec_cuda_last_error()
    params.embedx_rule.kind = 3  # Adam: the columns finalize() gave no longer fit
    rc = lib.streamrec_cuda_update(cuda_ext.Push(n=1), ctypes.byref(params), None)
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


# ---- the kernels' row math, run on the CPU against the CPU core ----
HOST_DRIVER = Path(__file__).resolve().parent / "cuda_host" / "row_math.cu"


@pytest.fixture(scope="module")
def row_math(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """row_init.cuh and update_rule.cuh (what the kernels call per row) built as host code
    with the CPU core's -ffp-contract=off."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    exe = tmp_path_factory.mktemp("row_math") / "row_math"
    subprocess.run(
        [
            NVCC,
            "-std=c++17",
            "-O2",
            "-Xcompiler",
            "-ffp-contract=off",
            "-I",
            str(cuda_ext.CUDA_DIR),
            "-o",
            str(exe),
            str(HOST_DRIVER),
        ],
        check=True,
        capture_output=True,
    )
    return exe


def _run(exe: Path, *parts: bytes) -> bytes:
    return subprocess.run([str(exe)], input=b"".join(parts), capture_output=True, check=True).stdout


def _table(rule: str, initializer: object = None, threshold: float = 10.0) -> Any:
    sgd = SgdRuleParam(name=rule, weight_bounds=(-0.5, 0.5))
    options = TableOptions(
        name="t",
        dim=11,
        embed_sgd_param=sgd,
        embedx_sgd_param=SgdRuleParam(name=rule, learning_rate=0.02),
        initializer=initializer,
        embedx_threshold=threshold,
    )
    return table_params(options, seed=11)


def _i64(*values: int) -> bytes:
    return torch.tensor(values, dtype=torch.int64).numpy().tobytes()


RULES = ["SparseNaiveSGDRule", "SparseAdaGradSGDRule", "StdAdaGradSGDRule", "SparseAdamSGDRule"]
INITIALIZERS = [
    None,
    UniformInitializer(low=-0.3, high=0.2),
    NormalInitializer(mean=0.1, std=0.5),
    ZerosInitializer(),
]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("initializer", INITIALIZERS, ids=["default", "uniform", "normal", "zeros"])
def test_row_creation_draws_the_cpu_cores_values(
    row_math: Path, rule: str, initializer: object
) -> None:
    keys = torch.randint(-(2**63), 2**63 - 1, (500,), generator=torch.Generator().manual_seed(1))
    for threshold in (10.0, 0.0):  # created plain, and expanded at creation
        p = _table(rule, initializer, threshold)
        want = torch.zeros((keys.numel(), p.width))
        _C.init_rows(want, keys, 0, keys.numel(), p)
        expand = int(p.nonclk_coeff * 0 + p.click_coeff * 0 >= p.embedx_threshold)
        out = _run(
            row_math,
            _i64(0),
            bytes(cuda_ext.TableParams.of(p)),
            _i64(keys.numel()),
            _i64(expand),
            keys.numpy().tobytes(),
        )
        got = torch.frombuffer(bytearray(out), dtype=torch.float32).reshape(want.shape)
        assert torch.equal(got, want)


@pytest.mark.parametrize("rule", RULES)
def test_push_step_gives_the_cpu_cores_floats(row_math: Path, rule: str) -> None:
    """Four pushes on 400 rows, some of which expand on the way (threshold 3)."""
    g = torch.Generator().manual_seed(2)
    p = _table(rule, UniformInitializer(low=-0.3, high=0.3), threshold=3.0)
    n = 400
    keys = torch.randint(-(2**63), 2**63 - 1, (n,), generator=g)
    data = torch.zeros((n, p.width))
    _C.init_rows(data, keys, 0, n, p)
    host = data.clone()
    for step in range(4):
        grads = torch.randn((n, p.dim), generator=g) * 0.3
        shows = torch.rand(n, generator=g) * 2
        clicks = shows * torch.rand(n, generator=g)
        expanded = _C.update(data, keys, torch.arange(n), grads, shows, clicks, p)
        out = _run(
            row_math,
            _i64(1),
            bytes(cuda_ext.TableParams.of(p)),
            _i64(n),
            host.numpy().tobytes(),
            keys.numpy().tobytes(),
            grads.numpy().tobytes(),
            shows.numpy().tobytes(),
            clicks.numpy().tobytes(),
        )
        host = torch.frombuffer(bytearray(out[:-8]), dtype=torch.float32).reshape(data.shape)
        assert torch.equal(host, data), step
        assert int.from_bytes(out[-8:], "little") == expanded
    assert expanded >= 0 and bool((data[:, _C.FLAGS].to(torch.int64) & _C.FLAG_EXPANDED).any())
