"""Online standardization of the dense features, in the manner of PaddleRec's ``data_norm``.

A user's raw columns (ages, counts, prices up to a million) fed to the reference's MLP drive
its first logits to hundreds and the model never learns. Every dense feature is therefore
standardized by running statistics kept with the model: per feature the count of values
seen, their sum and their sum of squares (float64), so ``y = (x - mean) / std``, clipped to
``[-CLIP, CLIP]``; a missing value (NaN) counts nowhere and comes out 0 (the mean).

- **Updated from training batches only**: a training forward adds its batch's moments to
  this rank's pending sums before normalizing, so a fresh model's first batch is normalized
  by itself (no prior to wash out, unlike ``data_norm``'s 1e4-sample unit prior). The
  predict phase, ``predict`` and exports only read the statistics; a model with none yet
  (a fresh model's first predict) standardizes each batch by its own moments, storing
  nothing.
- **Combined across ranks at the end of each pass**: the runner all-reduces every rank's
  pending sums with the pass's metrics (:meth:`DenseNorm.pending_sums`,
  :meth:`DenseNorm.merge`), so every rank ends the pass, and its checkpoint, with the same
  statistics. Within a pass a rank sees the merged statistics plus its own batches.
- **Decayed by a window**: after a merge, a feature's statistics that hold more than
  ``window`` values are scaled down to ``window`` (count, sum and squares alike: the mean and
  variance are kept, the past weighs less), so a drifting stream is followed.
- **Saved with the model**: the statistics and which features are normalized are buffers of
  the dense model's state dict: checkpoints, warm starts, the int8 export and ``predict``
  read them as they read the weights. A state saved before this existed has none: such a
  model was trained on unnormalized inputs, and loading it turns normalization off.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

#: Standardized values are clipped to this many standard deviations: one outlier (a price of
#: 1e6 in a column of tens) cannot saturate the MLP however early it comes.
CLIP = 8.0
#: Variance floor (in the feature's own units squared): a column constant so far divides by
#: 1e-3, not by 0.
VAR_FLOOR = 1e-6
#: The state dict's prefix of the normalizer inside the dense model (``DLRMDense``).
STATE_PREFIX = "dense_norm."


def batch_sums(x: torch.Tensor) -> torch.Tensor:
    """x: (B, D) float, NaN where missing -> (3, D) float64: count, sum, sum of squares of
    each feature's present values."""
    present = ~torch.isnan(x)
    values = torch.where(present, x, torch.zeros((), dtype=x.dtype, device=x.device)).double()
    return torch.stack([present.sum(0, dtype=torch.float64), values.sum(0), values.square().sum(0)])


def moments(sums: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(3, D) float64 count, sum, squares -> (mean, 1 / std), each (D,) float64; a feature
    with no value yet: mean 0, scale 1."""
    count = sums[0].clamp(min=1.0)
    mean = sums[1] / count
    var = (sums[2] / count - mean.square()).clamp(min=0.0)
    return mean, (var + VAR_FLOOR).rsqrt()


class DenseNorm(nn.Module):
    """Standardizes (B, D) dense features by running statistics (module docstring).

    Args:
        normalize: D flags, one a dense feature: False passes the feature through (only its
            missing values become 0).
        window: the values a feature's statistics hold at most after a merge (the decay).
    """

    #: (D,) bool: which features are standardized (saved: a loaded model keeps its own)
    mask: torch.Tensor
    #: (3, D) float64 merged count, sum, sum of squares (saved)
    sums: torch.Tensor
    #: (3, D) float64 this rank's training batches since the last merge (not saved)
    pending: torch.Tensor

    def __init__(self, normalize: Sequence[bool], window: float = 1e7) -> None:
        super().__init__()
        if window < 1:
            raise ValueError(f"window must be >= 1 value, got {window!r}")
        self.window = float(window)
        dim = len(normalize)
        self.register_buffer("mask", torch.tensor(list(normalize), dtype=torch.bool))
        self.register_buffer("sums", torch.zeros(3, dim, dtype=torch.float64))
        self.register_buffer("pending", torch.zeros(3, dim, dtype=torch.float64), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, D) float32, NaN where missing -> (B, D) float32, no NaN."""
        batch = batch_sums(x)
        if self.training:
            self.pending += batch
            seen = self.sums + self.pending
        else:
            # no statistics yet (a fresh model's predict): the batch's own, stored nowhere
            seen = torch.where(self.sums[0] > 0, self.sums, batch)
        mean, scale = moments(seen)
        y = ((x - mean.float()) * scale.float()).clamp(-CLIP, CLIP)
        return torch.nan_to_num(torch.where(self.mask, y, x), nan=0.0)

    def pending_sums(self) -> torch.Tensor:
        """(3 * D,) float64: this rank's sums since the last merge, for an all-reduce."""
        return self.pending.reshape(-1)

    @torch.no_grad()
    def merge(self, total: torch.Tensor) -> None:
        """Adds every rank's pending sums (``total``: the all-reduced :meth:`pending_sums`)
        to the statistics, clears this rank's, then decays to ``window`` values."""
        self.sums += total.reshape(self.sums.shape).to(self.sums.device)
        self.pending.zero_()
        over = self.sums[0] > self.window
        factor = torch.where(over, self.window / self.sums[0].clamp(min=1.0), 1.0)
        self.sums *= factor

    def _load_from_state_dict(self, state: dict[str, Any], prefix: str, *args: Any) -> None:
        """A load replaces the statistics and drops this rank's pending sums (a failed pass's,
        before its checkpoint is loaded again). A state saved before the normalizer existed
        has no ``mask``: its model was trained on unnormalized inputs, so it loads with
        every feature unnormalized and no statistics (said in the log)."""
        self.pending.zero_()
        if f"{prefix}mask" not in state:
            log.warning(
                "a dense model saved before online normalization: its %d dense features "
                "stay unnormalized",
                self.mask.numel(),
            )
            state[f"{prefix}mask"] = torch.zeros_like(self.mask)
            state[f"{prefix}sums"] = torch.zeros_like(self.sums)
        super()._load_from_state_dict(state, prefix, *args)

    def extra_repr(self) -> str:
        return f"features={self.mask.numel()}, normalized={int(self.mask.sum())}"
