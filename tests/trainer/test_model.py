"""DLRM forward against an independent numpy forward; the reference's dimension checks."""

import numpy as np
import pytest
import torch
from streamrec.trainer.errors import ModelShapeError
from streamrec.trainer.model.dlrm import DLRM, DLRMDense, interaction_size
from streamrec.trainer.model.losses import make_loss


def numpy_forward(model: DLRMDense, dense_x: np.ndarray, ly: list[np.ndarray]) -> np.ndarray:
    """Written from the reference's description, sharing nothing with the module."""

    def mlp(seq, x, sigmoid_last):
        linears = [m for m in seq if isinstance(m, torch.nn.Linear)]
        for i, lin in enumerate(linears):
            x = x @ lin.weight.detach().numpy().T + lin.bias.detach().numpy()
            last = i == len(linears) - 1
            x = 1 / (1 + np.exp(-x)) if (last and sigmoid_last) else np.maximum(x, 0)
        return x

    x = mlp(model.bot_l, dense_x, False)
    if model.interaction_op == "cat":
        r = np.concatenate([x, *ly], axis=1)
    else:
        feats = [x, *ly]
        cols = []
        for i in range(len(feats)):
            for j in range(i + 1 if model.interaction_itself else i):
                cols.append((feats[i] * feats[j]).sum(axis=1, keepdims=True))
        r = np.concatenate([x, *cols], axis=1)
    return mlp(model.top_l, r, True)


@pytest.mark.parametrize("op,itself", [("dot", False), ("dot", True), ("cat", False)])
def test_forward_matches_numpy(op, itself):
    torch.manual_seed(0)
    model = DLRMDense(
        dense_dim=4,
        num_sparse=3,
        sparse_dim=2,
        mlp_bot=[4, 3, 2],
        mlp_top=[4, 2, 1],
        interaction_op=op,
        interaction_itself=itself,
        seed=5,
    )
    # the seed's example: 4 dense features, 3 sparse features of dim 2, top 8-4-2-1 for dot
    assert model.ln_top[0] == interaction_size(op, 4, 2, itself)
    if op == "dot" and not itself:
        assert model.ln_top == [8, 4, 2, 1]
    rng = np.random.default_rng(1)
    dense_x = rng.random((5, 4)).astype(np.float32)
    ly = [rng.normal(size=(5, 2)).astype(np.float32) for _ in range(3)]
    got = model(torch.from_numpy(dense_x), [torch.from_numpy(e) for e in ly]).detach().numpy()
    want = numpy_forward(model, dense_x.astype(np.float64), [e.astype(np.float64) for e in ly])
    assert got.shape == (5, 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert ((got > 0) & (got < 1)).all()
    # the stacked (B, S, d) form the trainer's fused sparse side hands over
    stacked = torch.from_numpy(np.stack(ly, axis=1))
    np.testing.assert_allclose(
        model(torch.from_numpy(dense_x), stacked).detach().numpy(), want, rtol=1e-5, atol=1e-6
    )
    with pytest.raises(ModelShapeError, match=r"\(5, 3, 2\) \(batch, slots, dim\)"):
        model(torch.from_numpy(dense_x), stacked[:, :2])


def test_hand_computed_tiny_model():
    model = DLRMDense(1, 1, 1, [1, 1], [1], seed=0)
    with torch.no_grad():
        model.bot_l[0].weight.fill_(2.0)
        model.bot_l[0].bias.fill_(-1.0)
        model.top_l[0].weight.copy_(torch.tensor([[0.5, -1.0]]))
        model.top_l[0].bias.fill_(0.25)
    # x = relu(2*3 - 1) = 5; e = 0.5; R = [x, x*e] = [5, 2.5]; z = 2.5 - 2.5 + 0.25
    p = model(torch.tensor([[3.0]]), [torch.tensor([[0.5]])])
    assert p.item() == pytest.approx(1 / (1 + np.exp(-0.25)), rel=1e-6)


def test_reference_init_scales():
    model = DLRMDense(13, 26, 16, [13, 512, 256, 64, 16], [512, 256, 1], seed=3)
    w = model.bot_l[0].weight.detach().numpy()
    assert w.std() == pytest.approx(np.sqrt(2 / (13 + 512)), rel=0.1)
    assert model.ln_top == [26 * 27 // 2 + 16, 512, 256, 1]
    same = DLRMDense(13, 26, 16, [13, 512, 256, 64, 16], [512, 256, 1], seed=3)
    pairs = zip(model.parameters(), same.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"dense_dim": 5}, "arch-dense-feature-size 5 does not match first dim of bottom mlp 4"),
        ({"sparse_dim": 3}, "arch-sparse-feature-size 3 does not match last dim of bottom mlp 2"),
        ({"mlp_top": [4, 2]}, "must end in 1"),
        ({"interaction_op": "sum"}, "'dot' or 'cat'"),
    ],
)
def test_dimension_checks_raise_clear_errors(kwargs, match):
    args = dict(dense_dim=4, num_sparse=3, sparse_dim=2, mlp_bot=[4, 3, 2], mlp_top=[4, 1])
    with pytest.raises(ModelShapeError, match=match):
        DLRMDense(**(args | kwargs))


def test_forward_shape_errors():
    model = DLRMDense(4, 3, 2, [4, 3, 2], [1])
    with pytest.raises(ModelShapeError, match="dense_x must be"):
        model(torch.zeros(2, 5), [torch.zeros(2, 2)] * 3)
    with pytest.raises(ModelShapeError, match="expected 3 sparse"):
        model(torch.zeros(2, 4), [torch.zeros(2, 2)] * 2)
    with pytest.raises(ModelShapeError, match="sparse feature 1"):
        model(torch.zeros(2, 4), [torch.zeros(2, 2), torch.zeros(2, 3), torch.zeros(2, 2)])


def test_reference_module_pools_bags_by_sum():
    ref = DLRM(4, [4, 3, 2], 2, [4, 3, 2], [4, 2, 1], seed=0)
    x = torch.rand(2, 4)
    # the seed's mini-batch 0: indices per table and offsets
    indices = [torch.tensor([1, 2, 0, 1, 3]), torch.tensor([1, 0]), torch.tensor([0, 1, 1])]
    offsets = [torch.tensor([0, 2]), torch.tensor([0, 1]), torch.tensor([0, 2])]
    w = [bag.weight.detach() for bag in ref.emb_l]
    ly = [
        torch.stack([w[0][[1, 2]].sum(0), w[0][[0, 1, 3]].sum(0)]),
        torch.stack([w[1][1], w[1][0]]),
        torch.stack([w[2][[0, 1]].sum(0), w[2][1]]),
    ]
    torch.testing.assert_close(ref(x, offsets, indices), ref.dense(x, ly))
    n = 4
    assert float(w[0].abs().max()) <= np.sqrt(1 / n)


def test_losses():
    p = torch.tensor([[0.9], [0.2], [0.6]])
    z = torch.log(p / (1 - p))  # the losses take the logit
    t = torch.tensor([[1.0], [0.0], [0.0]])
    bce = -(np.log(0.9) + np.log(0.8) + np.log(0.4)) / 3
    assert make_loss("bce")(z, t).item() == pytest.approx(bce, rel=1e-5)
    assert make_loss("mse")(z, t).item() == pytest.approx((0.01 + 0.04 + 0.36) / 3, rel=1e-5)
    wbce = -(2.0 * np.log(0.9) + 0.5 * np.log(0.8) + 0.5 * np.log(0.4)) / 3
    assert make_loss("wbce", [0.5, 2.0])(z, t).item() == pytest.approx(wbce, rel=1e-5)


@pytest.mark.parametrize("name", ["bce", "wbce"])
def test_a_saturated_logit_still_has_a_gradient(name):
    """The old loss took BCE of the sigmoid: at a logit of 60 the sigmoid is 1.0 in fp32 and
    the clamped log's gradient is 0, so a saturated model never learned again."""
    z = torch.tensor([[60.0], [-45.0]], requires_grad=True)
    t = torch.tensor([[0.0], [1.0]])
    make_loss(name)(z, t).backward()
    assert z.grad is not None
    # d/dz of mean BCE-with-logits = (sigmoid(z) - t) / B
    torch.testing.assert_close(z.grad, torch.tensor([[0.5], [-0.5]]))
    zo = z.detach().clone().requires_grad_()
    torch.nn.BCELoss()(torch.sigmoid(zo), t).backward()
    assert zo.grad is not None and zo.grad[0, 0] == 0  # the old loss: no way back


def test_loss_threshold_keeps_its_reference_meaning():
    """A threshold t clamps the probability to [t, 1 - t] before the BCE: no gradient for a
    sample past it (the reference's ``loss_threshold``)."""
    loss = make_loss("bce", loss_threshold=0.1)
    z = torch.tensor([[5.0], [0.0]], requires_grad=True)
    t = torch.tensor([[1.0], [1.0]])
    value = loss(z, t)
    assert value.item() == pytest.approx(-(np.log(0.9) + np.log(0.5)) / 2, rel=1e-5)
    value.backward()
    assert z.grad is not None and z.grad[0, 0] == 0 and z.grad[1, 0] < 0


@pytest.mark.parametrize("itself", [False, True])
def test_dot_interaction_gradients_match_the_references_indexing(itself):
    """The fused pairs (one index_select; backward (G + G^T) T) give the reference's values and
    gradients: ``bmm`` then ``z[:, li, lj]`` under autograd, in float64."""
    torch.manual_seed(0)
    m = DLRMDense(4, 5, 3, [4, 8, 3], [6, 1], "dot", itself).double()
    x = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    ly = torch.randn(7, 5, 3, dtype=torch.float64, requires_grad=True)
    ours = m.interact(x, ly)

    x2 = x.detach().clone().requires_grad_(True)
    ly2 = ly.detach().clone().requires_grad_(True)
    t = torch.cat([x2.unsqueeze(1), ly2], dim=1)
    z = torch.bmm(t, t.transpose(1, 2))
    n, offset = 6, int(itself)
    li = torch.tensor([i for i in range(n) for _ in range(i + offset)])
    lj = torch.tensor([j for i in range(n) for j in range(i + offset)])
    ref = torch.cat([x2, z[:, li, lj]], dim=1)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)

    g = torch.randn_like(ref)
    ours.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x.grad, x2.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(ly.grad, ly2.grad, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b: m.interact(a, b), (x, ly))
