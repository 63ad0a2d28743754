"""One input rule: the in-process store and the client accept and refuse the same inputs.

The client talks to two real shard processes (``LocalShards``) over ZeroMQ; the in-process
store has the same tables and seed, so an accepted input gives the same rows on both, and a
refused one the same error, raised before anything is sent or written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from streamrec.embedding_store import (
    EmbeddingStore,
    EmbeddingStoreClient,
    LocalShards,
    TableOptions,
)
from streamrec.embedding_store.errors import InvalidInput
from streamrec.embedding_store.validation import as_floats, as_keys

TABLES = [{"name": "a", "dim": 4, "embedx_threshold": 0}, {"name": "b", "dim": 2}]
FEASIGNS = [2**64 - 1, 2**63, 12345]  # PaddleRec uint64 ids as python ints
FEASIGN_BITS = torch.tensor([-1, -(2**63), 12345])

#: (name, keys, the int64 keys they stand for)
ACCEPTED: list[tuple[str, Any, torch.Tensor]] = [
    ("torch int64", torch.tensor([5, -6, 7]), torch.tensor([5, -6, 7])),
    ("torch int32", torch.tensor([5, -6, 7], dtype=torch.int32), torch.tensor([5, -6, 7])),
    (
        "torch uint64",
        torch.from_numpy(np.array(FEASIGNS, dtype=np.uint64)),
        FEASIGN_BITS,
    ),
    ("torch strided", torch.arange(10)[::3], torch.tensor([0, 3, 6, 9])),
    ("numpy int64", np.array([5, -6, 7]), torch.tensor([5, -6, 7])),
    ("numpy int32", np.array([5, -6, 7], dtype=np.int32), torch.tensor([5, -6, 7])),
    ("numpy uint32", np.array([5, 6, 2**32 - 1], dtype=np.uint32), torch.tensor([5, 6, 2**32 - 1])),
    ("numpy uint64", np.array(FEASIGNS, dtype=np.uint64), FEASIGN_BITS),
    ("numpy reversed", np.arange(4)[::-1], torch.tensor([3, 2, 1, 0])),
    ("list of ints", [5, -6, 7], torch.tensor([5, -6, 7])),
    ("list of feasigns", FEASIGNS, FEASIGN_BITS),
    ("tuple of numpy ints", (np.int32(5), np.int64(-6)), torch.tensor([5, -6])),
    ("empty list", [], torch.zeros(0, dtype=torch.int64)),
    ("empty numpy", np.zeros(0, dtype=np.int64), torch.zeros(0, dtype=torch.int64)),
]

#: (name, keys, what the message names)
REFUSED: list[tuple[str, Any, str]] = [
    ("torch float32", torch.tensor([1.0, 2.0]), "torch.float32 with shape (2,)"),
    ("torch bool", torch.tensor([True, False]), "torch.bool with shape (2,)"),
    ("numpy float64", np.array([1.0, 2.0]), "numpy float64 with shape (2,)"),
    ("numpy bool", np.array([True]), "numpy bool with shape (1,)"),
    ("list of floats", [1.5, 2.0], "holding float 1.5"),
    ("list with a bool", [3, True], "holding bool True"),
    ("list out of 64 bits", [2**64], "out of [-2**63, 2**64)"),
    ("torch 2-D", torch.zeros(2, 3, dtype=torch.int64), "1-D (n,), got shape (2, 3)"),
    ("numpy 0-D", np.array(5), "1-D (n,), got shape ()"),
    ("nested list", [[1, 2], [3, 4]], "holding list [1, 2]"),
    ("string", "123", "got str"),
    ("None", None, "got NoneType"),
]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    path = tmp_path_factory.mktemp("tables") / "tables.json"
    path.write_text(json.dumps(TABLES))
    with LocalShards(path, 2) as s:
        yield s


@pytest.fixture(scope="module")
def both(shards):
    """(in-process store, client of the shards), same tables and seed."""
    local = EmbeddingStore([TableOptions.parse(t) for t in TABLES])
    remote = EmbeddingStoreClient(shards.endpoints, timeout_s=30)
    yield local, remote
    remote.close()
    local.close()


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", the result) or ("error", (type, message))."""
    try:
        return "ok", call()
    except Exception as exc:
        return "error", (type(exc), str(exc))


@pytest.mark.parametrize(("name", "keys", "want"), ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_as_keys_takes_integer_keys(name: str, keys: Any, want: torch.Tensor) -> None:
    got = as_keys(keys)
    assert got.dtype == torch.int64 and got.is_contiguous()
    assert torch.equal(got, want), name


@pytest.mark.parametrize(("name", "keys", "names"), REFUSED, ids=[c[0] for c in REFUSED])
def test_as_keys_refuses_naming_field_dtype_and_shape(name: str, keys: Any, names: str) -> None:
    with pytest.raises(InvalidInput, match="^table 'a': keys must ") as e:
        as_keys(keys, "table 'a': keys")
    assert isinstance(e.value, ValueError)
    assert names in str(e.value), name


def test_store_and_client_accept_the_same_keys_with_the_same_rows(both) -> None:
    local, remote = both
    for name, keys, want in ACCEPTED:
        grads = torch.full((want.numel(), 4), 0.25)
        for store in (local, remote):
            store.push("a", keys, grads)
        got_local = local.pull("a", keys, create=False)
        got_remote = remote.pull("a", keys, create=False)
        assert got_local.shape == (want.numel(), 4), name
        torch.testing.assert_close(got_remote, got_local, rtol=0, atol=0, msg=name)
        torch.testing.assert_close(
            got_local, local.pull("a", want, create=False), rtol=0, atol=0, msg=name
        )
        many = [s.pull_many(["a", "b"], [keys, keys]) for s in (local, remote)]
        for got, ref in zip(many[1], many[0], strict=True):
            torch.testing.assert_close(got, ref, rtol=0, atol=0, msg=name)


def test_store_and_client_refuse_the_same_keys_with_the_same_error(both) -> None:
    local, remote = both
    grads = torch.zeros(2, 4)
    sizes = {t: (local.size(t), remote.size(t)) for t in ("a", "b")}
    calls: list[tuple[str, Callable[[Any, Any], Any]]] = [
        ("pull", lambda s, k: s.pull("a", k)),
        ("push", lambda s, k: s.push("a", k, grads)),
        ("pull_many", lambda s, k: s.pull_many(["a", "b"], [np.arange(3), k])),
        ("push_many", lambda s, k: s.push_many(["a"], [k], [grads])),
    ]
    for name, keys, names in REFUSED:
        for op, call in calls:
            got_local = outcome(lambda c=call, k=keys: c(local, k))
            got_remote = outcome(lambda c=call, k=keys: c(remote, k))
            assert got_local[0] == got_remote[0] == "error", (name, op)
            assert got_local[1][0] is got_remote[1][0] is InvalidInput, (name, op)
            assert got_local[1][1] == got_remote[1][1], (name, op)
            assert names in got_local[1][1], (name, op)
    # nothing was created by the refused calls (pull_many's first table included)
    assert {t: (local.size(t), remote.size(t)) for t in ("a", "b")} == sizes


def test_store_and_client_check_floats_the_same(both) -> None:
    local, remote = both
    keys = np.array([11, 12, 13])
    cases: list[tuple[str, Any, str | None]] = [
        ("float32 tensor", torch.ones(3, 4), None),
        ("float32 array", np.ones((3, 4), np.float32), None),
        ("transposed array", np.ones((4, 3), np.float32).T, None),
        ("float64", torch.ones(3, 4, dtype=torch.float64), "grads must be float32, got"),
        ("wrong shape", torch.ones(3, 5), "grads must have shape (3, 4), got (3, 5)"),
        ("list", [[1.0] * 4] * 3, "grads must be a torch.Tensor or numpy array, got list"),
    ]
    for name, grads, refused in cases:
        results = [outcome(lambda s=s, g=grads: s.push("a", keys, g)) for s in (local, remote)]
        if refused is None:
            assert results == [("ok", None), ("ok", None)], name
        else:
            assert results[0] == results[1], name
            kind, (exc, message) = results[0]
            assert kind == "error" and exc is InvalidInput and refused in message, name
    torch.testing.assert_close(
        remote.pull("a", keys, create=False), local.pull("a", keys, create=False)
    )
    shows = [("float64 shows", np.ones(3)), ("2-D shows", torch.ones(3, 1))]
    for name, value in shows:
        results = [
            outcome(lambda s=s, v=value: s.push("a", keys, torch.ones(3, 4), shows=v))
            for s in (local, remote)
        ]
        assert results[0] == results[1] and results[0][0] == "error", name
        assert "table 'a': shows must" in results[0][1][1], name


def test_as_floats_keeps_a_contiguous_float32_tensor() -> None:
    t = torch.ones(3, 4)
    assert as_floats(t, "grads", (3, 4)).data_ptr() == t.data_ptr()  # no copy
    with pytest.raises(InvalidInput, match=r"grads must have shape \(1,\), got \(\)"):
        as_floats(np.array(1.0, np.float32), "grads", (1,))


def test_the_push_check_on_a_device_counts_what_the_cpp_check_counts() -> None:
    """push_faults_where (torch ops, for gradients on a GPU; run here on CPU tensors) against
    the C++ core's check: NaN, +-Inf, negative and -0.0 shows and clicks, bad rows."""
    from streamrec.embedding_store import _C
    from streamrec.embedding_store.validation import push_faults_where

    g = torch.Generator().manual_seed(9)
    n, dim = 5000, 7
    grads = torch.randn(n, dim, generator=g)
    shows, clicks = torch.rand(n, generator=g), torch.rand(n, generator=g)
    for values, cells in ((grads.view(-1), 40), (shows, 15), (clicks, 15)):
        at = torch.randint(0, values.numel(), (cells,), generator=g)
        values[at] = torch.tensor([float("nan"), float("inf"), -float("inf"), -1.0, -0.0])[
            torch.arange(cells) % 5
        ]
    want = _C.check_push(grads, shows, clicks)
    assert want[0] > 0 and want[1] > 0
    assert push_faults_where(grads, shows, clicks) == want
