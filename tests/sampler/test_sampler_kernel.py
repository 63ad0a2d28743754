"""The compiled put_back=True draw (``streamrec.sampler._C.sample_put_back``).

Checked directly and through :meth:`NegativeTable.sample`: frequencies against the weights
(chi-square), the conflict guarantees, the slots it leaves to the exact fallback, and that a
seed gives the same ids on any thread count.
"""

import numpy as np
import pytest
import torch
from scipy import stats
from streamrec.sampler import _C
from streamrec.sampler.alias import AliasTable, pack_slots
from streamrec.sampler.columns import to_columns
from streamrec.sampler.table import NegativeTable, Tags

TAGS = Tags("cat", "item", "w", "skey")


def make_table(ids, cats, weights):
    cols = {"item": ids, "cat": cats, "w": weights, "skey": [""] * len(ids)}
    return NegativeTable(to_columns(cols), TAGS)


def kernel_args(at: AliasTable, ids: np.ndarray, group, cnts, own_ids=None, banned=None):
    """Arguments of a direct kernel call; ``ids`` (n,) int64 is the id of each table row."""
    offsets = np.zeros(len(group) + 1, np.int64)
    np.cumsum(cnts, out=offsets[1:])
    return dict(
        slots=torch.from_numpy(pack_slots(at, ids.take(at.row))),
        start=torch.from_numpy(at.start),
        count=torch.from_numpy(at.count),
        group=torch.tensor(group, dtype=torch.int64),
        offsets=torch.from_numpy(offsets),
        own_ids=None if own_ids is None else torch.tensor(own_ids, dtype=torch.int64),
        banned=None if banned is None else torch.from_numpy(banned),
    )


def skewed_table(seed: int = 0, items: int = 3000, cats: int = 7):
    rng = np.random.default_rng(seed)
    ids = rng.permutation(items).astype(np.int64) * 7919 + 11
    cat = rng.integers(0, cats, items)
    weights = rng.pareto(1.2, items) + 1e-3
    weights[rng.random(items) < 0.05] = 0.0  # some items are never drawn
    return ids, cat, weights


def test_packed_records_match_the_alias_arrays():
    ids, cat, weights = skewed_table()
    at = AliasTable.build(cat, weights)
    rec = pack_slots(at, ids.take(at.row))
    assert rec.shape == (len(at.row), 4) and rec.dtype == np.int64
    assert (rec[:, 0] == np.ceil(at.prob * 2.0**53)).all()
    # the integer test f < threshold is the float test f * 2**-53 < prob for every f
    f = np.array([0, 1, 2**52, 2**53 - 1], np.int64)
    for thr, prob in zip(rec[:50, 0], at.prob[:50], strict=True):
        assert ((f < thr) == (f * 2.0**-53 < prob)).all()
        near = np.clip(np.array([thr - 1, thr, thr + 1]), 0, 2**53 - 1)
        assert ((near < thr) == (near * 2.0**-53 < prob)).all()
    assert (rec[:, 1] == at.alias).all()
    assert (rec[:, 2] == ids.take(at.row)).all()
    assert (rec[:, 3] == ids.take(at.row.take(at.alias))).all()


def test_kernel_frequencies_match_weights_chi_square():
    # One positive per category, own id excluded: item j of category c is drawn with
    # probability w_j / (W_c - w_own) for j != own.
    ids, cat, weights = skewed_table(1, items=600, cats=3)
    at = AliasTable.build(cat, weights)
    own_rows = np.array([int(np.flatnonzero((cat == c) & (weights > 0))[0]) for c in range(3)])
    n = 60_000
    ids_t, left, rounds = _C.sample_put_back(
        **kernel_args(at, ids, [0, 1, 2], [n] * 3, own_ids=ids[own_rows]),
        seed=123,
        max_rounds=16,
        missing_id=-1,
    )
    assert int(left.sum()) == 0 and 1 <= rounds <= 16
    got = ids_t.numpy().reshape(3, n)
    for c in range(3):
        assert ids[own_rows[c]] not in got[c]
        allowed = np.flatnonzero((cat == c) & (weights > 0))
        allowed = allowed[allowed != own_rows[c]]
        expected = weights[allowed] / weights[allowed].sum() * n
        # observed[j]: draws of allowed item j (ids sorted -> position by binary search)
        order_ids = np.argsort(ids[allowed])
        j = order_ids[np.searchsorted(ids[allowed], got[c], sorter=order_ids)]
        assert (ids[allowed][j] == got[c]).all()
        observed = np.bincount(j, minlength=len(allowed))
        # Pool the rarest items so every cell expects at least 5 draws.
        order = np.argsort(expected)
        small = np.cumsum(expected[order]) < 50
        big = order[~small]
        obs = np.r_[observed[big], observed[order[small]].sum()]
        exp = np.r_[expected[big], expected[order[small]].sum()]
        assert stats.chisquare(obs, exp).pvalue > 1e-4


def test_table_sample_frequencies_with_avoid_all_chi_square():
    # Through NegativeTable.sample: the batch's ids are never drawn, the rest in proportion.
    table = make_table(np.arange(10), np.zeros(10, np.int64), np.arange(1.0, 11.0))
    rng = np.random.default_rng(3)
    pos = np.array([0, 3, 9])
    res = table.sample(pos, np.zeros(3, np.int64), np.full(3, 20_000), avoid_all=True, rng=rng)
    assert res.unfilled == 0
    counts = np.bincount(res.ids, minlength=10)
    assert counts[pos].sum() == 0
    allowed = np.setdiff1d(np.arange(10), pos)
    w = allowed + 1.0
    assert stats.chisquare(counts[allowed], w / w.sum() * 60_000).pvalue > 1e-4


def test_own_id_never_returned_even_when_it_holds_almost_all_weight():
    # The own item holds ~all weight: tries run out, the fallback finishes exactly.
    weights = np.array([1e9, 1.0, 2.0, 3.0, 1e9, 1.0])
    table = make_table(np.arange(6), np.array([0, 0, 0, 0, 1, 1]), weights)
    rng = np.random.default_rng(4)
    pos = np.array([0] * 50 + [4] * 50)
    cats = np.array([0] * 50 + [1] * 50)
    res = table.sample(pos, cats, np.full(100, 40), max_rounds=4, rng=rng)
    got = res.ids.reshape(100, 40)
    assert res.unfilled == 0 and res.rounds == 4 and res.fallback_positives == 100
    assert not (got[:50] == 0).any() and set(np.unique(got[:50])) <= {1, 2, 3}
    assert (got[50:] == 5).all()  # category 1's only other item
    counts = np.bincount(got[:50].ravel(), minlength=4)[1:]
    assert stats.chisquare(counts, np.array([1, 2, 3]) / 6 * 2000).pvalue > 1e-4


def test_left_slots_sit_at_the_tail_with_missing_id():
    ids = np.array([10, 11, 12], np.int64)
    at = AliasTable.build(np.zeros(3, np.int64), np.array([1e12, 1.0, 1.0]))
    # max_rounds=1 and the own item holds ~all weight: nearly every try conflicts.
    ids_t, left, rounds = _C.sample_put_back(
        **kernel_args(at, ids, [0, -1, 0], [50, 4, 0], own_ids=[10, 10, 10]),
        seed=9,
        max_rounds=1,
        missing_id=-5,
    )
    got, left = ids_t.numpy(), left.numpy()
    assert rounds == 1 and left[1] == 4 and left[2] == 0 and left[0] > 40
    first = got[:50]
    assert (first[50 - left[0] :] == -5).all()  # tail left for the fallback
    assert set(first[: 50 - left[0]]) <= {11, 12}
    assert (got[50:54] == -5).all()  # unknown group: every slot left


def test_unfilled_counted_by_slot_not_by_value():
    # missing_id equal to a real id must not be mistaken for an unfilled slot.
    table = make_table(np.array([1, 2, 3]), np.array([0, 0, 1]), np.array([1.0, 1.0, 1.0]))
    rng = np.random.default_rng(5)
    res = table.sample(
        np.array([1, 3, 9]), np.array([0, 1, 7]), np.array([5, 4, 3]), missing_id=2, rng=rng
    )
    assert (res.ids[:5] == 2).all()  # the only item of category 0 besides the own one
    assert (res.ids[5:] == 2).all()  # category 1 has only the own item; 7 is unknown
    assert res.unfilled == 7


def test_same_seed_same_ids_on_any_thread_count():
    ids, cat, weights = skewed_table(6, items=5000, cats=20)
    at = AliasTable.build(cat, weights)
    rng = np.random.default_rng(6)
    b = 3000
    group = rng.integers(-1, at.num_groups, b)
    cnts = rng.integers(0, 60, b)
    own = ids[rng.integers(0, len(ids), b)]
    args = kernel_args(at, ids, group, cnts, own_ids=own)
    runs = [
        _C.sample_put_back(**args, seed=77, max_rounds=8, missing_id=-1, threads=t)
        for t in (1, 2, 3, 0)
    ]
    for got in runs[1:]:
        assert torch.equal(got[0], runs[0][0]) and torch.equal(got[1], runs[0][1])
        assert got[2] == runs[0][2]
    other = _C.sample_put_back(**args, seed=78, max_rounds=8, missing_id=-1, threads=2)
    assert not torch.equal(other[0], runs[0][0])
    table = make_table(ids, cat, weights)
    pos = ids[rng.integers(0, len(ids), 500)]
    pcat = cat[rng.integers(0, len(ids), 500)]
    a = table.sample(pos, pcat, np.full(500, 30), rng=np.random.default_rng(8))
    c = table.sample(pos, pcat, np.full(500, 30), rng=np.random.default_rng(8))
    assert (a.ids == c.ids).all()


def test_kernel_refuses_bad_arguments_naming_them():
    ids = np.arange(4, dtype=np.int64)
    at = AliasTable.build(np.zeros(4, np.int64), np.ones(4))
    good = kernel_args(at, ids, [0, 0], [2, 2])
    run = dict(seed=1, max_rounds=4, missing_id=-1)
    with pytest.raises(RuntimeError, match=r"group\[1\] = 5"):
        _C.sample_put_back(**{**good, "group": torch.tensor([0, 5])}, **run)
    with pytest.raises(RuntimeError, match="offsets must not decrease"):
        _C.sample_put_back(**{**good, "offsets": torch.tensor([0, 3, 2])}, **run)
    with pytest.raises(RuntimeError, match="group must be a contiguous"):
        _C.sample_put_back(**{**good, "group": torch.tensor([0.0, 0.0])}, **run)
    with pytest.raises(RuntimeError, match="not both"):
        _C.sample_put_back(
            **{
                **good,
                "own_ids": torch.zeros(2, dtype=torch.int64),
                "banned": torch.zeros(4, dtype=torch.bool),
            },
            **run,
        )
    with pytest.raises(RuntimeError, match="max_rounds must be >= 1"):
        _C.sample_put_back(**good, seed=1, max_rounds=0, missing_id=-1)


def test_empty_batch_and_table_without_drawable_items():
    table = make_table(np.array([1, 2]), np.array([0, 0]), np.array([0.0, 0.0]))
    rng = np.random.default_rng(10)
    res = table.sample(np.array([1]), np.array([0]), np.array([3]), missing_id=-9, rng=rng)
    assert (res.ids == -9).all() and res.unfilled == 3
    res = table.sample(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), rng=rng)
    assert res.ids.shape == (0,) and res.unfilled == 0


def test_group_lookup_dense_and_sparse_keys_agree():
    rng = np.random.default_rng(11)
    weights = rng.random(400) + 0.1
    for keys in (rng.integers(0, 50, 400), rng.integers(-(1 << 40), 1 << 40, 400)):
        at = AliasTable.build(keys, weights)
        assert (at.dense_group is not None) == (keys.min() >= 0)
        queries = np.r_[keys[:100], rng.integers(-100, 100, 100), np.int64(1) << 62]
        pos = np.searchsorted(at.keys, queries).clip(0, at.num_groups - 1)
        expected = np.where(at.keys[pos] == queries, pos, -1)
        assert (at.group_of(queries) == expected).all()
