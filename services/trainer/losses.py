"""The reference DLRM's losses: ``mse``, ``bce`` and ``wbce`` (per-label weighted BCE)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from streamrec.trainer.errors import ConfigError

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def make_loss(name: str, loss_weights: list[float] | None = None) -> LossFn:
    """Returns ``loss(p, t)`` for p, t: (B, 1) float32 -> scalar mean loss.

    ``wbce`` weighs each sample's BCE by ``loss_weights[label]`` (labels rounded to 0/1),
    then averages, as the reference's ``loss_fn_wrap``.
    """
    if name == "mse":
        return torch.nn.MSELoss(reduction="mean")
    if name == "bce":
        return torch.nn.BCELoss(reduction="mean")
    if name == "wbce":
        weights = torch.tensor(loss_weights or [1.0, 1.0], dtype=torch.float32)
        if weights.numel() != 2:
            raise ConfigError(f"loss_weights needs 2 values, got {loss_weights!r}")
        bce = torch.nn.BCELoss(reduction="none")

        def wbce(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            w = weights[t.detach().view(-1).round().long()].view_as(t)
            return (w * bce(p, t)).mean()

        return wbce
    raise ConfigError(f"loss_function must be mse, bce or wbce, got {name!r}")


def logloss(p: torch.Tensor, t: torch.Tensor, eps: float = 1e-7) -> float:
    """Summed binary log loss of probabilities p against labels t (any equal shapes)."""
    p = p.detach().double().clamp(eps, 1 - eps)
    t = t.detach().double()
    return float(-(t * p.log() + (1 - t) * (1 - p).log()).sum())
