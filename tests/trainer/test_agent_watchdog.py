"""The agent's watchdog and the group outcome exchange, in small real processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest
from streamrec.layout import PassSpec
from streamrec.trainer import distributed as ddp
from streamrec.trainer.agent.liveness import STUCK_EXIT
from streamrec.trainer.agent.steps import Op, SpecialLoad, Step, decode, encode
from streamrec.trainer.errors import LineageLost, error_class

STUCK = textwrap.dedent("""
    import sys, time
    from streamrec.trainer.agent.liveness import Watchdog
    t0 = time.monotonic()
    busy = float(sys.argv[1])
    dog = Watchdog(0.5, lambda: t0 if busy else None, lambda: t0)
    dog.start()
    time.sleep(5)  # a rank stuck (busy) or idle; no progress either way
    print("still here", flush=True)
""")


@pytest.mark.parametrize(("busy", "code"), [(1, STUCK_EXIT), (0, 0)])
def test_a_rank_busy_without_progress_exits(busy, code):
    proc = subprocess.run(
        [sys.executable, "-c", STUCK, str(busy)], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == code, proc.stderr
    if busy:
        assert "still here" not in proc.stdout  # it left long before its 5 s sleep ended
        assert "no progress for" in proc.stderr


SIGTERMED = textwrap.dedent("""
    import sys, time
    from streamrec.trainer.agent.liveness import handle_sigterm
    handle_sigterm(float(sys.argv[1]))
    hangs = sys.argv[2] == "1"
    ready = False
    while True:
        try:
            if not ready:  # said inside the try: a SIGTERM right after it is caught
                ready = True
                print("ready", flush=True)
            time.sleep(60)
        except SystemExit:
            if not hangs:
                raise
            print("cleanup hangs", flush=True)  # e.g. a release stuck on a dead peer
""")


@pytest.mark.parametrize("hangs", [False, True])
def test_sigterm_ends_a_rank_cleanly_or_after_its_grace(hangs):
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERMED, "1.0", "1" if hangs else "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    took = time.monotonic() - t0
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM: this rank ends" in err
    if hangs:  # the grace thread ended it: 1 s, not the 60 s sleep
        assert "cleanup hangs" in out and "it exits now" in err and 0.9 < took < 20, took
    else:
        assert "it exits now" not in err and took < 20, took


def test_a_step_crosses_as_tensors_with_its_load_and_skips():
    spec = PassSpec("20190720", 3, ("0000", "0600", "1200"))
    step = Step(Op.PASS, spec, attempt=2, load=("20190720", 1), skip=("0600",))
    back = decode(*encode(step))
    assert (back.spec, back.attempt, back.load, back.skip) == (spec, 2, ("20190720", 1), ("0600",))
    plain = decode(*encode(Step(Op.PASS, spec)))
    assert (plain.load, plain.skip) == (None, ())
    for special in (SpecialLoad.FRESH, SpecialLoad.LOST):
        assert decode(*encode(Step(Op.PASS, spec, load=special))).load == special


def test_a_model_without_the_passes_the_job_counts_done_sends_the_job_back_to_its_start():
    """A pass whose predecessors the model lacks, with no checkpoint holding them, fails as
    ``store_lost`` (the API takes the job back to its start), not trained on a fresh model."""
    err = LineageLost("the model lacks the passes before 20190720/5")
    assert error_class(err) == "store_lost"


def test_outcomes_of_one_rank_round_trip():
    (out,) = ddp.exchange_outcomes(1, [0, 1], "DataError: é" + "x" * 600)
    assert (out.rank, out.code, out.marks) == (0, 1, (0, 1))
    assert out.message.startswith("DataError: é") and len(out.message.encode()) <= 512
