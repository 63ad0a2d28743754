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

``streamrec-datagen --random`` lays such samples into the streaming layout
(:func:`lay_out_random`): one index per table (the layout's lines hold one key a slot, so
``--num-indices-per-lookup`` is 1), 13 dense features, rounded targets.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from streamrec.datagen.layout_flags import add_job_out_flag, check_layout_flags, say_job
from streamrec.datagen.split_files import split_at, write_split
from streamrec.datagen.text_lines import to_generated_text


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


#: The reference's defaults for its flags, where the streaming layout can carry them.
DEFAULT_EMBEDDING_SIZES = "4-3-2"


def random_lines(
    rng: np.random.Generator,
    n: int,
    ln_emb: list[int],
    dist: str = "uniform",
    **dist_args: float,
) -> bytes:
    """n samples of the reference's random data as lines of the trainer's ``generated``
    format: label (the reference's target, rounded: 0 or 1), p_true 0.5 (labels are
    independent of the features, so 0.5 AUC is the best any model can reach), 13 dense
    features (the reference's U[0, 1) as integers ``floor(2**16 * u)``: the format holds
    integers, the trainer reads log(1 + x)), one index per table (decimal, in [0, size))."""
    dense = rng.random((n, 13))
    keys = np.empty((n, len(ln_emb)), dtype=np.int64)
    for j, size in enumerate(ln_emb):
        idx, _ = generate_bags(rng, n, size, 1, True, dist, **dist_args)
        keys[:, j] = idx
    labels = np.round(rng.random(n)).astype(np.int64)
    return to_generated_text(
        {
            "label": labels,
            "ptrue": np.full(n, 0.5),
            "ints": np.floor(dense * (1 << 16)).astype(np.int64),
            "keys": keys,
        }
    )


def lay_out_random(
    out: str | Path,
    start_day: str,
    split_interval: int,
    samples_per_split: int,
    data_size: int,
    ln_emb: list[int],
    files_per_split: int = 1,
    donefile: str | None = "to.hadoop.done",
    seed: int = 123,
    dist: str = "uniform",
    **dist_args: float,
) -> dict[str, int | str]:
    """``data_size`` random samples laid into consecutive splits of ``samples_per_split``
    (the last holds the rest) under ``out``, a donefile after each split's files. Split i
    draws from ``numpy.random.default_rng([seed, i])``: the same flags give the same files.

    Returns:
        counts: splits, lines, start_day, end_day, last_split, last_split_lines (those of
        ``criteo_layout.lay_out_criteo``).
    """
    if data_size < 1 or samples_per_split < 1 or files_per_split < 1 or not ln_emb:
        raise ValueError(
            f"data_size, samples_per_split, files_per_split must be >= 1 and ln_emb not "
            f"empty, got {data_size}, {samples_per_split}, {files_per_split}, {ln_emb}"
        )
    root = Path(out)
    splits = lines = n = 0
    day = split = ""
    while lines < data_size:
        day, split = split_at(start_day, split_interval, splits)
        split_dir = root / day / split
        if split_dir.is_dir() and any(split_dir.iterdir()):
            raise FileExistsError(
                f"{split_dir} already holds files: lay data out into an empty directory"
            )
        n = min(samples_per_split, data_size - lines)
        rng = np.random.default_rng([seed, splits])
        bounds = np.linspace(0, n, files_per_split + 1).astype(int)
        parts = [
            random_lines(rng, int(b - a), ln_emb, dist, **dist_args)
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        write_split(split_dir, parts, donefile)
        splits += 1
        lines += n
    return {
        "splits": splits,
        "lines": lines,
        "start_day": start_day,
        "end_day": day,
        "last_split": split,
        "last_split_lines": n,
    }


def main_random(argv: list[str]) -> int:
    """``streamrec-datagen --random``: the reference DLRM's random data (its flag names)
    laid into the streaming layout (:func:`.randgen.lay_out_random`)."""
    ap = argparse.ArgumentParser(
        prog="streamrec-datagen --random",
        description="The reference DLRM's random data (dlrm_s_pytorch.py --data-generation "
        "random) laid into OUT/YYYYMMDD/HHMM/part-* with a donefile per split, in the "
        "trainer's generated format (p_true 0.5: the labels carry no signal).",
    )
    ap.add_argument("--random", action="store_true", required=True)
    ap.add_argument("--out", required=True, help="data root (train_data_dir)")
    ap.add_argument("--start-day", required=True, help="YYYYMMDD of the first split")
    ap.add_argument("--split-interval", type=int, default=60, help="minutes per split")
    ap.add_argument("--samples-per-split", type=int, default=10000, help="samples per split")
    ap.add_argument("--files-per-split", type=int, default=1)
    ap.add_argument("--donefile", default="to.hadoop.done", help="'' for none")
    # the reference's names
    ap.add_argument("--data-size", type=int, default=None, help="samples in all")
    ap.add_argument("--num-batches", type=int, default=0, help="with --mini-batch-size")
    ap.add_argument("--mini-batch-size", type=int, default=1)
    ap.add_argument("--arch-embedding-size", default=DEFAULT_EMBEDDING_SIZES)
    ap.add_argument("--arch-mlp-bot", default="13-512-256-64-16")
    ap.add_argument("--num-indices-per-lookup", type=int, default=1)
    ap.add_argument("--num-indices-per-lookup-fixed", action="store_true")
    ap.add_argument("--rand-data-dist", choices=["uniform", "gaussian"], default="uniform")
    ap.add_argument("--rand-data-min", type=float, default=0)
    ap.add_argument("--rand-data-max", type=float, default=1)
    ap.add_argument("--rand-data-mu", type=float, default=-1)
    ap.add_argument("--rand-data-sigma", type=float, default=1)
    ap.add_argument("--numpy-rand-seed", type=int, default=123)
    add_job_out_flag(ap)
    args = ap.parse_args(argv)
    check_layout_flags(ap, args, ("data_size",))
    try:
        ln_emb = [int(v) for v in args.arch_embedding_size.split("-")]
        bot = [int(v) for v in args.arch_mlp_bot.split("-")]
    except ValueError:
        ap.error(
            f"--arch-embedding-size {args.arch_embedding_size!r} / --arch-mlp-bot "
            f"{args.arch_mlp_bot!r}: must look like 4-3-2"
        )
    if any(n < 1 or n > 1 << 62 for n in ln_emb):
        ap.error(f"--arch-embedding-size {args.arch_embedding_size!r}: sizes must be >= 1")
    if bot[0] != 13:
        ap.error(
            f"--arch-mlp-bot {args.arch_mlp_bot!r}: must start with 13 (a line holds 13 "
            "dense features)"
        )
    if args.num_indices_per_lookup != 1:
        ap.error(
            f"--num-indices-per-lookup {args.num_indices_per_lookup}: must be 1 (a line "
            "holds one key a slot)"
        )
    size = args.data_size
    if args.num_batches > 0:
        size = args.num_batches * args.mini_batch_size
    if size is None:
        ap.error("give --data-size N (or --num-batches with --mini-batch-size)")
    try:
        counts = lay_out_random(
            args.out,
            args.start_day,
            args.split_interval,
            args.samples_per_split,
            size,
            ln_emb,
            args.files_per_split,
            args.donefile or None,
            args.numpy_rand_seed,
            args.rand_data_dist,
            data_min=args.rand_data_min,
            data_max=args.rand_data_max,
            mu=args.rand_data_mu,
            sigma=args.rand_data_sigma,
        )
    except FileExistsError as exc:
        ap.error(f"--out: {exc}")
    print(json.dumps(counts))
    say_job(args, counts, "generated", len(ln_emb))
    return 0
