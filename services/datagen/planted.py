"""A streaming data generator with a planted ground truth (``streamrec-datagen``).

A hidden model gives every sample its click probability, so the best AUC any model can
reach on a pass is known (the AUC of the true probabilities against the drawn labels)::

    logit = bias + sum_s w_s[id_s] + v . log1p(I) + sum_(a,b) u_a[id_a] . u_b[id_b]
    p_true = sigmoid(logit),  label ~ Bernoulli(p_true)

Ids of each slot are drawn from a Zipf-like popularity over ranks; the rank -> id map
drifts every day (a share ``drift`` of the popular ranks moves to ids never seen before),
so a model that stops learning falls behind: online training matters. Keys are 63-bit
hashes of (slot, id), written in decimal.

Lines are in the trainer's ``generated`` format (see :mod:`streamrec.trainer.data.reader`)::

    label  p_true  I1..I13  C1..C{slots}

and land in PaddleRec's streaming layout with a donefile per split, written after the
split's files, optionally paced at ``--rate`` splits per second::

    streamrec-datagen --out data --start-day 20190720 --days 2 --split-interval 360 \\
        --samples-per-split 20000 --slots 8

``--from-criteo FILE [FILE ...]`` lays real Criteo files into the same layout instead
(:mod:`.criteo_layout`, with its own flags), ``--from-events LOG [LOG ...]``
timestamped event logs, each event in the split of its time
(:mod:`.event_layout`), and ``--random`` the reference
DLRM's random data (:func:`.randgen.lay_out_random`, the reference's flag
names). Both say, on stderr and in ``--job-out FILE``, the trainer config lines that train
exactly what they laid out (``end_day`` and ``end_split`` at its last split).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from streamrec.datagen.split_files import write_split
from streamrec.datagen.text_lines import to_generated_text
from streamrec.keyhash import mix64
from streamrec.layout import format_day, parse_day, split_names


@dataclass
class StreamParams:
    """Knobs of the planted stream (CLI flags of the same names)."""

    slots: int = 26
    vocab: int = 2000
    zipf: float = 1.05
    drift: float = 0.1
    emb_dim: int = 4
    pairs: int = 4
    weight_scale: float = 0.8
    dense_scale: float = 0.15
    bias: float = -1.2
    empty_share: float = 0.0
    seed: int = 7


class PlantedStream:
    """The hidden model and the drifting popularity; ``draw(day, n)`` makes samples.

    Ids are integers per slot, unbounded across days (drift adds fresh ones); the truth's
    per-id parameters come from a hash of (slot, id), so they never change and need no
    table.
    """

    def __init__(self, params: StreamParams, start_day: str) -> None:
        self.p = params
        self.start = parse_day(start_day)
        rng = np.random.default_rng(params.seed)
        self.dense_w = rng.normal(0, params.dense_scale, 13)
        pair_slots = (
            rng.choice(params.slots, size=(params.pairs, 2))
            if params.slots > 1
            else (np.zeros((0, 2), dtype=np.int64))
        )
        self.pair_slots = [(int(a), int(b)) for a, b in pair_slots if a != b]
        ranks = np.arange(params.vocab, dtype=np.float64)
        pr = 1.0 / (ranks + 1.0) ** params.zipf
        self.cdf = np.cumsum(pr / pr.sum())
        self._maps: dict[int, np.ndarray] = {}

    def rank_map(self, day_index: int) -> np.ndarray:
        """(slots, vocab) int64: the id at each popularity rank on that day."""
        if day_index in self._maps:
            return self._maps[day_index]
        v, s = self.p.vocab, self.p.slots
        if day_index == 0:
            m = np.tile(np.arange(v, dtype=np.int64), (s, 1))
        else:
            m = self.rank_map(day_index - 1).copy()
            rng = np.random.default_rng([self.p.seed, day_index])
            moved = int(round(self.p.drift * v))
            for slot in range(s):  # per slot (a few dozen), never per id
                at = rng.choice(v, size=moved, replace=False)
                m[slot, at] = v * (day_index + 1) + np.arange(moved)  # ids never seen before
        self._maps[day_index] = m
        return m

    def _hash_normal(self, slot: int, ids: np.ndarray, salt: int, dim: int = 1) -> np.ndarray:
        """Deterministic N(0, 1)-ish values per (slot, id): (n, dim) float64."""
        out = np.empty((ids.size, dim))
        for k in range(dim):
            h = mix64(ids * np.int64(4099) + np.int64((salt * 64 + k) * 1000003 + slot))
            u1 = ((h >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
            h2 = mix64(h.view(np.int64))
            u2 = ((h2 >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
            out[:, k] = np.sqrt(-2 * np.log(u1)) * np.cos(2 * np.pi * u2)
        return out

    def keys_of(self, slot: int, ids: np.ndarray) -> np.ndarray:
        """Feature keys (n,) int64 >= 0 for ids of a slot."""
        return (mix64(ids * np.int64(64) + np.int64(slot)) >> np.uint64(1)).view(np.int64)

    def draw(self, day: str, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """n samples of a day: label (n,), ptrue (n,), ints (n, 13), keys (n, S), empty."""
        p = self.p
        day_index = (parse_day(day) - self.start).days
        rmap = self.rank_map(max(0, day_index))
        ranks = np.minimum(np.searchsorted(self.cdf, rng.random((n, p.slots))), p.vocab - 1)
        ids = rmap[np.arange(p.slots)[None, :], ranks]
        ints = np.floor(np.expm1(rng.gamma(1.5, 1.2, (n, 13)))).astype(np.int64)
        logit = p.bias + np.log1p(ints) @ self.dense_w - self.dense_w.sum()
        emb: dict[int, np.ndarray] = {}
        for s in range(p.slots):
            logit += p.weight_scale * self._hash_normal(s, ids[:, s], 1)[:, 0]
        for a, b in self.pair_slots:
            for s in (a, b):
                if s not in emb:
                    emb[s] = self._hash_normal(s, ids[:, s], 2, p.emb_dim)
            logit += (emb[a] * emb[b]).sum(axis=1) * (p.weight_scale / np.sqrt(p.emb_dim))
        ptrue = 1.0 / (1.0 + np.exp(-logit))
        ptrue = np.round(ptrue * 1e6) / 1e6
        label = (rng.random(n) < ptrue).astype(np.int64)
        keys = np.stack([self.keys_of(s, ids[:, s]) for s in range(p.slots)], axis=1)
        empty = rng.random((n, p.slots)) < p.empty_share if p.empty_share > 0 else None
        return {"label": label, "ptrue": ptrue, "ints": ints, "keys": keys, "empty": empty}


def generate(
    out: str | Path,
    start_day: str,
    days: int,
    split_interval: int,
    samples_per_split: int,
    files_per_split: int = 1,
    params: StreamParams | None = None,
    donefile: str | None = "to.hadoop.done",
    rate: float = 0.0,
    max_splits: int | None = None,
) -> dict[str, int]:
    """Writes ``days`` days of the planted stream under ``out``; returns counts."""
    params = params or StreamParams()
    stream = PlantedStream(params, start_day)
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    (root / "datagen.json").write_text(
        json.dumps(
            {
                "start_day": start_day,
                "days": days,
                "split_interval": split_interval,
                "samples_per_split": samples_per_split,
                **asdict(params),
            },
            indent=1,
        )
    )
    splits = samples = 0
    first = parse_day(start_day)
    for d in range(days):
        day = format_day(first + dt.timedelta(days=d))
        for split in split_names(split_interval):
            if max_splits is not None and splits >= max_splits:
                return {"splits": splits, "samples": samples}
            started = time.monotonic()
            rng = np.random.default_rng([params.seed, d, int(split)])
            drawn = stream.draw(day, samples_per_split, rng)
            bounds = np.linspace(0, samples_per_split, files_per_split + 1).astype(int)
            parts = [
                to_generated_text({k: (None if v is None else v[a:b]) for k, v in drawn.items()})
                for a, b in zip(bounds[:-1], bounds[1:], strict=True)
            ]
            write_split(root / day / split, parts, donefile)
            splits += 1
            samples += samples_per_split
            if rate > 0:
                time.sleep(max(0.0, 1.0 / rate - (time.monotonic() - started)))
    return {"splits": splits, "samples": samples}
