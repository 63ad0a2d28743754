"""The reference DLRM's learning-rate policy: linear warmup, then quadratic decay.

With ``step`` the scheduler's step count (1 after construction, +1 per ``step()``),
warmup ``W``, decay start ``S`` and decay length ``N``::

    step < W                 lr = base * (1 - (W - step) / W)
    S <= step < S + N        lr = max(1e-7, base * ((N - (step - S)) / N) ** 2)
    otherwise, N > 0         lr frozen at the last value the two phases above produced
    otherwise, N == 0        lr = base

This is ``LRPolicyScheduler`` of facebookresearch/dlrm, written as a pure function of the
step so that a restart from a checkpoint continues at exactly the same rate. Where the
reference would read a rate it never set (no warmup step taken before a frozen phase),
the base rate is used.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from streamrec.trainer.errors import ConfigError

MIN_LR = 1e-7


def lr_at(
    step: int, base_lr: float, num_warmup_steps: int, decay_start_step: int, num_decay_steps: int
) -> float:
    """The learning rate at scheduler step count ``step`` (see the module docstring)."""
    warm, start, num = num_warmup_steps, decay_start_step, num_decay_steps
    if step < warm:
        return base_lr * (1.0 - (warm - step) / warm)
    end = start + num
    if start <= step < end:
        return max(MIN_LR, base_lr * ((num - (step - start)) / num) ** 2)
    if num == 0:
        return base_lr
    # frozen: after the decay, the last decayed value; between warmup and decay, the last
    # warmup value (the reference's self.last_lr), if such a step was ever taken.
    last = end - 1 if step >= end else warm - 1
    if last >= 1 and (step >= end or last < warm):
        return lr_at(last, base_lr, warm, start, num)
    return base_lr


class LRPolicyScheduler(torch.optim.lr_scheduler.LRScheduler):
    """The reference's scheduler on top of :func:`lr_at`; ``state_dict`` restores the step.

    Args:
        optimizer: its param groups' initial ``lr`` are the base rates.
        num_warmup_steps, decay_start_step, num_decay_steps: as the reference.

    Raises:
        ConfigError: decay starting before warmup ends (the reference exits there).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        num_warmup_steps: int,
        decay_start_step: int,
        num_decay_steps: int,
    ) -> None:
        if num_decay_steps > 0 and decay_start_step < num_warmup_steps:
            raise ConfigError(
                f"Learning rate warmup must finish before the decay starts: "
                f"lr_decay_start_step={decay_start_step} < lr_num_warmup_steps="
                f"{num_warmup_steps}"
            )
        self.num_warmup_steps = num_warmup_steps
        self.decay_start_step = decay_start_step
        self.num_decay_steps = num_decay_steps
        super().__init__(optimizer)

    def get_lr(self) -> list[float | torch.Tensor]:
        return [
            lr_at(
                self._step_count,
                float(base),
                self.num_warmup_steps,
                self.decay_start_step,
                self.num_decay_steps,
            )
            for base in self.base_lrs
        ]


def make_optimizer(
    name: str, learning_rate: float, params: Iterable[torch.nn.Parameter]
) -> torch.optim.Optimizer:
    """The dense optimizer ``hyper_parameters.optimizer`` names: ``sgd``, ``adagrad``, else
    ``adam``."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=learning_rate)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=learning_rate)
    return torch.optim.Adam(params, lr=learning_rate)
