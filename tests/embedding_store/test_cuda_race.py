"""The CUDA kernels' thread protocols under ThreadSanitizer, on the CPU (no GPU needed).

The library's sources built with g++ -fsanitize=thread, each launch's items on racing
std::threads (STREAMREC_CPU_THREADS; TSan follows std::thread, not libgomp), driven through
the C API by cuda_host/race.cpp: claims and duplicate keys in one insert, tombstones reused,
rows full, a rebuild, a hot key's push and the dirty marks. A data race is a TSan report;
compute-sanitizer's racecheck on a GPU sees shared memory only, so this is where the index's
global-memory protocol is checked.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from streamrec.embedding_store.tiers import cuda_lib

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

DRIVER = Path(__file__).resolve().parent / "cuda_host" / "race.cpp"
#: the CPU build's flags for TSan: std::threads (8 per launch) instead of OpenMP, Thrust's
#: sequential backend for the sort
TSAN_FLAGS = (
    "-std=c++17",
    "-O1",
    "-g",
    "-fsanitize=thread",
    "-ffp-contract=off",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-DSTREAMREC_CPU_DEVICE",
    "-DSTREAMREC_CPU_THREADS=8",
    "-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP",
)


def test_the_kernels_thread_protocols_have_no_data_race(tmp_path: Path) -> None:
    exe = tmp_path / "race"
    command = cuda_lib.cpu_command(exe, ("-I", str(cuda_lib.CUDA_DIR)), TSAN_FLAGS)
    command[-2:-2] = [str(DRIVER)]  # the driver beside the sources, before "-o exe"
    built = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
    assert built.returncode == 0, built.stderr[-4000:]
    done = subprocess.run(
        [str(exe)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={"TSAN_OPTIONS": "halt_on_error=1 exitcode=66"},
    )
    assert "ThreadSanitizer" not in done.stderr, done.stderr[-8000:]
    assert done.returncode == 0, done.stderr[-4000:]
