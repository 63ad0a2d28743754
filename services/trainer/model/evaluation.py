"""Pass metrics: bucketed AUC and log loss (PaddleRec's way), mergeable across ranks.

Predictions are counted into ``num_buckets`` equal-width buckets of [0, 1] separately for
positives and negatives; AUC is the area under the ROC curve drawn through the bucket edges
(ties within a bucket count half). With 2**17 buckets the error against an exact AUC is far
below the differences a pass's AUC shows. Rank histograms are summed with one all-reduce.

The same histogram says when the predictions have **collapsed** (a saturated or dead model:
every row at one probability, its AUC 0.5 whatever the data): :meth:`AucAccumulator.top_share`
is the largest share of rows whose predictions lie within one window
:data:`COLLAPSE_LOGIT_WIDTH` wide in log-odds, and a result is ``collapsed`` when it has at
least :data:`COLLAPSE_MIN_ROWS` rows and that share is at least :data:`COLLAPSE_SHARE`, or its
AUC is exactly 0.5 with both classes seen. The window is in log-odds, not in probability: a
healthy model of a 0.1% click rate keeps nearly all its rows within 1e-3 of each other in
probability, while its log-odds spread as anyone's. Near 0 and 1, where a bucket (1 / (2**17 -
1) wide) is wider than the window, a window is one bucket: a model whose logits run from 41
to 1850 has every row in the top one.
"""

from __future__ import annotations

import functools
from typing import Any, TypedDict

import torch
from streamrec.trainer.model.losses import logloss

#: A result is collapsed when at least this share of its rows ...
COLLAPSE_SHARE = 0.99
#: ... have predictions within one window this wide in log-odds (a model whose predictions
#: all lie within 1% of each other's odds says nothing about any row) ...
COLLAPSE_LOGIT_WIDTH = 0.01
#: ... or its AUC is exactly 0.5 (both classes seen); either only with this many rows at
#: least (a handful of rows says nothing either way).
COLLAPSE_MIN_ROWS = 100


class AucResult(TypedDict):
    """What :meth:`AucAccumulator.result` reports (None where nothing was seen)."""

    auc: float | None
    logloss: float | None
    samples: int
    actual_ctr: float | None
    predicted_ctr: float | None
    #: the largest share of rows within one window of COLLAPSE_LOGIT_WIDTH (None: no rows)
    top_share: float | None
    #: the predictions collapsed (the module's rule; False with too few rows to tell)
    collapsed: bool


@functools.cache
def _window_ends(num_buckets: int) -> torch.Tensor:
    """(num_buckets,) int64: for each bucket b, one past the last bucket within
    :data:`COLLAPSE_LOGIT_WIDTH` above b in log-odds. Buckets are taken at their centres, the
    end ones (centres 0 and 1) at their inner edges so that they are finite."""
    half = 0.5 / (num_buckets - 1)
    p = torch.linspace(0.0, 1.0, num_buckets, dtype=torch.float64).clamp(half, 1.0 - half)
    logits = torch.log(p) - torch.log1p(-p)
    return torch.searchsorted(logits, logits + COLLAPSE_LOGIT_WIDTH, right=True)


class AucAccumulator:
    """Accumulates (prediction, label) pairs; ``result()`` -> auc, logloss, samples, ctr."""

    def __init__(self, num_buckets: int = 1 << 17) -> None:
        self.num_buckets = num_buckets
        # rows: negatives, positives; sums: [samples, positives, sum p, sum logloss]
        self.hist = torch.zeros(2, num_buckets, dtype=torch.float64)
        self.sums = torch.zeros(4, dtype=torch.float64)
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []

    def add(self, p: torch.Tensor, y: torch.Tensor) -> None:
        """p: (B,) or (B, 1) probabilities; y: the same shape, labels in {0, 1}.

        Only keeps references; the histogram is built once for many batches (fewer small
        ops on the training thread).
        """
        self._pending.append((p.detach().reshape(-1), y.detach().reshape(-1)))
        if len(self._pending) >= 256:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        p = torch.cat([a for a, _ in self._pending]).to(torch.float64)
        y = torch.cat([b for _, b in self._pending]).to(torch.float64)
        self._pending.clear()
        bucket = (p.clamp(0.0, 1.0) * (self.num_buckets - 1)).round().long()
        idx = bucket + (y > 0.5).long() * self.num_buckets
        self.hist.view(-1).index_add_(0, idx, torch.ones_like(p))
        self.sums += torch.stack(
            [
                torch.tensor(float(p.numel()), dtype=torch.float64),
                y.sum(),
                p.sum(),
                torch.tensor(logloss(p, y), dtype=torch.float64),
            ]
        )

    def state(self) -> torch.Tensor:
        """Everything in one flat float64 tensor (for all-reduce)."""
        self._flush()
        return torch.cat([self.hist.view(-1), self.sums])

    def load_state(self, flat: torch.Tensor) -> None:
        self._pending.clear()
        self.hist.view(-1).copy_(flat[:-4])
        self.sums.copy_(flat[-4:])

    def auc(self) -> float | None:
        """Area under the ROC curve; None when only one class was seen."""
        self._flush()
        neg, pos = self.hist[0], self.hist[1]
        tot_neg, tot_pos = float(neg.sum()), float(pos.sum())
        if tot_neg == 0 or tot_pos == 0:
            return None
        # walk buckets from the highest score down: each bucket adds a trapezoid
        neg_r, pos_r = neg.flip(0), pos.flip(0)
        fp_before = torch.cumsum(neg_r, 0) - neg_r
        area = (pos_r * (fp_before + 0.5 * neg_r)).sum()
        return float(1.0 - area / (tot_neg * tot_pos))

    def top_share(self) -> float | None:
        """The largest share of rows whose buckets lie within one window of
        :data:`COLLAPSE_LOGIT_WIDTH` in log-odds (1.0: every row at one probability); None
        when no row was seen."""
        self._flush()
        counts = self.hist.sum(0)
        n = float(counts.sum())
        if n == 0:
            return None
        cum = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
        # window b: buckets b .. end[b] - 1
        return float((cum[_window_ends(self.num_buckets)] - cum[:-1]).max()) / n

    def result(self) -> AucResult:
        self._flush()
        n, npos, psum, ll = (float(v) for v in self.sums)
        auc = self.auc()
        top = self.top_share()
        collapsed = (
            n >= COLLAPSE_MIN_ROWS
            and top is not None
            and (top >= COLLAPSE_SHARE or auc == 0.5)  # auc is None with one class
        )
        return {
            "auc": auc,
            "logloss": ll / n if n else None,
            "samples": int(n),
            "actual_ctr": npos / n if n else None,
            "predicted_ctr": psum / n if n else None,
            "top_share": top,
            "collapsed": collapsed,
        }


def collapse_figures(predict: AucResult, train: AucResult, trained: bool) -> dict[str, Any]:
    """A pass record's collapse figures: each phase's ``top_share`` and ``collapsed``, and
    ``predictions_collapsed``, the pass's verdict: its training predictions collapsed, or its
    predict phase's did on a model trained before (``trained``). A fresh model's predict
    phase is left out: it reads every row it has not trained as zeros, so a model without
    dense features predicts one probability for every row before its first step.

    Args:
        predict: the predict phase's result (the model before the pass); no rows when the
            job does not predict before training.
        train: the training phase's result.
        trained: the model had trained on some pass before this one (its record's ``after``
            is not None).
    """
    return {
        "predict_top_share": predict["top_share"],
        "predict_collapsed": predict["collapsed"],
        "train_top_share": train["top_share"],
        "train_collapsed": train["collapsed"],
        "predictions_collapsed": train["collapsed"] or (trained and predict["collapsed"]),
    }
