"""The READMEs' stack blocks no other test runs, run as written on one stack, in a directory
of their own: the launcher README's short run (its `streamrec up ... --keep-running` in the
background, the first terminal), the API README's REST block against it (a job created,
started, paused, resumed, its passes, events and a trigger read, stopped, deleted), then the
launcher's second terminal (`streamrec up --help`, `streamrec down`)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from doc_blocks import blocks_for
from servers import wait_for
from stack_helpers import STREAMREC, Output
from streamrec.process import pid_alive, spawn, stop_process

pytestmark = pytest.mark.slow

ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def bash(block: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``block`` in a bash that stops at the first failing command, as the other
    walk-through tests run theirs."""
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def json_values(text: str) -> tuple[list[Any], str]:
    """The JSON values ``text`` starts with, back to back (``curl -s`` adds no newline), and
    what follows them."""
    decoder, at = json.JSONDecoder(), 0
    values: list[Any] = []
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        try:
            value, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return values, text[at:]
        values.append(value)


@pytest.mark.timeout(300)
def test_the_launcher_and_api_readme_blocks_run_as_written_on_one_stack(tmp_path: Path) -> None:
    up_block, rest_block, second_terminal = blocks_for(__file__)
    run = tmp_path / ".run" / "streamrec"  # the blocks' default run directory, from tmp_path
    up = spawn(
        ["bash", "-c", f"cd {shlex.quote(str(tmp_path))} && {up_block}"],
        log=tmp_path / "up.stderr",
        env=ENV,
        die_with_parent=True,
        stdout_pipe=True,
    )
    out = Output(up, tmp_path / "up.stderr")
    try:
        out.wait_for("services stay up", timeout=180)
        assert "succeeded" in out.text, out.text  # the demo job on the day's 4 splits
        state = json.loads((run / "stack.json").read_text())
        pids = [child["pid"] for child in state["children"].values()]

        done = bash(rest_block, tmp_path, timeout=90)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        values, metrics = json_values(done.stdout)
        start, pause, resume, passes, page, events, trigger, stop, ready = values
        job_id = start["id"]
        assert [start["state"], pause["state"], resume["state"]] == ["running", "paused", "running"]
        assert stop["id"] == job_id and stop["state"] in ("stopping", "stopped"), stop
        assert passes["count"] >= len(passes["data"]) and page["data"] == [], (passes, page)
        assert any(e["type"] == "state" for e in events["data"]), events
        assert trigger["kind"] == "export" and trigger["mode"] == "delta", trigger
        assert trigger["state"] in ("pending", "done", "failed"), trigger
        assert ready["status"] == "ok", ready
        assert "streamrec_api_" in metrics, metrics[:500]
        # the block's DELETE took: the job is gone
        token = (run / "api-token").read_text().strip()
        resp = httpx.get(
            f"{state['api_url']}/v1/jobs/{job_id}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert resp.status_code == 404, resp.text

        done = bash(second_terminal, tmp_path, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        assert "usage: streamrec up" in done.stdout and "--keep-running" in done.stdout
        assert "is down" in done.stdout, done.stdout
        assert up.wait(timeout=60) == 0
        wait_for(
            lambda: not [p for p in pids if pid_alive(p)],
            30,
            0.2,
            what="every service process gone",
            detail=lambda: str([p for p in pids if pid_alive(p)]),
        )
        assert not (run / "stack.json").exists()
    finally:
        if up.poll() is None:
            subprocess.run(
                [STREAMREC, "down", "--run-dir", str(run)], capture_output=True, timeout=120
            )
            stop_process(up, timeout_s=30)
