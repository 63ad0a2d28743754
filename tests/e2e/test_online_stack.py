"""Online export on the stack: the API README's online-export block, run as written after
`streamrec up --keep-running`. The job names no serving Redis, so it publishes to the stack's
own (printed, in ``stack.json``, allowed by the API, trusted by the trainers); what that Redis
serves is the store shards' rows of the job, and the block's read-back shows the version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from doc_blocks import blocks_for
from stack_helpers import STREAMREC, Output
from streamrec.control.redis_io import with_password
from streamrec.embedding_store import EmbeddingStoreClient, RedisConverter
from streamrec.process import spawn, stop_process

pytestmark = pytest.mark.slow

ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def online_export_block() -> str:
    """The API README's online-export block (tests/doc_blocks.py RUN_BY)."""
    (block,) = blocks_for(__file__)
    return block


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Output]]:
    """`streamrec up --keep-running` on one planted day, started in a directory of its own
    (the block reads ``.run/streamrec`` from there)."""
    cwd = tmp_path_factory.mktemp("online")
    run = cwd / ".run" / "streamrec"
    proc = spawn(
        [STREAMREC, "up", "--keep-running", "--run-dir", str(run), "--days", "1"]
        + ["--samples-per-split", "800"],
        log=cwd / "up.stderr",
        die_with_parent=True,
        stdout_pipe=True,
        env=ENV,
    )
    out = Output(proc, cwd / "up.stderr")
    try:
        out.wait_for("services stay up", timeout=300)
        yield cwd, out
    finally:
        subprocess.run([STREAMREC, "down", "--run-dir", str(run)], capture_output=True, timeout=120)
        stop_process(proc, timeout_s=30)


@pytest.mark.timeout(900)
def test_the_api_readme_online_export_block_runs_and_serves_the_store_rows(stack) -> None:
    cwd, out = stack
    run = cwd / ".run" / "streamrec"
    state: dict[str, Any] = json.loads((run / "stack.json").read_text())
    url, password_file = state["online_redis_url"], state["online_redis_password_file"]
    assert url != state["redis_url"] and f"serving redis    {url}" in out.text
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", online_export_block()],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    trigger = json.loads(next(line for line in lines if '"kind":"export"' in line))
    assert trigger["state"] == "done" and trigger["mode"] == "online", trigger
    version = trigger["result"]["version"]
    assert version["seq"] == 1 and version["tag"].endswith("/base"), version
    assert "served:slot_0:rows:0-of-2" in lines and "served:slot_0:rows:1-of-2" in lines
    job = json.loads(lines[-1])  # the block stops the job at its end
    assert job["state"] in ("stopping", "stopped"), job

    # what the serving Redis serves is the job's rows in the store shards
    serving = redis.Redis.from_url(with_password(url, password_file))
    assert serving.hget("served:version", "tag").decode() == version["tag"]
    conv = RedisConverter(serving, "served", num_shards=len(state["store_endpoints"]))
    rows = 0
    with EmbeddingStoreClient(
        state["store_endpoints"], namespace=job["id"], auth_token_file=run / "peer-token"
    ) as store:
        for table in store.tables:
            keys, values = conv.read_rows(table, tag=version["tag"])
            assert keys.size > 0, table
            np.testing.assert_array_equal(values, store.pull(table, keys, create=False).numpy())
            rows += keys.size
    assert rows == int(version["rows"])
    # the control plane's password does not open it, nor does none
    for client in (
        redis.Redis.from_url(url),
        redis.Redis.from_url(with_password(url, state["redis_password_file"])),
    ):
        with pytest.raises(redis.AuthenticationError):
            client.ping()
        client.close()
    serving.close()
