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
import threading
import time
from pathlib import Path

import pytest
import torch
from servers import wait_for
from streamrec.auth import load_token
from streamrec.embedding_store import EmbeddingStoreClient, LocalShards, StaleGeneration
from streamrec.embedding_store.service.generations import GenerationFence
from streamrec.embedding_store.service.shard_link import ShardLink
from streamrec.errors import BadRequest
from streamrec.process import stop_process
from streamrec.store_schema import TableOptions
from streamrec.wire import DEFAULT_MAX_MESSAGE_BYTES

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


def test_a_thawed_shard_refuses_the_old_generation_once_the_new_one_reached_it(shards):
    """The shards freeze (SIGSTOP) while generation 2's first request and then a push of
    generation 1 wait on their sockets. When they thaw, the shard runs the old push before
    generation 2's request (the fence lets it end first) or refuses it; either way, from
    then on every write of generation 1 is refused and the rows are generation 2's to the
    last bit: a shard that missed the restart while frozen does not let the old group write
    into the new group's store."""
    keys = torch.tensor(KEYS)
    old = EmbeddingStoreClient(
        shards.endpoints, [TableOptions(**TABLE)], timeout_s=20, namespace=NAMESPACE, generation=1
    )
    # generation 2's sockets, connected before the freeze by a ping (which carries no
    # namespace, so no generation): its first fenced request waits on the frozen socket
    token = load_token()  # the shards' (LocalShards hands them the same file)
    new_link = ShardLink(shards.endpoints, 20, DEFAULT_MAX_MESSAGE_BYTES, token, NAMESPACE, 2)
    go, outcome = threading.Event(), {}

    def new_group() -> None:
        new_link.broadcast("ping")
        go.wait(30)
        outcome["new"] = new_link.broadcast("tables")

    def old_push(name: str) -> None:
        try:
            old.push("user", keys, torch.ones(keys.numel(), DIM))
            outcome[name] = "applied"
        except StaleGeneration as exc:
            outcome[name] = str(exc)

    newer = threading.Thread(target=new_group)
    older = threading.Thread(target=old_push, args=("queued",))
    pids = [p.pid for p in shards.procs if p is not None]
    new = None
    try:
        old.push("user", keys, torch.full((keys.numel(), DIM), -1.0))
        newer.start()
        wait_for(lambda: new_link.open_sockets() == len(pids), 30, 0.02, what="the pings")
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        go.set()  # generation 2's request waits on the frozen shards' sockets ...
        time.sleep(0.5)
        older.start()  # ... then generation 1's push
        time.sleep(0.5)
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        newer.join(60)
        older.join(60)
        assert len(outcome.get("new", [])) == len(pids), outcome
        assert outcome.get("queued") == "applied" or "is 1" in outcome.get("queued", ""), outcome
        new = EmbeddingStoreClient(
            shards.endpoints, None, timeout_s=20, namespace=NAMESPACE, generation=2
        )
        new.push("user", keys, torch.full((keys.numel(), DIM), 2.0))  # the new group trains
        rows = new.pull("user", keys)
        old_push("after")  # the old group, awake, pushes again
        said = outcome["after"]
        assert "refused" in said and "generation 2" in said and "is 1" in said, outcome
        assert torch.equal(new.pull("user", keys), rows)  # nothing of generation 1 landed
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        for c in (old, new, new_link):
            if c is not None:
                c.close()


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


def check(fence: GenerationFence, op: str, namespace: str, meta: dict) -> None:
    """One request of ``op`` through the fence, doing nothing."""
    with fence.admit(op, namespace, meta):
        pass


def test_the_fence_rules():
    """Older refused, equal and newer taken, none unfenced, namespaces apart, a drop forgets,
    a malformed generation is a bad request naming the field and the value."""
    fence = GenerationFence()
    check(fence, "push", "a", {"generation": 3})
    check(fence, "push", "a", {"generation": 3})
    check(fence, "push", "b", {"generation": 1})
    check(fence, "push", "a", {})
    with pytest.raises(StaleGeneration, match="namespace 'a' belongs to generation 3"):
        check(fence, "push", "a", {"generation": 2})
    check(fence, "pull", "a", {"generation": 7})
    assert fence.newest("a") == 7 and fence.newest("b") == 1
    fence.forget("a")
    check(fence, "push", "a", {"generation": 1})
    for bad in (-1, "3", 1.5, True, 2**63):
        with pytest.raises(BadRequest, match="field 'generation' must be an integer"):
            check(fence, "push", "a", {"generation": bad})
    with pytest.raises(BadRequest, match="generation must be an integer >= 0"):
        EmbeddingStoreClient(["ipc:///nonexistent"], generation=-2, check=False)


def test_a_new_generation_waits_for_the_old_writes_in_flight():
    """A request of generation 1 admitted and still running (a push on another worker
    thread) holds generation 2's first request back until it ends; from the moment
    generation 2 knocks, generation 1's next request is refused."""
    fence = GenerationFence()
    release, order = threading.Event(), []

    def old_push() -> None:
        with fence.admit("push", "a", {"generation": 1}):
            release.wait(30)
            order.append("old push ended")

    def new_pull() -> None:
        with fence.admit("pull", "a", {"generation": 2}):
            order.append("new pull ran")

    old = threading.Thread(target=old_push)
    old.start()
    wait_for(lambda: fence.newest("a") == 1, 10, 0.01, what="the old push admitted")
    new = threading.Thread(target=new_pull)
    new.start()
    wait_for(lambda: fence.newest("a") == 2, 10, 0.01, what="generation 2 knocking")
    with pytest.raises(StaleGeneration, match="generation 2, this request's is 1"):
        check(fence, "push", "a", {"generation": 1})
    time.sleep(0.2)
    assert order == []  # the new pull waits for the push in flight
    release.set()
    old.join(10)
    new.join(10)
    assert order == ["old push ended", "new pull ran"]
