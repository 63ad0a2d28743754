"""The trainer's default sparse rule against torch.optim.Adagrad (the baseline's), on one row.

PaddleRec's AdaGrad rules scale a step by ``sqrt(initial_g2sum / (initial_g2sum + g2sum))``
with ``g2sum`` summed *before* this gradient: the first step is a plain SGD step ``lr * g``.
torch's Adagrad adds ``g ** 2`` first: its first step is ``lr * g / (|g| + eps)``, about
``lr * sign(g)`` whatever the size of ``g``. Once ``g2sum >> initial_g2sum`` the two agree with
torch's rate equal to ``lr * sqrt(initial_g2sum)``. The pushes go through the real store.
"""

from __future__ import annotations

import numpy as np
import torch
from streamrec.control.trainer_config import TrainerConfig
from streamrec.embedding_store import EmbeddingStore, TableOptions
from streamrec.trainer.store import build_table_options

DIM = 16
#: One gradient of a row, from tiny to large (a hot key's gradient summed over a batch).
GRAD = np.array([0.01, -0.05, 0.2, -1.0, 4.0, -16.0, 0.5, -0.002] * 2, dtype=np.float32)


def default_table() -> TableOptions:
    """The trainer's table for one slot, rows starting at zero (only the steps are compared)."""
    cfg = TrainerConfig.parse(
        {
            "hyper_parameters": {"sparse_inputs_slots": 1, "arch_sparse_feature_size": DIM},
            "table_parameters": {"initializer": {"type": "zeros"}},
        }
    )
    return build_table_options(cfg)[0]


def store_steps(t: TableOptions, grads: list[np.ndarray]) -> list[np.ndarray]:
    """The row's weights after each push of ``grads`` (each (DIM,) float32) to key 7."""
    store = EmbeddingStore([t])
    key = torch.tensor([7], dtype=torch.int64)
    out = []
    try:
        store.pull(t.name, key, create=True)
        for g in grads:
            store.push(t.name, key, torch.from_numpy(g).view(1, DIM))
            out.append(store.pull(t.name, key, create=False)[0].numpy().copy())
    finally:
        store.close()
    return out


def torch_steps(lr: float, grads: list[np.ndarray]) -> list[np.ndarray]:
    """The same row trained by torch.optim.Adagrad (the quality baseline's sparse optimizer)."""
    w = torch.zeros(DIM, requires_grad=True)
    opt = torch.optim.Adagrad([w], lr=lr)
    out = []
    for g in grads:
        w.grad = torch.from_numpy(g.copy())
        opt.step()
        out.append(w.detach().numpy().copy())
    return out


def test_defaults_are_the_ones_benchmarked() -> None:
    """BENCHMARKS.md "Defaults" and "Defaults on a real stream" measured these; change both
    together."""
    cfg0 = TrainerConfig.parse({})
    hp = cfg0.hyper_parameters
    assert (hp.optimizer, hp.learning_rate) == ("adagrad", 0.01)
    assert cfg0.runner.train_batch_size == "auto"  # batch_rule.py: ~64 steps a pass
    cfg = TrainerConfig.parse({"hyper_parameters": {"sparse_inputs_slots": 2}})
    for t in build_table_options(cfg):
        assert t.embedx_threshold == 0
        assert (t.delete_threshold, t.delete_after_unseen_days) == (0.0, 30.0)
        assert (t.initializer.low, t.initializer.high) == (-0.005, 0.005)
        for rule in (t.embed_sgd_param, t.embedx_sgd_param):
            assert (rule.name, rule.learning_rate, rule.initial_g2sum) == (
                "StdAdaGradSGDRule",
                0.05,
                3.0,
            )


def test_first_step_is_sgd_in_the_store_and_sign_in_torch() -> None:
    t = default_table()
    lr = t.embedx_sgd_param.learning_rate
    (store_w,) = store_steps(t, [GRAD])
    (torch_w,) = torch_steps(lr, [GRAD])
    # the store: ratio sqrt(ig2 / (ig2 + 0)) = 1, a plain SGD step proportional to g
    np.testing.assert_allclose(store_w, -lr * GRAD, rtol=1e-6)
    # torch: g / (sqrt(g^2) + 1e-10), the same size lr for every weight
    np.testing.assert_allclose(torch_w, -lr * np.sign(GRAD), rtol=1e-5)
    # so on a small gradient the store moves far less, on a large one far more
    small, large = np.abs(GRAD).argmin(), np.abs(GRAD).argmax()
    assert abs(store_w[small]) < abs(torch_w[small]) / 50
    assert abs(store_w[large]) > abs(torch_w[large]) * 10


def test_second_step_uses_the_sum_before_the_gradient() -> None:
    t = default_table()
    lr, ig2 = t.embedx_sgd_param.learning_rate, t.embedx_sgd_param.initial_g2sum
    g2 = (0.5 * GRAD).astype(np.float32)
    _, store_w = store_steps(t, [GRAD, g2])
    _, torch_w = torch_steps(lr, [GRAD, g2])
    want_store = -lr * GRAD - lr * g2 * np.sqrt(ig2 / (ig2 + GRAD.astype(np.float64) ** 2))
    np.testing.assert_allclose(store_w, want_store, rtol=1e-5)
    want_torch = -lr * np.sign(GRAD) - lr * g2 / np.sqrt(GRAD**2 + g2**2)
    np.testing.assert_allclose(torch_w, want_torch, rtol=1e-5)


def test_later_steps_match_torch_at_lr_times_sqrt_initial_g2sum() -> None:
    steps = 400
    t = default_table()
    lr, ig2 = t.embedx_sgd_param.learning_rate, t.embedx_sgd_param.initial_g2sum
    g = np.full(DIM, 2.0, dtype=np.float32)
    store_w = store_steps(t, [g] * steps)
    torch_w = torch_steps(lr * np.sqrt(ig2), [g] * steps)
    store_last = store_w[-1] - store_w[-2]
    torch_last = torch_w[-1] - torch_w[-2]
    # step n: lr g sqrt(ig2 / (ig2 + (n-1) g^2)) vs lr sqrt(ig2) g / sqrt(n g^2): equal as n grows
    np.testing.assert_allclose(store_last, torch_last, rtol=0.01)
