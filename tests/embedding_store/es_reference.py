"""A plain-numpy reference of the sparse table semantics (PaddleRec's), for the library tests.

Slow and obvious on purpose: one Python dict entry per key, float64 math.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from streamrec.embedding_store import SgdRuleParam, TableOptions


def init_state(rule: SgdRuleParam, d: int) -> np.ndarray:
    if rule.name == "SparseNaiveSGDRule" or d == 0:
        return np.zeros(0)
    if rule.name == "SparseAdaGradSGDRule":
        return np.zeros(1)
    if rule.name in ("StdAdaGradSGDRule", "TorchAdaGradSGDRule"):
        return np.zeros(d)
    st = np.zeros(2 * d + 2)
    st[2 * d], st[2 * d + 1] = rule.beta1, rule.beta2
    return st


def apply_rule(w: np.ndarray, st: np.ndarray, g: np.ndarray, rule: SgdRuleParam) -> None:
    """One step in place; w, g: (d,), st: the rule's state."""
    d = w.size
    if d == 0:
        return
    lo, hi = rule.weight_bounds
    lr = rule.learning_rate
    if rule.name == "SparseNaiveSGDRule":
        w -= lr * g
    elif rule.name == "SparseAdaGradSGDRule":
        w -= lr * np.sqrt(rule.initial_g2sum / (rule.initial_g2sum + st[0])) * g
        st[0] += np.mean(g * g)
    elif rule.name == "StdAdaGradSGDRule":
        w -= lr * np.sqrt(rule.initial_g2sum / (rule.initial_g2sum + st[:d])) * g
        st[:d] += g * g
    elif rule.name == "TorchAdaGradSGDRule":
        st[:d] += g * g
        w -= lr * g / (np.sqrt(st[:d]) + rule.epsilon)
    else:
        gsum, g2sum = st[:d], st[d : 2 * d]
        b1p, b2p = st[2 * d], st[2 * d + 1]
        alr = lr * np.sqrt(1 - b2p) / (1 - b1p)
        gsum[:] = rule.beta1 * gsum + (1 - rule.beta1) * g
        g2sum[:] = rule.beta2 * g2sum + (1 - rule.beta2) * g * g
        w -= alr * gsum / (np.sqrt(g2sum) + rule.epsilon)
        st[2 * d] *= rule.beta1
        st[2 * d + 1] *= rule.beta2
    np.clip(w, lo, hi, out=w)


@dataclass
class Row:
    w: np.ndarray
    st_embed: np.ndarray
    st_embedx: np.ndarray
    show: float = 0.0
    click: float = 0.0
    unseen: float = 0.0
    expanded: bool = False
    dirty: bool = True
    extra: dict = field(default_factory=dict)


class RefTable:
    """Reference table. ``initial(keys, expanded) -> (n, dim)`` gives initial weights."""

    def __init__(self, o: TableOptions, initial: Callable[[np.ndarray, bool], np.ndarray]) -> None:
        self.o = o
        self.initial = initial
        self.rows: dict[int, Row] = {}

    def score(self, r: Row) -> float:
        return self.o.nonclk_coeff * (r.show - r.click) + self.o.click_coeff * r.click

    def _create(self, key: int) -> Row:
        expand = self.o.score(0.0, 0.0) >= self.o.embedx_threshold
        w = self.initial(np.array([key]), expand)[0].astype(np.float64)
        r = Row(
            w,
            init_state(self.o.embed_sgd_param, 1),
            init_state(self.o.embedx_sgd_param, self.o.dim - 1),
            expanded=expand,
        )
        self.rows[key] = r
        return r

    def pull(self, keys: np.ndarray, create: bool = True) -> np.ndarray:
        out = np.zeros((keys.size, self.o.dim))
        for i, k in enumerate(keys.tolist()):
            r = self.rows.get(k)
            if r is None and create:
                r = self._create(k)
            if r is not None:
                out[i] = r.w
        return out

    def push(
        self,
        keys: np.ndarray,
        grads: np.ndarray,
        shows: np.ndarray | None = None,
        clicks: np.ndarray | None = None,
    ) -> None:
        n = keys.size
        shows = np.ones(n) if shows is None else shows
        clicks = np.zeros(n) if clicks is None else clicks
        agg: dict[int, list] = {}
        for i, k in enumerate(keys.tolist()):
            a = agg.setdefault(k, [np.zeros(self.o.dim), 0.0, 0.0])
            a[0] = a[0] + grads[i]
            a[1] += float(shows[i])
            a[2] += float(clicks[i])
        for k, (g, s, c) in agg.items():
            r = self.rows.get(k) or self._create(k)
            r.show += s
            r.click += c
            r.unseen = 0.0
            r.dirty = True
            apply_rule(r.w[:1], r.st_embed, g[:1], self.o.embed_sgd_param)
            if r.expanded:
                apply_rule(r.w[1:], r.st_embedx, g[1:], self.o.embedx_sgd_param)
            elif self.score(r) >= self.o.embedx_threshold:
                r.w[1:] = self.initial(np.array([k]), True)[0, 1:]
                r.expanded = True

    def advance_day(self) -> None:
        for r in self.rows.values():
            r.unseen += 1

    def shrink(self) -> int:
        gone = []
        for k, r in self.rows.items():
            r.show *= self.o.show_click_decay_rate
            r.click *= self.o.show_click_decay_rate
            too_old = r.unseen > self.o.delete_after_unseen_days
            if self.score(r) < self.o.delete_threshold or too_old:
                gone.append(k)
        for k in gone:
            del self.rows[k]
        return len(gone)

    def select(self, mode: str) -> set[int]:
        """Keys a save mode takes; base/delta clear the changed flags."""
        if mode in ("checkpoint", "batch"):
            return set(self.rows)
        if mode == "base":
            out = {k for k, r in self.rows.items() if self.score(r) >= self.o.base_threshold}
        else:
            out = {
                k
                for k, r in self.rows.items()
                if r.dirty
                and self.score(r) >= self.o.delta_threshold
                and r.unseen <= self.o.delta_keep_days
            }
        for r in self.rows.values():
            r.dirty = False
        return out
