"""Bucketed AUC against an exact rank-based AUC."""

import numpy as np
import pytest
import torch
from scipy.stats import rankdata
from streamrec.trainer.model.evaluation import AucAccumulator


def exact_auc(p, y):
    r = rankdata(p)
    n1 = y.sum()
    n0 = len(y) - n1
    return (r[y == 1].sum() - n1 * (n1 + 1) / 2) / (n0 * n1)


def test_auc_matches_exact_and_merges():
    rng = np.random.default_rng(0)
    p = rng.random(20000)
    y = (rng.random(20000) < p).astype(np.float64)
    a, b = AucAccumulator(), AucAccumulator()
    a.add(torch.from_numpy(p[:7000]), torch.from_numpy(y[:7000]))
    b.add(torch.from_numpy(p[7000:]), torch.from_numpy(y[7000:]))
    merged = AucAccumulator()
    merged.load_state(a.state() + b.state())  # what the all-reduce does
    res = merged.result()
    assert res["auc"] == pytest.approx(exact_auc(p, y), abs=1e-5)
    assert res["samples"] == 20000
    ll = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    assert res["logloss"] == pytest.approx(ll, rel=1e-6)


def test_ties_and_degenerate():
    acc = AucAccumulator()
    acc.add(torch.full((4,), 0.5), torch.tensor([0.0, 1.0, 0.0, 1.0]))
    assert acc.result()["auc"] == pytest.approx(0.5)
    one_class = AucAccumulator()
    one_class.add(torch.rand(10), torch.ones(10))
    assert one_class.result()["auc"] is None
    assert AucAccumulator().result()["samples"] == 0
