"""The LR policy against a line-by-line port of the reference's stateful scheduler."""

import pytest
import torch
from streamrec.trainer.errors import ConfigError
from streamrec.trainer.model.lr_policy import LRPolicyScheduler


class ReferenceScheduler:
    """facebookresearch/dlrm LRPolicyScheduler.get_lr, with its _step_count and last_lr."""

    def __init__(self, base_lr, num_warmup_steps, decay_start_step, num_decay_steps):
        self.base_lrs = [base_lr]
        self.num_warmup_steps = num_warmup_steps
        self.decay_start_step = decay_start_step
        self.decay_end_step = decay_start_step + num_decay_steps
        self.num_decay_steps = num_decay_steps
        self._step_count = 1  # _LRScheduler.__init__ takes the first step

    def get_lr(self):
        step_count = self._step_count
        if step_count < self.num_warmup_steps:
            scale = 1.0 - (self.num_warmup_steps - step_count) / self.num_warmup_steps
            lr = [base_lr * scale for base_lr in self.base_lrs]
            self.last_lr = lr
        elif self.decay_start_step <= step_count and step_count < self.decay_end_step:
            decayed_steps = step_count - self.decay_start_step
            scale = ((self.num_decay_steps - decayed_steps) / self.num_decay_steps) ** 2
            min_lr = 0.0000001
            lr = [max(min_lr, base_lr * scale) for base_lr in self.base_lrs]
            self.last_lr = lr
        else:
            if self.num_decay_steps > 0:
                lr = self.last_lr
            else:
                lr = self.base_lrs
        return lr


@pytest.mark.parametrize(
    "warm,start,num", [(0, 0, 0), (4, 4, 0), (3, 5, 4), (5, 5, 10), (2, 10, 3), (10, 10, 1000)]
)
def test_matches_reference(warm, start, num):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.3)
    sched = LRPolicyScheduler(opt, warm, start, num)
    ref = ReferenceScheduler(0.3, warm, start, num)
    for _ in range(40):
        want = ref.get_lr()[0]
        assert opt.param_groups[0]["lr"] == pytest.approx(want, rel=1e-12, abs=1e-15)
        opt.step()
        sched.step()
        ref._step_count += 1


def test_restores_from_state_dict():
    def make():
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=1.0)
        return opt, LRPolicyScheduler(opt, 3, 6, 8)

    opt, sched = make()
    for _ in range(7):
        opt.step()
        sched.step()
    opt2, sched2 = make()
    sched2.load_state_dict(sched.state_dict())
    opt2.load_state_dict(opt.state_dict())
    for _ in range(5):
        opt.step()
        sched.step()
        opt2.step()
        sched2.step()
        assert opt.param_groups[0]["lr"] == opt2.param_groups[0]["lr"]


def test_decay_before_warmup_end_is_an_error():
    p = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(ConfigError, match="warmup must finish before the decay"):
        LRPolicyScheduler(torch.optim.SGD([p], lr=1.0), 5, 2, 3)
