"""The reference DLRM's losses, ``mse``, ``bce`` and ``wbce`` (per-label weighted BCE), taken
on the model's logit.

The reference takes BCE of the sigmoid's output: once a model saturates (raw inputs, a rate
too high) the sigmoid rounds to 0 or 1, the clipped log has a zero gradient and nothing is
learned again. Here ``bce`` and ``wbce`` are ``binary_cross_entropy_with_logits``: the same
value where the sigmoid is exact, and a gradient of ``sigmoid(z) - t`` however large ``z``.
A ``loss_threshold`` in (0, 1) keeps its reference meaning: the probability is clamped to
``[t, 1 - t]`` before the BCE (no gradient outside it), as the user asked.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from streamrec.trainer.errors import ConfigError

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def make_loss(
    name: str, loss_weights: list[float] | None = None, loss_threshold: float = 0.0
) -> LossFn:
    """Returns ``loss(z, t)`` for the logit z and labels t, both (B, 1) -> scalar mean loss.

    ``wbce`` weighs each sample's BCE by ``loss_weights[label]`` (labels rounded to 0/1),
    then averages, as the reference's ``loss_fn_wrap``.
    """
    weights = torch.tensor(loss_weights or [1.0, 1.0], dtype=torch.float32)
    if name == "wbce" and weights.numel() != 2:
        raise ConfigError(f"loss_weights needs 2 values, got {loss_weights!r}")
    clamped = 0.0 < loss_threshold < 1.0

    def probability(z: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(z.float())
        return p.clamp(loss_threshold, 1.0 - loss_threshold) if clamped else p

    def bce(z: torch.Tensor, t: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
        if clamped:
            return F.binary_cross_entropy(probability(z), t, weight=w)
        return F.binary_cross_entropy_with_logits(z.float(), t, weight=w)

    if name == "mse":
        return lambda z, t: F.mse_loss(probability(z), t)
    if name == "bce":
        return bce
    if name == "wbce":

        def wbce(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            w = weights.to(t.device)[t.detach().view(-1).round().long()].view_as(t)
            return bce(z, t, w)

        return wbce
    raise ConfigError(f"loss_function must be mse, bce or wbce, got {name!r}")


def logloss(p: torch.Tensor, t: torch.Tensor, eps: float = 1e-7) -> float:
    """Summed binary log loss of probabilities p against labels t (any equal shapes)."""
    p = p.detach().double().clamp(eps, 1 - eps)
    t = t.detach().double()
    return float(-(t * p.log() + (1 - t) * (1 - p).log()).sum())
