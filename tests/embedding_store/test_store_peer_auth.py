"""No open doors on a shard: real shard processes over real sockets refuse peers without the
token and save/load paths outside their ``--model-root``, and keep serving good clients."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from streamrec.auth import read_token, write_token_file
from streamrec.embedding_store import EmbeddingStoreClient, LocalShards
from streamrec.errors import RemoteError
from streamrec.wire import RpcClient
from unauthenticated import raw_call

TABLES = [{"name": "user", "embedx_dim": 3, "embedx_threshold": 0}]
#: The password of a peer of a shard run insecure (it accepts any).
ANY = "any-password-at-all"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Two shards with their own token file and one model root; the tree around it."""
    base = tmp_path_factory.mktemp("doors")
    tables = base / "tables.json"
    tables.write_text(json.dumps({"tables": TABLES}))
    token = write_token_file(base / "token")
    root = base / "models"
    root.mkdir()
    outside = base / "outside"
    outside.mkdir()
    (root / "link-out").symlink_to(outside)
    with LocalShards(tables, 2, model_roots=[root], auth_token_file=token) as shards:
        yield shards, token, root, outside


@pytest.fixture(scope="module")
def client(setup):
    shards, token, _, _ = setup
    c = EmbeddingStoreClient(shards.endpoints, timeout_s=20, auth_token_file=token)
    yield c
    c.close()


def test_peers_without_the_token_are_refused_and_good_clients_served(setup, client, tmp_path):
    shards, token, root, _ = setup
    keys = torch.tensor([1, 2, 3])
    before = client.pull("user", keys)
    wrong = tmp_path / "wrong"
    wrong.write_text("another-token-of-enough-length-0000")
    for k, endpoint in enumerate(shards.endpoints):
        for header in (
            {"op": "push", "id": 1, "meta": {"table": "user"}},  # no token
            {"op": "save", "id": 2, "auth": "x" * 64, "meta": {"path": str(root / "evil")}},
            {"op": "ping", "id": 3, "auth": ""},
        ):
            reply = raw_call(endpoint, header, read_token(token))
            assert reply["error"]["code"] == "unauthorized", (k, header["op"], reply)
        with pytest.raises(RemoteError) as err:
            EmbeddingStoreClient([endpoint], auth_token_file=wrong)
        assert err.value.code == "unauthorized"
    assert not (root / "evil").exists()
    assert torch.equal(client.pull("user", keys), before)  # still serving, nothing changed
    assert shards.ping(0)["shard_id"] == 0


@pytest.mark.parametrize(
    "path,match",
    [
        ("{outside}/ckpt", "outside the allowed roots"),
        ("{root}/../outside/ckpt", "outside the allowed roots"),
        ("{root}/link-out/ckpt", "outside the allowed roots"),
        ("/etc/streamrec-ckpt", "outside the allowed roots"),
        ("models/ckpt", "must be an absolute path"),
    ],
)
def test_save_and_load_outside_the_model_root_are_refused(setup, client, path, match):
    _, _, root, outside = setup
    value = path.format(root=root, outside=outside)
    for call in (lambda: client.save(value, "checkpoint"), lambda: client.load(value)):
        with pytest.raises(RemoteError) as err:
            call()
        assert err.value.code == "path_refused"
        assert match in str(err.value) and "field 'path'" in str(err.value)
    assert list(outside.iterdir()) == []


def test_save_and_load_under_the_model_root_work(setup, client):
    _, _, root, _ = setup
    keys = torch.tensor([5, 6, 7, 8])
    rows = client.pull("user", keys)
    ckpt = root / "20190720" / "1"
    client.save(str(ckpt), "checkpoint")
    assert sorted(p.name for p in ckpt.iterdir()) == ["shard-0-of-2", "shard-1-of-2"]
    client.push("user", keys, torch.ones(4, 4))
    client.load(str(ckpt))
    np.testing.assert_array_equal(client.pull("user", keys, create=False).numpy(), rows.numpy())


def test_a_shard_symlink_out_of_the_root_is_refused(setup, client):
    _, _, root, outside = setup
    ckpt = root / "swapped"
    ckpt.mkdir()
    (ckpt / "shard-0-of-2").symlink_to(outside)
    with pytest.raises(RemoteError) as err:
        client.save(str(ckpt), "checkpoint")
    assert err.value.code == "path_refused"
    assert list(outside.iterdir()) == []


def test_a_huge_bad_value_is_quoted_bounded(setup):
    shards, token, _, _ = setup
    with RpcClient(shards.endpoints[0], timeout_s=20, token=token.read_text().strip()) as c:
        for op, meta in (
            ("x" * 5_000_000, {}),
            ("save", {"path": "/" + "p" * 5_000_000}),
            ("pull", {"table": "t" * 5_000_000}),
        ):
            with pytest.raises(RemoteError) as err:
                c.call(op, meta)
            assert len(str(err.value)) < 1000, (op, len(str(err.value)))
            assert "(5000001 chars)" in str(err.value) or "(5000000 chars)" in str(err.value)


def test_without_a_model_root_a_shard_saves_nothing_and_insecure_serves_anyone(tmp_path):
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps({"tables": TABLES}))
    with LocalShards(tables, 1, model_roots=[], extra_args=["--insecure-no-auth"]) as shard:
        reply = raw_call(
            shard.endpoints[0], {"op": "save", "id": 1, "meta": {"path": str(tmp_path)}}, ANY
        )
        assert reply["error"]["code"] == "path_refused"
        assert "no --model-root" in reply["error"]["message"]
        assert raw_call(shard.endpoints[0], {"op": "ping", "id": 2}, ANY)["ok"] is True  # no token
