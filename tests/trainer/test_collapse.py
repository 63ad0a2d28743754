"""The collapse rule of a pass's predictions (streamrec.trainer.model.evaluation) on known inputs:
a saturated or constant model is collapsed, healthy predictions at any click rate are not."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from streamrec.trainer.model.evaluation import (
    COLLAPSE_MIN_ROWS,
    AucAccumulator,
    AucResult,
    collapse_figures,
)


def result(p: np.ndarray, y: np.ndarray) -> AucResult:
    acc = AucAccumulator()
    acc.add(torch.from_numpy(p), torch.from_numpy(y.astype(np.float64)))
    return acc.result()


def labels(n: int, ctr: float, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random(n) < ctr).astype(np.float64)


def healthy(n: int, ctr: float, spread: float = 1.0, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Predictions of a model that ranks: logits around the click rate's, the clicks drawn
    from them."""
    rng = np.random.default_rng(seed)
    z = np.log(ctr / (1 - ctr)) + rng.normal(0.0, spread, n)
    p = 1 / (1 + np.exp(-z))
    return p, (rng.random(n) < p).astype(np.float64)


def test_every_row_at_one_probability_is_collapsed_with_auc_half():
    y = labels(1000, 0.25)
    for value in (1.0, 0.0, 0.5, 0.9999):  # saturated either way, dead, clamped
        r = result(np.full(1000, value), y)
        assert r["top_share"] == 1.0 and r["auc"] == 0.5 and r["collapsed"], (value, r)


def test_logits_of_41_to_1850_are_one_bucket():
    """The issue's model: raw dense columns drove its logits to 41..1850."""
    z = torch.linspace(41.0, 1850.0, 5000)
    r = result(torch.sigmoid(z).numpy(), labels(5000, 0.25))
    assert r["top_share"] == 1.0 and r["collapsed"] and r["predicted_ctr"] == 1.0


def test_a_sliver_of_other_rows_is_still_collapsed():
    """99.5% of the rows at 1.0, the rest spread: the share says so, the AUC need not be 0.5."""
    rng = np.random.default_rng(1)
    p = np.ones(2000)
    p[:10] = rng.random(10)
    r = result(p, labels(2000, 0.25))
    assert r["top_share"] == pytest.approx(0.995)
    assert r["collapsed"]


def test_within_a_hundredth_of_odds_is_one_window_and_wider_is_not():
    y = labels(4000, 0.3)
    base = np.log(0.3 / 0.7)
    narrow = 1 / (1 + np.exp(-(base + np.linspace(0.0, 0.008, 4000))))
    assert result(narrow, y)["top_share"] == 1.0 and result(narrow, y)["collapsed"]
    wide = 1 / (1 + np.exp(-(base + np.linspace(0.0, 0.05, 4000))))
    r = result(wide, y)
    assert r["top_share"] == pytest.approx(0.2, abs=0.01) and not r["collapsed"]


@pytest.mark.parametrize("ctr", [0.001, 0.01, 0.25, 0.5, 0.9])
def test_healthy_predictions_at_any_click_rate_are_not_collapsed(ctr):
    """A model of a 0.1% click rate keeps its rows within 1e-3 of each other in probability:
    in log-odds they spread as anyone's."""
    p, y = healthy(100000, ctr, spread=0.5)
    r = result(p, y)
    assert not r["collapsed"], r
    assert r["top_share"] is not None and r["top_share"] < 0.05, r
    assert r["auc"] is not None and r["auc"] > 0.55


def test_auc_exactly_half_with_both_classes_is_collapsed():
    """Two probabilities, each with the same click share: no window holds 99% of the rows,
    yet the model ranks nothing (AUC exactly 0.5)."""
    p = np.repeat([0.2, 0.8], 500)
    y = np.tile([0.0, 1.0], 500)
    r = result(p, y)
    assert r["auc"] == 0.5 and r["top_share"] == 0.5 and r["collapsed"]


def test_too_few_rows_or_one_class_say_nothing():
    few = result(np.ones(COLLAPSE_MIN_ROWS - 1), labels(COLLAPSE_MIN_ROWS - 1, 0.5))
    assert few["top_share"] == 1.0 and not few["collapsed"]
    enough = result(np.ones(COLLAPSE_MIN_ROWS), labels(COLLAPSE_MIN_ROWS, 0.5))
    assert enough["collapsed"]
    # one class: no AUC, but every row at one probability is still a collapse
    one_class = result(np.full(500, 0.7), np.zeros(500))
    assert one_class["auc"] is None and one_class["collapsed"]
    empty = AucAccumulator().result()
    assert empty["top_share"] is None and not empty["collapsed"]


def test_the_share_survives_the_ranks_merge():
    """What the all-reduce does: histograms summed, then the share of the whole."""
    a, b = AucAccumulator(), AucAccumulator()
    a.add(torch.ones(300), torch.from_numpy(labels(300, 0.3)))
    p, y = healthy(300, 0.3)
    b.add(torch.from_numpy(p), torch.from_numpy(y))
    merged = AucAccumulator()
    merged.load_state(a.state() + b.state())
    r = merged.result()
    assert r["samples"] == 600 and r["top_share"] == pytest.approx(0.5, abs=0.01)
    assert not r["collapsed"]


def test_the_pass_verdict_leaves_out_a_fresh_models_predict_phase():
    dead = result(np.full(500, 0.5), labels(500, 0.3))
    p, y = healthy(500, 0.3)
    fine = result(p, y)
    none = AucAccumulator().result()  # a job that does not predict before training
    # a fresh model predicts one probability for every row: not a stall
    fresh = collapse_figures(dead, fine, trained=False)
    assert fresh["predict_collapsed"] and not fresh["predictions_collapsed"]
    # the same on a model that had trained: its passes' predictions collapsed
    assert collapse_figures(dead, fine, trained=True)["predictions_collapsed"]
    # training's own predictions collapsed: always
    figures = collapse_figures(none, dead, trained=False)
    assert figures == {
        "predict_top_share": None,
        "predict_collapsed": False,
        "train_top_share": 1.0,
        "train_collapsed": True,
        "predictions_collapsed": True,
    }
    assert not collapse_figures(fine, fine, trained=True)["predictions_collapsed"]
