"""The reference DLRM training step, reproduced: the trainer benchmark's baseline.

facebookresearch/dlrm ``dlrm_s_pytorch.py`` (its ``DLRM_Net`` and the step of its training
loop) re-implemented without its code, run as a process of its own with the reference's
defaults: no ``OMP_WAIT_POLICY``, torch's own thread count, glibc's own malloc settings. It
imports nothing of StreamRec, so none of StreamRec's process settings reach it.

What is reproduced, as the reference does it (checked against its code: BENCHMARKS.md,
"Fair baseline")::

    tables  nn.EmbeddingBag(n, d, mode="sum", sparse=True), weights U(-sqrt(1/n), sqrt(1/n))
    MLPs    nn.Linear + ReLU (Sigmoid after the top's last layer), weights
            N(0, sqrt(2 / (fan_in + fan_out))), biases N(0, sqrt(1 / fan_out)); numpy's global
            RNG seeded 123, drawn in the order tables, bottom, top
    dot     T = [x, ly...] (B, S+1, d); Z = T T^T; R = [x, Z[:, i, j] for j < i]
            (li/lj rebuilt from Python lists on every call, as the reference does)
    step    zero_grad; p = net(X, lS_o, lS_i); loss; loss to numpy; backward; SGD step
            (torch.optim.SGD on every parameter, lr 0.01, sparse table gradients)
    data    the reference's random generator with one index per lookup: X ~ U(0, 1) (B, 13),
            ids round(U(0, 1) * (n - 1)), offsets (S, B) stacked, targets U(0, 1) (B, 1);
            every batch built before timing starts

On a GPU (``--device cuda``, the reference's ``--use-gpu``): the model, its tables' EmbeddingBags
included, and every batch on the GPU before timing starts; ``torch.cuda.synchronize()`` before
the clock starts and before it stops. The arithmetic stays the reference's fp32.

The loss is BCE: the loss StreamRec trains with and the reference's own Criteo scripts pass
(``--loss-function=bce``); its CLI default is MSE (``--loss mse``; the step rate is the same
within noise, see BENCHMARKS.md). The reference's LR scheduler step (a no-op with its
defaults) is left out.

    python bench/reference_dlrm.py --setup b --steps 200 --json
    python bench/reference_dlrm.py --setup b --steps 400 --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
from torch import nn

#: benchmark setups: (a) the reference DLRM's CPU table, (b) Criteo-Kaggle-like
SETUPS: dict[str, dict] = {
    "a": {
        "ln_emb": [100] * 12 + [1000] * 3,
        "bot": [13, 512, 256, 64, 16],
        "top": [512, 256, 1],
        "batch": 128,
    },
    "b": {
        "ln_emb": [100_000] * 26,
        "bot": [13, 512, 256, 64, 16],
        "top": [512, 256, 1],
        "batch": 2048,
    },
    # (b) with 10 ids a lookup in every table: the reference's --num-indices-per-lookup 10
    # --num-indices-per-lookup-fixed; StreamRec reads them as Parquet list columns
    "multihot": {
        "ln_emb": [100_000] * 26,
        "bot": [13, 512, 256, 64, 16],
        "top": [512, 256, 1],
        "batch": 2048,
        "lookups": 10,
    },
}
#: the reference's default --learning-rate
LR = 0.01
#: the reference's default --numpy-rand-seed
SEED = 123


def top_sizes(setup: dict) -> list[int]:
    """The top MLP's sizes with its input fitted to the dot interaction (itself excluded)."""
    fea = len(setup["ln_emb"]) + 1
    return [fea * (fea - 1) // 2 + setup["bot"][-1], *setup["top"]]


def forward_flops_per_sample(setup: dict) -> int:
    """Multiply-adds x 2 of one sample's forward pass: the MLPs' matmuls and the full
    (S+1) x (S+1) x d batched product of the interaction (biases, activations and the
    one-row bag sums left out). A training step costs about three times this."""
    fea, d = len(setup["ln_emb"]) + 1, setup["bot"][-1]
    mlp = sum(
        2 * n * m
        for sizes in (setup["bot"], top_sizes(setup))
        for n, m in zip(sizes[:-1], sizes[1:], strict=True)
    )
    return mlp + 2 * fea * fea * d


def _mlp(sizes: list[int], sigmoid_layer: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (n, m) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layer = nn.Linear(n, m, bias=True)
        w = np.random.normal(0.0, np.sqrt(2 / (m + n)), size=(m, n)).astype(np.float32)
        b = np.random.normal(0.0, np.sqrt(1 / m), size=m).astype(np.float32)
        layer.weight.data = torch.tensor(w, requires_grad=True)
        layer.bias.data = torch.tensor(b, requires_grad=True)
        layers.append(layer)
        layers.append(nn.Sigmoid() if i == sigmoid_layer else nn.ReLU())
    return nn.Sequential(*layers)


class ReferenceDLRM(nn.Module):
    """The reference's ``DLRM_Net`` on one device: tables, bottom MLP, dot interaction, top MLP.

    Draws from numpy's global RNG (as the reference does): seed it first for its weights.
    """

    def __init__(self, setup: dict) -> None:
        super().__init__()
        d = setup["bot"][-1]
        self.emb_l = nn.ModuleList()
        for n in setup["ln_emb"]:
            bag = nn.EmbeddingBag(n, d, mode="sum", sparse=True)
            w = np.random.uniform(-np.sqrt(1 / n), np.sqrt(1 / n), size=(n, d)).astype(np.float32)
            bag.weight.data = torch.tensor(w, requires_grad=True)
            self.emb_l.append(bag)
        self.bot_l = _mlp(setup["bot"], -1)
        top = top_sizes(setup)
        self.top_l = _mlp(top, len(top) - 2)

    def interact(self, x: torch.Tensor, ly: list[torch.Tensor]) -> torch.Tensor:
        """x: (B, d), ly: S x (B, d) -> R: (B, d + S(S+1)/2)."""
        batch, d = x.shape
        t = torch.cat([x, *ly], dim=1).view((batch, -1, d))
        z = torch.bmm(t, torch.transpose(t, 1, 2))
        _, ni, nj = z.shape
        li = torch.tensor([i for i in range(ni) for _ in range(i)])
        lj = torch.tensor([j for i in range(nj) for j in range(i)])
        return torch.cat([x, z[:, li, lj]], dim=1)

    def forward(
        self, dense_x: torch.Tensor, offsets: torch.Tensor, indices: list[torch.Tensor]
    ) -> torch.Tensor:
        """dense_x: (B, 13) float32, offsets: (S, B) int64, indices: S x (B,) int64 -> (B, 1)."""
        x = self.bot_l(dense_x)
        ly = [bag(indices[k], offsets[k]) for k, bag in enumerate(self.emb_l)]
        return self.top_l(self.interact(x, ly))


Batch = tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], torch.Tensor]


def random_batches(setup: dict, count: int) -> list[Batch]:
    """``count`` batches like the reference's random generator (``lookups`` indices per
    lookup, fixed; 1 unless the setup says): (dense (B, 13) float32, offsets (S, B) int64,
    indices S x (B * lookups,) int64, targets (B, 1))."""
    bs, k = setup["batch"], setup.get("lookups", 1)
    out = []
    for _ in range(count):
        dense = torch.tensor(np.random.rand(bs, setup["bot"][0]).astype(np.float32))
        idx = [
            torch.from_numpy(np.round(np.random.rand(bs * k) * (n - 1)).astype(np.int64))
            for n in setup["ln_emb"]
        ]
        offs = torch.stack([torch.arange(0, bs * k, k, dtype=torch.int64)] * len(idx))
        target = torch.tensor(np.random.rand(bs, 1).astype(np.float32))
        out.append((dense, offs, idx, target))
    return out


def on_device(b: Batch, device: torch.device) -> Batch:
    """A batch's tensors on ``device`` (the reference's ``dlrm_wrap`` moves them alike)."""
    return (b[0].to(device), b[1].to(device), [i.to(device) for i in b[2]], b[3].to(device))


def require_cuda(what: str) -> None:
    """Refuses ``--device cuda`` where torch sees no GPU: exits 2 saying so."""
    if not torch.cuda.is_available():
        print(
            f"{what} --device cuda: torch {torch.__version__} sees no CUDA GPU (built for CUDA "
            f"{torch.version.cuda or 'none'}); run it on a GPU machine, or with --device cpu",
            file=sys.stderr,
        )
        raise SystemExit(2)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_rate(
    setup: dict, steps: int, warmup: int = 5, loss: str = "bce", device: str = "cpu"
) -> dict:
    """Samples/s of ``steps`` training steps on batches built beforehand (after ``warmup``
    untimed steps), with the model, data and thread settings the reference uses; on ``cuda``
    the model and the batches on the GPU."""
    dev = torch.device(device)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    model = ReferenceDLRM(setup).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = nn.BCELoss(reduction="mean") if loss == "bce" else nn.MSELoss(reduction="mean")
    batches = [on_device(b, dev) for b in random_batches(setup, steps + warmup)]

    def step(b: Batch) -> None:
        opt.zero_grad()
        e = loss_fn(model(b[0], b[1], b[2]), b[3])
        e.detach().cpu().numpy()
        e.backward()
        opt.step()

    for b in batches[:warmup]:
        step(b)
    sync(dev)
    started = time.perf_counter()
    for b in batches[warmup:]:
        step(b)
    sync(dev)
    seconds = time.perf_counter() - started
    return {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "samples_per_s": steps * setup["batch"] / seconds,
        "steps": steps,
        "batch": setup["batch"],
        "loss": loss,
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "params": sum(p.numel() for p in model.parameters()),
        "forward_flops_per_sample": forward_flops_per_sample(setup),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setup", choices=sorted(SETUPS), default="b")
    ap.add_argument("--steps", type=int, default=50, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--loss", choices=["bce", "mse"], default="bce")
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: --use-gpu")
    args = ap.parse_args()
    if args.device == "cuda":
        require_cuda("reference_dlrm.py")
    res = step_rate(SETUPS[args.setup], args.steps, args.warmup, args.loss, args.device)
    if args.json:
        print(json.dumps(res))
        return
    on = f" on {res['device']}" if args.device == "cuda" else ""
    print(
        f"reference DLRM step, setup {args.setup}{on}: {res['samples_per_s']:.0f} samples/s "
        f"({res['steps']} steps x {res['batch']}, {res['loss']} loss, {res['threads']} threads, "
        f"OMP_WAIT_POLICY={res['omp_wait_policy']}, {res['params']} parameters, "
        f"{res['forward_flops_per_sample']} forward FLOPs/sample)"
    )


if __name__ == "__main__":
    main()
