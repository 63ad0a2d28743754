"""The sparse gather's CPU backward (streamrec.trainer._C.add_rows) against index_add_."""

from __future__ import annotations

import pytest
import torch
from streamrec.trainer import _C
from streamrec.trainer.sparse import _Gather


def _by_feature_index(features: int, batch: int, rows_per_feature: int, seed: int) -> torch.Tensor:
    """(S, B) rows, feature s in its own block of rows, with repeats (a deduplicated batch)."""
    g = torch.Generator().manual_seed(seed)
    local = torch.randint(0, rows_per_feature, (features, batch), generator=g)
    return local + torch.arange(features).view(-1, 1) * rows_per_feature


@pytest.mark.parametrize("strided", [False, True])
def test_add_rows_sums_as_index_add_in_batch_order(strided: bool) -> None:
    s, b, d, per = 5, 300, 16, 40  # 300 ids over 40 rows: every row repeats
    index = _by_feature_index(s, b, per, seed=1)
    full = torch.randn(b, s + 1, d, generator=torch.Generator().manual_seed(2))
    src = full[:, 1:] if strided else full[:, 1:].contiguous()  # the interaction's slice
    assert src.is_contiguous() != strided
    out = torch.zeros(s * per, d)
    _C.add_rows(out, index, src)
    want = torch.zeros(s * per, d).index_add_(0, index.t().reshape(-1), src.reshape(-1, d))
    assert torch.equal(out, want)  # bit for bit: the same additions in the same order


def test_add_rows_refuses_a_row_outside_out_and_writes_nothing() -> None:
    index = _by_feature_index(2, 10, 4, seed=3)
    index[1, 7] = 8  # out has 8 rows
    out = torch.zeros(8, 4)
    with pytest.raises(IndexError, match="index 8 at position 17 is outside out's 8 rows"):
        _C.add_rows(out, index, torch.ones(10, 2, 4))
    assert not out.any()


def test_add_rows_refuses_bad_shapes_naming_them() -> None:
    out = torch.zeros(8, 4)
    with pytest.raises(RuntimeError, match=r"src must be a \(B, S, dim\) float32"):
        _C.add_rows(out, torch.zeros(2, 10, dtype=torch.int64), torch.ones(10, 3, 4))
    with pytest.raises(RuntimeError, match=r"index must be a contiguous \(S, B\) int64"):
        _C.add_rows(out, torch.zeros(10, 2, dtype=torch.int64).t(), torch.ones(10, 2, 4))


def test_gather_backward_equals_index_add_() -> None:
    s, b, d, per = 26, 256, 16, 200
    index = _by_feature_index(s, b, per, seed=4)
    weights = torch.randn(s * per, d, requires_grad=True)
    out = _Gather.apply(weights, index.t())
    grad = torch.randn(b, s, d)
    out.backward(grad)
    want = torch.zeros(s * per, d).index_add_(0, index.t().reshape(-1), grad.reshape(-1, d))
    assert torch.equal(weights.grad, want)
