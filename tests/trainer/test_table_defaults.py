"""The trainer's default sparse rule against torch.optim.Adagrad (the baseline's), on one row.

The default is TorchAdaGradSGDRule: the accumulator adds ``g ** 2`` before the step, so the
first step is ``lr * g / (|g| + eps)``, about ``lr * sign(g)`` whatever the size of ``g``.
PaddleRec's AdaGrad rules (kept, by name) add it after: their first step is a plain SGD step
``lr * g``, which left the words of mean-pooled bags and rare keys nearly untrained
(BENCHMARKS.md, "Quality on real data sets"). The pushes go through the real store.
"""

from __future__ import annotations

import numpy as np
import torch
from streamrec.control.trainer_config import TrainerConfig
from streamrec.embedding_store import EmbeddingStore, TableOptions
from streamrec.trainer.store_tables import build_table_options

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
    """BENCHMARKS.md "Quality on real data sets" measured these; change both together."""
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
            assert (rule.name, rule.learning_rate) == ("TorchAdaGradSGDRule", 0.03)


def test_default_rule_steps_as_torch_adagrad_from_the_first_step() -> None:
    t = default_table()
    lr = t.embedx_sgd_param.learning_rate
    grads = [GRAD, (0.5 * GRAD).astype(np.float32), (-3.0 * GRAD).astype(np.float32)]
    grads += [np.roll(GRAD, k) for k in range(1, 8)]
    for store_w, torch_w in zip(store_steps(t, grads), torch_steps(lr, grads), strict=True):
        np.testing.assert_allclose(store_w, torch_w, rtol=1e-5, atol=1e-7)


def test_first_step_is_the_rate_whatever_the_gradient() -> None:
    """A weight of a word in a bag of 20 (a twentieth of the gradient) or of a rare key moves
    as far as a hot key's: the step that PaddleRec's rule made 50 times smaller."""
    t = default_table()
    lr = t.embedx_sgd_param.learning_rate
    (store_w,) = store_steps(t, [GRAD])
    np.testing.assert_allclose(np.abs(store_w), lr, rtol=1e-5)
    np.testing.assert_array_equal(np.sign(store_w), -np.sign(GRAD))
