"""DLRM (as the reference DLRM, docs/design-notes.md): bottom MLP, feature interaction, top
MLP with a sigmoid.

The sparse part lives in the embedding store, so :class:`DLRMDense` takes the pooled
embeddings as inputs. :class:`DLRM` adds ``nn.EmbeddingBag`` tables (sum pooling, sparse
gradients) exactly as the reference does; the benchmark's baseline uses it.

Shapes, for a batch of ``B`` samples, ``D`` dense features, ``S`` sparse features of
dimension ``d`` (= ``arch_sparse_feature_size`` = the bottom MLP's last size)::

    dense_x (B, D) --bottom MLP--> x (B, d)
    ly: S x (B, d) pooled embeddings
    dot:  T = [x, ly...] (B, S+1, d); Z = T T^T (B, S+1, S+1);
          R = [x, Z[:, i, j] for j < i (j <= i with self-interaction)]
    cat:  R = [x, ly...] (B, (S+1) d)
    R --top MLP (ReLU ..., no activation on the last layer)--> logit (B, 1) --sigmoid--> p

The dense features first go through the online normalizer (:mod:`.dense_norm`) when the
model has one (``normalize``). A model without dense features (D = 0, ``mlp_bot`` = [0, d])
has no bottom MLP: x is a learned vector (:class:`LearnedVector`), so the interaction keeps
its shape and x . e_k is each feature's first-order term. Training takes the logit
(:meth:`DLRMDense.logits`: a saturated model still has gradients); :meth:`DLRMDense.forward`
is the probability.

A feature whose table has another dim ``d_k`` (a schema's ``dim``) comes in as (B, d_k) and
is projected to d by its own learned ``nn.Linear(d_k, d, bias=False)`` (``proj[str(k)]``)
before the interaction; features at d have none, so a model whose features are all at d
has the state dict it always had.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from streamrec.trainer.errors import ModelShapeError
from streamrec.trainer.model.dense_norm import DenseNorm
from torch import nn


def interaction_size(op: str, num_features: int, dim: int, itself: bool) -> int:
    """Width of the interaction output R for ``num_features`` = S + 1 vectors of size dim."""
    if op == "dot":
        pairs = (
            num_features * (num_features + 1) // 2
            if itself
            else (num_features * (num_features - 1) // 2)
        )
        return pairs + dim
    if op == "cat":
        return num_features * dim
    raise ModelShapeError(f"arch_interaction_op must be 'dot' or 'cat', got {op!r}")


class Fp32Linear(nn.Linear):
    """A linear layer that stays fp32 under bf16 autocast: the bottom MLP's first, which reads
    the raw dense features (bf16's 8-bit mantissa would merge log1p(1990) and log1p(1995))."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_autocast_enabled(x.device.type):
            return super().forward(x)
        with torch.autocast(x.device.type, enabled=False):
            return super().forward(x.float())


def make_mlp(
    sizes: list[int],
    rng: np.random.RandomState,
    fp32_first: bool = False,
    logit_last: bool = False,
) -> nn.Sequential:
    """Linear layers with the reference's initialisation, a ReLU after each.

    Weights ~ N(0, sqrt(2 / (fan_in + fan_out))), biases ~ N(0, sqrt(1 / fan_out)).
    ``fp32_first``: the first layer an :class:`Fp32Linear` (the same parameters and state).
    ``logit_last``: nothing after the last layer (the top MLP's logit: the caller takes the
    sigmoid in fp32, where bf16's 8-bit mantissa cannot round it to 1).
    """
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        n, m = int(sizes[i]), int(sizes[i + 1])
        layer = (Fp32Linear if fp32_first and i == 0 else nn.Linear)(n, m, bias=True)
        w = rng.normal(0.0, np.sqrt(2.0 / (m + n)), size=(m, n)).astype(np.float32)
        b = rng.normal(0.0, np.sqrt(1.0 / m), size=m).astype(np.float32)
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(w))
            layer.bias.copy_(torch.from_numpy(b))
        layers.append(layer)
        if not (logit_last and i == len(sizes) - 2):
            # in place: the ReLU backward reads only its output, not the Linear output
            layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


class LearnedVector(nn.Module):
    """The bottom of a model without dense features: one learned (d,) vector as every
    sample's x, initialised as a layer's bias, N(0, sqrt(1 / d))."""

    def __init__(self, dim: int, rng: np.random.RandomState) -> None:
        super().__init__()
        init = rng.normal(0.0, np.sqrt(1.0 / dim), size=dim).astype(np.float32)
        self.vector = nn.Parameter(torch.from_numpy(init))

    def forward(self, dense_x: torch.Tensor) -> torch.Tensor:
        """dense_x: (B, 0) -> (B, d)."""
        return self.vector.unsqueeze(0).expand(dense_x.shape[0], -1)


class _PairDots(torch.autograd.Function):
    """The dot interaction's pairs: ``(T T^T)[:, i, j]`` for the pairs ``(i, j)``.

    The reference takes them with advanced indexing, whose backward is an accumulating
    ``index_put_`` (serial on the CPU), and its ``bmm``'s backward costs two batched
    products. Here the pairs are one ``index_select`` of the flattened products, and since
    ``Z = T T^T`` the gradient is ``(G + G^T) T``. ``G + G^T`` holds each pair's gradient at
    ``i * n + j`` and at ``j * n + i`` (twice on the diagonal, as it should), zeros elsewhere:
    one ``index_select`` of the gradients (with the doubled diagonal ones and a zero column)
    through ``spread``, no zeroed matrix to add into; then one ``bmm``. Setup b (B 2048, 27
    vectors of 16): 4.4 ms -> 1.1 ms a step with an ``index_add_``, then 1.2 ms less CPU.
    """

    @staticmethod
    def forward(
        ctx: Any, t: torch.Tensor, pairs: torch.Tensor, spread: torch.Tensor, diagonal: torch.Tensor
    ) -> torch.Tensor:
        """t: (B, n, d) float32; pairs: (P,) int64 ``i * n + j``; spread: (n * n,) int64 the
        column of ``[grad, 2 grad[:, diagonal], 0]`` each product's gradient is; diagonal:
        (D,) int64 the pairs with i == j -> (B, P)."""
        batch, n, _ = t.shape
        ctx.save_for_backward(t, spread, diagonal)
        z = torch.bmm(t, t.transpose(1, 2))
        return z.view(batch, n * n).index_select(1, pairs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        t, spread, diagonal = ctx.saved_tensors
        batch, n, _ = t.shape
        # under autocast the forward's product ran in bf16 and grad is bf16; the backward
        # runs without autocast, so it takes t's dtype
        g = grad.to(t.dtype)
        parts = [g, g.index_select(1, diagonal) * 2] if diagonal.numel() else [g]
        ext = torch.cat([*parts, g.new_zeros(batch, 1)], dim=1)
        gz = ext.index_select(1, spread).view(batch, n, n)
        return torch.bmm(gz, t), None, None, None


class DLRMDense(nn.Module):
    """The dense part of DLRM: bottom MLP, interaction, top MLP (+ sigmoid).

    Args:
        dense_dim: D, the number of dense features (must equal ``mlp_bot[0]``).
        num_sparse: S, the number of sparse features (embedding tables).
        sparse_dim: d, the embedding size (must equal ``mlp_bot[-1]``).
        mlp_bot: bottom MLP sizes including its input, e.g. [13, 512, 256, 64, 16].
        mlp_top: top MLP sizes after its input, e.g. [512, 256, 1]; the input size is
            fitted to the interaction as in the reference.
        interaction_op: 'dot' or 'cat'.
        interaction_itself: 'dot' includes each vector's product with itself.
        loss_threshold: when in (0, 1), clamps p to [t, 1 - t] (reference behaviour).
        seed: numpy seed of the reference initialisation.
        slot_dims: S ints, each feature's embedding dim (None: all ``sparse_dim``); a
            feature of another dim gets a projection to ``sparse_dim`` (``proj``), and
            :meth:`forward` then takes ``ly`` as S tensors (B, slot_dims[k]).
        normalize: D flags, which dense features the online normalizer standardizes
            (:class:`~.dense_norm.DenseNorm`, ``dense_norm``); None: no normalizer (the
            reference's model, inputs as given).
        norm_window: the normalizer's window (values a feature's statistics hold at most).

    Raises:
        ModelShapeError: on the reference's dimension mismatches.
    """

    #: (P,) int64 position ``i * (S + 1) + j`` of each pair (j < i, or j <= i with
    #: self-interaction) in the flattened (S+1, S+1) dot products; ``spread``, ``diagonal``:
    #: the backward's map of them (:class:`_PairDots`) (buffers, registered in ``__init__``)
    pairs: torch.Tensor
    spread: torch.Tensor
    diagonal: torch.Tensor

    def __init__(
        self,
        dense_dim: int,
        num_sparse: int,
        sparse_dim: int,
        mlp_bot: list[int],
        mlp_top: list[int],
        interaction_op: str = "dot",
        interaction_itself: bool = False,
        loss_threshold: float = 0.0,
        seed: int = 123,
        slot_dims: list[int] | None = None,
        normalize: Sequence[bool] | None = None,
        norm_window: float = 1e7,
    ) -> None:
        super().__init__()
        if dense_dim != mlp_bot[0]:
            raise ModelShapeError(
                f"arch-dense-feature-size {dense_dim} does not match first "
                f"dim of bottom mlp {mlp_bot[0]} (arch_mlp_bot={mlp_bot})"
            )
        if sparse_dim != mlp_bot[-1]:
            raise ModelShapeError(
                f"arch-sparse-feature-size {sparse_dim} does not match last dim of bottom mlp "
                f"{mlp_bot[-1]} (arch_mlp_bot={mlp_bot})"
            )
        if mlp_top[-1] != 1:
            raise ModelShapeError(
                f"arch_mlp_top must end in 1 (one click probability), got {mlp_top}"
            )
        if dense_dim == 0 and len(mlp_bot) != 2:
            raise ModelShapeError(
                f"without dense features there is no bottom MLP: arch_mlp_bot must be "
                f"[0, {sparse_dim}], got {mlp_bot}"
            )
        if normalize is not None and len(normalize) != dense_dim:
            raise ModelShapeError(
                f"normalize needs {dense_dim} flags (one a dense feature), got {len(normalize)}"
            )
        if num_sparse < 1:
            raise ModelShapeError(f"need at least one sparse feature, got {num_sparse}")
        dims = [sparse_dim] * num_sparse if slot_dims is None else [int(d) for d in slot_dims]
        if len(dims) != num_sparse or min(dims) < 1:
            raise ModelShapeError(
                f"slot_dims must be {num_sparse} dims >= 1 (one a sparse feature), got {dims}"
            )
        #: (S,) each feature's embedding dim before its projection (if any)
        self.slot_dims = dims
        self.dense_dim, self.num_sparse, self.sparse_dim = dense_dim, num_sparse, sparse_dim
        self.interaction_op, self.interaction_itself = interaction_op, interaction_itself
        self.loss_threshold = loss_threshold
        num_int = interaction_size(interaction_op, num_sparse + 1, sparse_dim, interaction_itself)
        self.ln_bot = list(mlp_bot)
        self.ln_top = [num_int, *mlp_top]
        rng = np.random.RandomState(seed)
        #: the online normalizer of the dense features (None: inputs as given)
        self.dense_norm = (
            DenseNorm(normalize, norm_window) if normalize is not None and dense_dim else None
        )
        self.bot_l: nn.Module = (
            make_mlp(self.ln_bot, rng, fp32_first=True)
            if dense_dim
            else LearnedVector(sparse_dim, rng)
        )
        self.top_l = make_mlp(self.ln_top, rng, logit_last=True)
        offset = 1 if interaction_itself else 0
        n = num_sparse + 1
        pairs = [(i, j) for i in range(n) for j in range(i + offset)]
        diagonal = [k for k, (i, j) in enumerate(pairs) if i == j]
        spread = torch.full((n * n,), len(pairs) + len(diagonal), dtype=torch.int64)  # zero
        for k, (i, j) in enumerate(pairs):
            spread[i * n + j] = spread[j * n + i] = k
        for m, k in enumerate(diagonal):
            spread[pairs[k][0] * (n + 1)] = len(pairs) + m
        flat = [i * n + j for i, j in pairs]
        self.register_buffer("pairs", torch.tensor(flat, dtype=torch.int64), persistent=False)
        self.register_buffer("spread", spread, persistent=False)
        self.register_buffer(
            "diagonal", torch.tensor(diagonal, dtype=torch.int64), persistent=False
        )
        #: per feature of another dim (key ``str(k)``): its map (B, d_k) -> (B, d), no bias,
        #: initialised as the MLPs' layers from a generator of its own (the MLPs' init is
        #: the same with or without projections)
        self.proj = nn.ModuleDict()
        prng = np.random.RandomState(seed + 2)
        for k, dk in enumerate(dims):
            if dk != sparse_dim:
                layer = nn.Linear(dk, sparse_dim, bias=False)
                w = prng.normal(0.0, np.sqrt(2.0 / (dk + sparse_dim)), size=(sparse_dim, dk))
                with torch.no_grad():
                    layer.weight.copy_(torch.from_numpy(w.astype(np.float32)))
                self.proj[str(k)] = layer

    def interact(self, x: torch.Tensor, ly: list[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """x: (B, d), ly: S x (B, d) or (B, S, d) -> R: (B, num_int) float32."""
        if torch.is_autocast_enabled(x.device.type):
            # in fp32 under bf16 autocast: its products are the embeddings' gradients
            with torch.autocast(x.device.type, enabled=False):
                floats = ly.float() if isinstance(ly, torch.Tensor) else [e.float() for e in ly]
                return self.interact(x.float(), floats)
        batch, d = x.shape
        if isinstance(ly, torch.Tensor):
            t = torch.cat([x.unsqueeze(1), ly], dim=1)
            if self.interaction_op == "cat":
                return t.reshape(batch, -1)
        elif self.interaction_op == "cat":
            return torch.cat([x, *ly], dim=1)
        else:
            t = torch.cat([x, *ly], dim=1).view(batch, -1, d)
        return torch.cat([x, _PairDots.apply(t, self.pairs, self.spread, self.diagonal)], dim=1)

    def forward(self, dense_x: torch.Tensor, ly: list[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """dense_x: (B, D) float32, ly: S x (B, d_k) (``slot_dims``) or (B, S, d) float32 (all
        features at d) -> click probability (B, 1) float32, clamped to ``loss_threshold``'s
        range when one is set (the reference's behaviour)."""
        p = torch.sigmoid(self.logits(dense_x, ly).float())
        if 0.0 < self.loss_threshold < 1.0:
            p = torch.clamp(p, min=self.loss_threshold, max=1.0 - self.loss_threshold)
        return p

    def logits(self, dense_x: torch.Tensor, ly: list[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """The click logit (B, 1), before the sigmoid (the arguments as :meth:`forward`'s);
        in the top MLP's dtype (bf16 under bf16 autocast)."""
        if dense_x.dim() != 2 or dense_x.shape[1] != self.dense_dim:
            raise ModelShapeError(
                f"dense_x must be (batch, {self.dense_dim}), got {tuple(dense_x.shape)}"
            )
        if isinstance(ly, torch.Tensor):
            want = (dense_x.shape[0], self.num_sparse, self.sparse_dim)
            if self.proj:
                raise ModelShapeError(
                    f"features of dims {self.slot_dims} come as {self.num_sparse} tensors "
                    f"(batch, dim), not one {tuple(ly.shape)}"
                )
            if tuple(ly.shape) != want:
                raise ModelShapeError(
                    f"sparse features must be {want} (batch, slots, dim), got {tuple(ly.shape)}"
                )
        else:
            if len(ly) != self.num_sparse:
                raise ModelShapeError(f"expected {self.num_sparse} sparse features, got {len(ly)}")
            for k, e in enumerate(ly):
                if e.shape != (dense_x.shape[0], self.slot_dims[k]):
                    raise ModelShapeError(
                        f"sparse feature {k} must be ({dense_x.shape[0]}, "
                        f"{self.slot_dims[k]}), got {tuple(e.shape)}"
                    )
            if self.proj:
                ly = [
                    self.proj[str(k)](e) if self.slot_dims[k] != self.sparse_dim else e
                    for k, e in enumerate(ly)
                ]
        if self.dense_norm is not None:
            dense_x = self.dense_norm(dense_x.float())
        x = self.bot_l(dense_x)
        return self.top_l(self.interact(x, ly))


class DLRM(nn.Module):
    """The reference DLRM: :class:`DLRMDense` plus ``nn.EmbeddingBag`` tables (sum, sparse).

    Args:
        ln_emb: rows of each table, e.g. [100] * 12 + [1000] * 3.
        (the rest as :class:`DLRMDense`)
    """

    def __init__(
        self,
        dense_dim: int,
        ln_emb: list[int],
        sparse_dim: int,
        mlp_bot: list[int],
        mlp_top: list[int],
        interaction_op: str = "dot",
        interaction_itself: bool = False,
        seed: int = 123,
    ) -> None:
        super().__init__()
        self.dense = DLRMDense(
            dense_dim,
            len(ln_emb),
            sparse_dim,
            mlp_bot,
            mlp_top,
            interaction_op,
            interaction_itself,
            seed=seed,
        )
        rng = np.random.RandomState(seed + 1)
        self.emb_l = nn.ModuleList()
        for n in ln_emb:
            bag = nn.EmbeddingBag(n, sparse_dim, mode="sum", sparse=True)
            w = rng.uniform(-np.sqrt(1 / n), np.sqrt(1 / n), size=(n, sparse_dim))
            with torch.no_grad():
                bag.weight.copy_(torch.from_numpy(w.astype(np.float32)))
            self.emb_l.append(bag)

    def forward(
        self, dense_x: torch.Tensor, offsets: list[torch.Tensor], indices: list[torch.Tensor]
    ) -> torch.Tensor:
        """dense_x: (B, D); offsets/indices: S x (B,) / (nnz,) int64 -> p (B, 1)."""
        ly = [bag(idx, off) for bag, off, idx in zip(self.emb_l, offsets, indices, strict=True)]
        return self.dense(dense_x, ly)
