"""The reference DLRM's random input generator (``generate_dist_input_batch``), vectorised.

Per table of ``size`` rows and per sample, a bag of indices:

- bag size: ``num_indices_per_lookup`` when fixed, else ``round(max(1, r * min(size, k)))``
  with r ~ U[0, 1);
- indices: ``uniform``: ``round(r * (size - 1))``; ``gaussian``: N(mu, sigma) clipped to
  [rand_data_min, rand_data_max] (mu = midpoint when -1); duplicates in a bag removed
  (``np.unique``, so a bag is sorted and may shrink).

Dense features are U[0, 1), targets U[0, 1) (rounded when ``round_targets``). The
distributions are the reference's; the random stream is drawn per table in blocks, so it
is not bit-identical to the reference's per-sample draws.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class RandomBatch:
    """dense (B, D) float32; offsets/indices: S x (B,) / (nnz,) int64; targets (B, 1)."""

    dense: torch.Tensor
    offsets: list[torch.Tensor]
    indices: list[torch.Tensor]
    targets: torch.Tensor


def _dedup_rows(vals: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row sorted unique of the first lens[i] entries of vals[i]: -> (values, lengths)."""
    n, k = vals.shape
    big = np.iinfo(np.int64).max
    masked = np.where(np.arange(k)[None, :] < lens[:, None], vals, big)
    masked.sort(axis=1)
    keep = masked != big
    keep[:, 1:] &= masked[:, 1:] != masked[:, :-1]
    return masked[keep], keep.sum(axis=1)


def generate_bags(
    rng: np.random.Generator,
    n: int,
    size: int,
    num_indices_per_lookup: int,
    fixed: bool,
    dist: str = "uniform",
    data_min: float = 1,
    data_max: float = 1,
    mu: float = -1,
    sigma: float = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """One table's bags for n samples -> (indices (nnz,) int64, lengths (n,) int64)."""
    k = int(num_indices_per_lookup)
    if fixed:
        lens = np.full(n, k, dtype=np.int64)
    else:
        r = rng.random(n)
        lens = np.round(np.maximum(1.0, r * min(size, k))).astype(np.int64)
    width = int(lens.max(initial=1))
    if dist == "uniform":
        vals = np.round(rng.random((n, width)) * (size - 1)).astype(np.int64)
    elif dist == "gaussian":
        center = (data_max + data_min) / 2.0 if mu == -1 else mu
        vals = np.clip(rng.normal(center, sigma, (n, width)), data_min, data_max).astype(np.int64)
    else:
        raise ValueError(f"rand_data_dist must be 'uniform' or 'gaussian', got {dist!r}")
    return _dedup_rows(vals, lens)


def generate_batch(
    rng: np.random.Generator,
    m_den: int,
    ln_emb: list[int],
    n: int,
    num_indices_per_lookup: int = 10,
    fixed: bool = False,
    dist: str = "uniform",
    round_targets: bool = False,
    **dist_args: float,
) -> RandomBatch:
    """A batch as the reference's RandomDataset produces it."""
    dense = torch.from_numpy(rng.random((n, m_den)).astype(np.float32))
    offsets, indices = [], []
    for size in ln_emb:
        idx, lens = generate_bags(rng, n, size, num_indices_per_lookup, fixed, dist, **dist_args)
        off = np.zeros(n, dtype=np.int64)
        np.cumsum(lens[:-1], out=off[1:])
        offsets.append(torch.from_numpy(off))
        indices.append(torch.from_numpy(idx))
    t = rng.random((n, 1)).astype(np.float32)
    if round_targets:
        t = np.round(t)
    return RandomBatch(dense, offsets, indices, torch.from_numpy(t))
