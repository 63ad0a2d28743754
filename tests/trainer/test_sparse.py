"""SparseTables (the trainer's fused sparse side) against the store's StoreEmbeddingBags."""

from __future__ import annotations

import pytest
import torch
from streamrec.embedding_store import EmbeddingStore, StoreEmbeddingBags, TableOptions
from streamrec.trainer.data.batches import Batch
from streamrec.trainer.errors import ModelShapeError
from streamrec.trainer.sparse import SparseTables

SLOTS, DIM = 3, 4


def make_store(cls: type[EmbeddingStore] = EmbeddingStore) -> EmbeddingStore:
    opts = {
        "embedx_threshold": 0,
        "initializer": {"type": "uniform", "low": -0.1, "high": 0.1},
        "embed_sgd_param": {"name": "StdAdaGradSGDRule", "learning_rate": 0.05},
        "embedx_sgd_param": {"name": "StdAdaGradSGDRule", "learning_rate": 0.05},
    }
    return cls(
        [TableOptions.parse(dict(opts, name=f"t{i}", dim=DIM)) for i in range(SLOTS)], seed=7
    )


def make_batch(ragged: bool, b: int = 64) -> Batch:
    g = torch.Generator().manual_seed(3)
    keys = torch.randint(0, 20, (b, SLOTS), generator=g) * 1_000_003 - 5
    present = torch.rand(b, SLOTS, generator=g) > 0.3 if ragged else None
    if present is not None:
        present[:, 2] = False  # an empty table in the batch
    labels = (torch.rand(b, generator=g) > 0.6).float()
    return Batch(torch.zeros(b, 13), labels, keys, present)


class CountingStore(EmbeddingStore):
    """The in-process store, counting the block calls SparseTables makes."""

    calls = 0

    def pull_rows(self, tables, keys, counts, create=True):
        self.calls += 1
        return super().pull_rows(tables, keys, counts, create)

    def push_rows(self, tables, keys, counts, grads, shows=None, clicks=None):
        self.calls += 1
        super().push_rows(tables, keys, counts, grads, shows, clicks)


@pytest.mark.parametrize("ragged", [False, True])
def test_matches_store_embedding_bags(ragged):
    """One pull_rows and one push_rows per batch give StoreEmbeddingBags' rows."""
    batch = make_batch(ragged)
    names = [f"t{i}" for i in range(SLOTS)]
    ref_store, store = make_store(), make_store(CountingStore)
    ref = StoreEmbeddingBags(ref_store, names)
    sp = SparseTables(store, names, DIM)
    w = torch.randn(batch.keys.shape[0], SLOTS, DIM, generator=torch.Generator().manual_seed(1))
    try:
        for _ in range(3):  # later rounds read rows the earlier pushes trained
            pulled = ref.pull(batch.features(), create=True)
            want = torch.stack(ref(pulled), 1)
            (want * w).sum().backward()
            ref.push(pulled, batch.labels)
            sb = sp.pull(sp.prepare(batch), create=True)
            got = sp.forward(sb)
            assert got.shape == (batch.keys.shape[0], SLOTS, DIM)
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
            (got * w).sum().backward()
            sp.push(sb, batch.labels)
        for t, name in enumerate(names):
            keys = torch.unique(batch.keys[:, t])
            torch.testing.assert_close(
                store.pull(name, keys, create=False), ref_store.pull(name, keys, create=False)
            )
            a, b = store.inspect(name, keys), ref_store.inspect(name, keys)
            assert torch.equal(a["present"], b["present"])
            torch.testing.assert_close(a["show"], b["show"])
            torch.testing.assert_close(a["click"], b["click"])
        if ragged:
            assert store.size("t2") == 0
        assert store.calls == 3 * 2  # 3 rounds: one pull_rows and one push_rows each
    finally:
        sp.close()


def test_grad_scale_and_no_create():
    batch = make_batch(False)
    names = [f"t{i}" for i in range(SLOTS)]
    store = make_store()
    sp = SparseTables(store, names, DIM)
    sb = sp.pull(sp.prepare(batch), create=False)
    assert store.size("t0") == 0 and float(sb.weights.detach().abs().sum()) == 0.0
    sb = sp.pull(sp.prepare(batch), create=True)
    before = store.pull("t0", sb.keys[0], create=False)
    sp.forward(sb).sum().backward()
    sp.push(sb, batch.labels, grad_scale=0.0)  # a zero gradient leaves the rows as they were
    torch.testing.assert_close(store.pull("t0", sb.keys[0], create=False), before)
    assert float(store.inspect("t0", sb.keys[0])["show"].sum()) == batch.keys.shape[0]


def test_bad_shapes():
    store = make_store()
    sp = SparseTables(store, ["t0", "t1"], DIM)
    with pytest.raises(ModelShapeError, match="3 sparse slots, expected 2"):
        sp.prepare(make_batch(False))
    with pytest.raises(ModelShapeError, match="at least one table"):
        SparseTables(store, [], DIM)


def test_rows_block_is_checked_before_anything_is_written():
    """A block whose counts do not add up, or of tables of two dims, is refused by name."""
    from streamrec.embedding_store.errors import InvalidInput

    store = make_store()
    with pytest.raises(InvalidInput, match="counts must be 3 ints >= 0 summing to the 2 keys"):
        store.pull_rows(["t0", "t1", "t2"], torch.tensor([1, 2]), [1, 0, 0])
    with pytest.raises(InvalidInput, match="counts must be"):
        store.push_rows(["t0"], torch.tensor([1]), [-1], torch.zeros(1, DIM))
    assert store.size("t0") == 0
    wide = EmbeddingStore([TableOptions(name="a", dim=2), TableOptions(name="b", dim=3)])
    with pytest.raises(InvalidInput, match="one dim"):
        wide.pull_rows(["a", "b"], torch.tensor([1, 2]), [1, 1])
