"""A trainer group that froze and lost its job is refused by the shards when it wakes up.

The pool gives each assignment a generation that only grows; a group's store client sends it
with its namespace, and a shard refuses a namespace's requests older than the newest it has
seen (``stale_generation``), before they touch the rows. Here the frozen group is a real
process (SIGSTOP, then SIGCONT) pushing into real shard processes over their sockets.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from servers import wait_for
from streamrec.embedding_store import EmbeddingStoreClient, LocalShards, StaleGeneration
from streamrec.embedding_store.service.generations import GenerationFence
from streamrec.errors import BadRequest
from streamrec.process import stop_process
from streamrec.store_schema import TableOptions

TABLE = {
    "name": "user",
    "embedx_dim": 3,
    "embedx_threshold": 0,
    "initializer": {"type": "uniform", "low": -0.1, "high": 0.1},
    "embed_sgd_param": {"name": "naive", "learning_rate": 0.1},
    "embedx_sgd_param": {"name": "naive", "learning_rate": 0.1},
}
DIM = 4
NAMESPACE = "job-fenced"
KEYS = list(range(1, 41))

#: The old group's rank: pushes into the namespace under generation 1 until refused.
OLD_RANK = textwrap.dedent(
    """
    import json, sys, time
    import torch
    from streamrec.embedding_store import EmbeddingStoreClient, StaleGeneration
    from streamrec.store_schema import TableOptions

    endpoints, table, keys = (json.loads(a) for a in sys.argv[1:4])
    client = EmbeddingStoreClient(
        endpoints, [TableOptions(**table)], timeout_s=20, namespace="job-fenced", generation=1
    )
    keys = torch.tensor(keys)
    n = 0
    while True:
        try:
            client.push("user", keys, torch.ones(keys.numel(), 4))
        except StaleGeneration as exc:
            print("refused", exc, flush=True)
            sys.exit(3)
        n += 1
        print("pushed", n, flush=True)
        time.sleep(0.05)
    """
)


@pytest.fixture
def shards(tmp_path: Path):
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps({"tables": [TABLE]}))
    with LocalShards(tables, 2, endpoint=f"ipc://{tmp_path}/shard-{{shard}}.ipc") as running:
        yield running


def test_a_thawed_rank_of_an_old_generation_is_refused_and_writes_nothing(shards, tmp_path):
    """Generation 1 pushes; it freezes; generation 2 takes the namespace over (one pull
    raises the fence) and trains; generation 1 wakes up and its next push is refused, naming
    both generations: the rows are generation 2's to the last bit."""
    log = tmp_path / "old-rank.log"
    with open(log, "w") as out:
        old = subprocess.Popen(
            [
                sys.executable,
                "-c",
                OLD_RANK,
                json.dumps(shards.endpoints),
                json.dumps(TABLE),
                json.dumps(KEYS),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "pushed 3" in log.read_text(), 60, 0.05, what="the old rank's pushes")
        os.kill(old.pid, signal.SIGSTOP)
        new = EmbeddingStoreClient(
            shards.endpoints,
            [TableOptions(**TABLE)],
            timeout_s=20,
            namespace=NAMESPACE,
            generation=2,
        )
        keys = torch.tensor(KEYS)
        new.pull("user", keys)  # every shard has now seen generation 2
        new.push("user", keys, torch.full((keys.numel(), DIM), -1.0))
        rows = new.pull("user", keys)
        os.kill(old.pid, signal.SIGCONT)
        assert old.wait(timeout=60) == 3, log.read_text()
        said = log.read_text()
        assert "refused" in said and "generation 2" in said and "is 1" in said, said
        assert torch.equal(new.pull("user", keys), rows)  # nothing of generation 1 landed
        new.push("user", keys, torch.ones(keys.numel(), DIM))  # generation 2 goes on
        new.close()
    finally:
        if old.poll() is None:
            os.kill(old.pid, signal.SIGCONT)
            stop_process(old, timeout_s=5)


def test_an_unfenced_client_and_the_newest_generation_are_served(shards):
    """A client without a generation (a pinned group, a tool) is not fenced; the newest
    generation and newer ones are; a stale one is refused on every op, reads included."""
    keys = torch.tensor(KEYS)
    tables = [TableOptions(**TABLE)]
    stale = EmbeddingStoreClient(
        shards.endpoints, tables, timeout_s=20, namespace=NAMESPACE, generation=4
    )
    newer = EmbeddingStoreClient(
        shards.endpoints, tables, timeout_s=20, namespace=NAMESPACE, generation=5
    )
    pinned = EmbeddingStoreClient(shards.endpoints, None, timeout_s=20, namespace=NAMESPACE)
    with pytest.raises(StaleGeneration, match="generation 5, this request's is 3"):
        EmbeddingStoreClient(shards.endpoints, None, namespace=NAMESPACE, generation=3)
    try:
        newer.push("user", keys, torch.ones(keys.numel(), DIM))
        pinned.push("user", keys, torch.ones(keys.numel(), DIM))
        for op in (
            lambda: stale.pull("user", keys),
            lambda: stale.push("user", keys, torch.ones(keys.numel(), DIM)),
            lambda: stale.shrink(),
        ):
            with pytest.raises(StaleGeneration, match="generation 5, this request's is 4"):
                op()
        newer.pull("user", keys)
    finally:
        for c in (newer, stale, pinned):
            c.close()


def test_the_fence_rules():
    """Older refused, equal and newer taken, none unfenced, namespaces apart, a drop forgets,
    a malformed generation is a bad request naming the field and the value."""
    fence = GenerationFence()
    fence.check("push", "a", {"generation": 3})
    fence.check("push", "a", {"generation": 3})
    fence.check("push", "b", {"generation": 1})
    fence.check("push", "a", {})
    with pytest.raises(StaleGeneration, match="namespace 'a' belongs to generation 3"):
        fence.check("push", "a", {"generation": 2})
    fence.check("pull", "a", {"generation": 7})
    assert fence.newest("a") == 7 and fence.newest("b") == 1
    fence.forget("a")
    fence.check("push", "a", {"generation": 1})
    for bad in (-1, "3", 1.5, True, 2**63):
        with pytest.raises(BadRequest, match="field 'generation' must be an integer"):
            fence.check("push", "a", {"generation": bad})
    with pytest.raises(BadRequest, match="generation must be an integer >= 0"):
        EmbeddingStoreClient(["ipc:///nonexistent"], generation=-2, check=False)
