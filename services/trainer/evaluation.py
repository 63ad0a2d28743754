"""Pass metrics: bucketed AUC and log loss (PaddleRec's way), mergeable across ranks.

Predictions are counted into ``num_buckets`` equal-width buckets of [0, 1] separately for
positives and negatives; AUC is the area under the ROC curve drawn through the bucket edges
(ties within a bucket count half). With 2**17 buckets the error against an exact AUC is far
below the differences a pass's AUC shows. Rank histograms are summed with one all-reduce.
"""

from __future__ import annotations

from typing import TypedDict

import torch
from streamrec.trainer.losses import logloss


class AucResult(TypedDict):
    """What :meth:`AucAccumulator.result` reports (None where nothing was seen)."""

    auc: float | None
    logloss: float | None
    samples: int
    actual_ctr: float | None
    predicted_ctr: float | None


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

    def result(self) -> AucResult:
        self._flush()
        n, npos, psum, ll = (float(v) for v in self.sums)
        return {
            "auc": self.auc(),
            "logloss": ll / n if n else None,
            "samples": int(n),
            "actual_ctr": npos / n if n else None,
            "predicted_ctr": psum / n if n else None,
        }
