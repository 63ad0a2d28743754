"""Each atheris target (``fuzz_*.py`` here) runs for a bounded time and must find no crash.

``make fuzz`` runs them longer (``FUZZ_SECONDS``, 30 by default); here each gets
:data:`SECONDS`, so ``make test`` covers them. A crash leaves its input under ``tmp_path/artifacts``
(quoted in the failure) for a regression test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris")

HERE = Path(__file__).parent
TARGETS = sorted(p.name for p in HERE.glob("fuzz_*.py"))
SECONDS = 10


def test_there_are_targets():
    assert {"fuzz_wire.py", "fuzz_lines.py", "fuzz_handlers.py"} <= set(TARGETS)


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_target_finds_no_crash(target, tmp_path):
    artifacts, scratch = tmp_path / "artifacts", tmp_path / "tmp"
    artifacts.mkdir()
    scratch.mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / target),
            f"-max_total_time={SECONDS}",
            "-rss_limit_mb=2048",
            "-timeout=10",  # one input running longer than this is a hang: a crash
            f"-artifact_prefix={artifacts}/",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(scratch)},  # what a target writes goes with tmp_path
        errors="replace",
        timeout=SECONDS + 110,
    )
    crashes = sorted(p.name for p in artifacts.iterdir())
    assert proc.returncode == 0 and not crashes, (
        f"{target} exited {proc.returncode}, artifacts {crashes}:\n{proc.stderr[-4000:]}"
    )
    assert "Done " in proc.stderr, proc.stderr[-2000:]  # it really ran inputs
