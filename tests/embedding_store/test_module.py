"""StoreEmbeddingBags over the in-process store: pooling, autograd, push of grads/show/click."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from streamrec.embedding_store import EmbeddingStore, StoreEmbeddingBags, TableOptions
from streamrec.embedding_store.errors import InvalidInput
from streamrec.ragged import RaggedTensor


def naive_table(name: str, dim: int) -> TableOptions:
    return TableOptions(
        name=name,
        dim=dim,
        embedx_threshold=0,
        initializer={"type": "uniform"},
        embed_sgd_param={"name": "naive", "learning_rate": 0.1},
        embedx_sgd_param={"name": "naive", "learning_rate": 0.1},
    )


@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_forward_backward_push_matches_dense_computation(pooling: str) -> None:
    store = EmbeddingStore([naive_table("user", 4), naive_table("item", 3)])
    emb = StoreEmbeddingBags(store, ["user", "item"], pooling=pooling)
    user = RaggedTensor.from_list([[1, 2, 1], [], [3]])
    item = RaggedTensor.from_list([[7], [7, 8], [9, 7]])
    labels = torch.tensor([1.0, 0.0, 1.0])
    w_user = store.pull("user", torch.tensor([1, 2, 3])).clone().requires_grad_(True)
    w_item = store.pull("item", torch.tensor([7, 8, 9])).clone().requires_grad_(True)

    pulled = emb.pull([user, item])
    outs = emb(pulled)
    assert [o.shape for o in outs] == [(3, 4), (3, 3)]
    loss = (outs[0].sum(1) * torch.tensor([1.0, 2.0, 3.0])).sum() + (outs[1] ** 2).sum()
    loss.backward()
    emb.push(pulled, labels)

    # the same loss on dense copies, pooled by hand
    def pool(w: torch.Tensor, rows: list[list[int]]) -> torch.Tensor:
        out = []
        for r in rows:
            if not r:
                out.append(torch.zeros(w.shape[1]))
            else:
                v = w[torch.tensor(r)]
                out.append(v.sum(0) if pooling == "sum" else v.mean(0))
        return torch.stack(out)

    du = pool(w_user, [[0, 1, 0], [], [2]])
    di = pool(w_item, [[0], [0, 1], [2, 0]])
    torch.testing.assert_close(outs[0].detach(), du.detach())
    ref_loss = (du.sum(1) * torch.tensor([1.0, 2.0, 3.0])).sum() + (di**2).sum()
    ref_loss.backward()
    torch.testing.assert_close(
        store.pull("user", torch.tensor([1, 2, 3]), create=False),
        (w_user - 0.1 * w_user.grad).detach(),
    )
    torch.testing.assert_close(
        store.pull("item", torch.tensor([7, 8, 9]), create=False),
        (w_item - 0.1 * w_item.grad).detach(),
    )
    st = store.inspect("item", torch.tensor([7, 8, 9]))
    assert st["show"].tolist() == [3.0, 1.0, 1.0]  # occurrences
    assert st["click"].tolist() == [2.0, 0.0, 1.0]  # labels of the rows they occur in
    st = store.inspect("user", torch.tensor([1, 2, 3]))
    assert st["show"].tolist() == [2.0, 1.0, 1.0] and st["click"].tolist() == [2.0, 1.0, 1.0]


def test_pull_in_a_prefetch_thread_and_predict_mode() -> None:
    store = EmbeddingStore([naive_table("t", 2)])
    emb = StoreEmbeddingBags(store, ["t"])
    rng = np.random.default_rng(0)
    batches = [
        RaggedTensor.from_lengths(torch.from_numpy(rng.integers(0, 50, 12)), [3] * 4)
        for _ in range(8)
    ]
    pulled: list = [None] * len(batches)

    def prefetch(i: int) -> None:
        pulled[i] = emb.pull([batches[i]])

    threads = [threading.Thread(target=prefetch, args=(i,)) for i in range(len(batches))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    for p in pulled:
        emb(p)[0].sum().backward()
        emb.push(p, torch.ones(4))
    seen = torch.unique(torch.cat([b.values() for b in batches]))
    assert store.size("t") == seen.numel()
    assert float(store.inspect("t", seen)["show"].sum()) == 8 * 12
    fresh = RaggedTensor.from_list([[1000, 1001]])
    out = emb(emb.pull([fresh], create=False))[0]
    assert out.abs().sum() == 0 and store.size("t") == seen.numel()


def test_bad_features_and_labels() -> None:
    store = EmbeddingStore([naive_table("t", 2)])
    emb = StoreEmbeddingBags(store, ["t"])
    with pytest.raises(InvalidInput, match="expected 1 RaggedTensors"):
        emb.pull([])
    with pytest.raises(InvalidInput, match="int64"):
        emb.pull([RaggedTensor.from_list([[1.0]], dtype=torch.float32)])
    p = emb.pull([RaggedTensor.from_list([[1], [2]])])
    with pytest.raises(InvalidInput, match="labels: expected 2"):
        emb.push(p, torch.ones(3))
    with pytest.raises(InvalidInput, match="pooling"):
        StoreEmbeddingBags(store, ["t"], pooling="max")
