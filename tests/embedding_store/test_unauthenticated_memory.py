"""A peer without the token costs a shard no memory: a real shard process, three 400 MB
messages from unauthenticated peers (no credentials, a wrong token), and its resident memory
afterwards within 50 MB of where it started; good clients are served throughout. A large
message of a good client is freed once answered, not held by the idle worker thread."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from servers import wait_for
from streamrec.auth import write_token_file
from streamrec.embedding_store import EmbeddingStoreClient, LocalShards
from streamrec.wire import RpcClient
from unauthenticated import rss_bytes, send_unauthenticated

FRAME_BYTES = 400 << 20
SLACK_BYTES = 50 << 20


@pytest.mark.slow
def test_unauthenticated_400mb_messages_cost_a_shard_no_memory(tmp_path):
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps({"tables": [{"name": "user", "embedx_dim": 3}]}))
    token = write_token_file(tmp_path / "token")
    body = np.ones(FRAME_BYTES, np.uint8)
    with LocalShards(tables, 1, auth_token_file=token) as shards:
        client = EmbeddingStoreClient(shards.endpoints, timeout_s=60, auth_token_file=token)
        try:
            keys = torch.tensor([1, 2, 3])
            before = client.pull("user", keys)
            pid = shards.procs[0].pid
            start = rss_bytes(pid)
            ends = [
                send_unauthenticated(shards.endpoints[0], body, password)
                for password in (None, "x" * 40, None)
            ]
            assert torch.equal(client.pull("user", keys), before)  # served throughout
            wait_for(  # memory a server did take is freed promptly
                lambda: rss_bytes(pid) - start <= SLACK_BYTES,
                10,
                0.1,
                what=f"the shard's RSS back within {SLACK_BYTES >> 20} MB",
                detail=lambda: (
                    f"it grew by {(rss_bytes(pid) - start) >> 20} MB after 3 unauthenticated "
                    f"{FRAME_BYTES >> 20} MB messages (ends: {ends})"
                ),
            )
            assert ends == ["refused"] * 3  # no message of theirs was read

            # An authenticated 400 MB request is buffered, answered, and then let go.
            with RpcClient(shards.endpoints[0], timeout_s=60, token=token.read_text().strip()) as c:
                assert c.call("ping", None, {"x": body})[0]["shard_id"] == 0
            wait_for(
                lambda: rss_bytes(pid) - start <= SLACK_BYTES,
                10,
                0.1,
                what="the memory of a served 400 MB request let go",
                detail=lambda: f"{(rss_bytes(pid) - start) >> 20} MB left behind",
            )
        finally:
            client.close()
