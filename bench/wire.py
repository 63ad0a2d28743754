"""RPC round trips (``streamrec.wire``): this tree's RpcServer/RpcClient against those of
another commit (``--against``, default 32064c9: before the client's bounded send), in one
process, runs interleaved; prints calls/s of each and the ratio (medians).

    .venv/bin/python bench/wire.py [--against REV] [--runs 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import numpy as np
from streamrec import wire

TOKEN = "bench-token-of-32-characters-xxx"
REPO = Path(__file__).resolve().parents[1]


def wire_at(rev: str) -> ModuleType:
    """``services/common/wire.py`` as it was at ``rev``, imported as ``wire_at_rev``."""
    source = subprocess.run(
        ["git", "show", f"{rev}:services/common/wire.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "wire_at_rev.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("wire_at_rev", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["wire_at_rev"] = module
    spec.loader.exec_module(module)
    return module


def calls_per_s(mod: ModuleType, calls: int, payload: np.ndarray) -> float:
    """Echo round trips of ``payload`` over tcp on 127.0.0.1 (50 warm-up calls first)."""
    srv = mod.RpcServer("tcp://127.0.0.1:*", {"echo": lambda m, a: (m, a)}, token=TOKEN).start()
    try:
        with mod.RpcClient(srv.endpoint, timeout_s=10, token=TOKEN) as client:
            for _ in range(50):
                client.call("echo", {}, {"x": payload})
            t0 = time.perf_counter()
            for _ in range(calls):
                client.call("echo", {}, {"x": payload})
            return calls / (time.perf_counter() - t0)
    finally:
        srv.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", default="32064c9", help="the baseline commit")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    base = wire_at(args.against)
    for size, calls in ((8, 3000), (1 << 20, 300)):
        payload = np.zeros(size // 8, np.int64)
        ours, theirs = [], []
        for _ in range(args.runs):
            theirs.append(calls_per_s(base, calls, payload))
            ours.append(calls_per_s(wire, calls, payload))
        mo, mb = statistics.median(ours), statistics.median(theirs)
        print(
            f"echo {size:>8} B: this tree {mo:8,.0f} calls/s, {args.against} {mb:8,.0f} "
            f"calls/s, ratio {mo / mb:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
