"""Unit tests of the pure sampling core (alias tables, table validation, sampling rules).

The service itself is tested over real sockets in test_service.py; here the logic is
checked in-process, exhaustively and exactly where possible.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from streamrec.sampler.alias import AliasTable
from streamrec.sampler.columns import Column, to_columns
from streamrec.sampler.errors import BadTable
from streamrec.sampler.table import NegativeTable, Tags

TAGS = Tags("cat", "item", "w", "skey")


def make_table(ids, cats, weights, extra=None):
    cols = {"item": ids, "cat": cats, "w": weights, "skey": [""] * len(ids)}
    cols.update(extra or {})
    return NegativeTable(to_columns(cols), TAGS)


def implied_vs_exact(at: AliasTable) -> float:
    groups = np.repeat(np.arange(at.num_groups), at.count)
    exact = at.weight / at.total[groups]
    return float(np.abs(at.probabilities() - exact).max())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 6), st.floats(0, 1e6, allow_nan=False)), min_size=1, max_size=200
    )
)
def test_alias_tables_give_exactly_the_weights(rows):
    groups = np.array([g for g, _ in rows], np.int64)
    weights = np.array([w for _, w in rows], np.float64)
    at = AliasTable.build(groups, weights)
    assert len(at.row) == int((weights > 0).sum())
    if len(at.row):
        assert implied_vs_exact(at) < 1e-9
        groups_of_slot = np.repeat(np.arange(at.num_groups), at.count)
        assert (groups_of_slot[at.alias] == groups_of_slot).all()  # alias stays in the group
        assert ((at.prob >= 0) & (at.prob <= 1)).all()


def test_alias_tables_exact_with_tied_running_sums():
    # Found by hypothesis: equal deficits and excesses make the two merge-searches compare
    # equal floats, which must break ties the same way.
    at = AliasTable.build(np.zeros(6, np.int64), np.array([1.0, 1, 1, 3927, 3927, 3927]))
    assert implied_vs_exact(at) < 1e-12
    rng = np.random.default_rng(12)
    for _ in range(300):
        n = int(rng.integers(1, 40))
        weights = rng.choice([0.0, 0.5, 1.0, 3.0, 3927.0, 1e6], n)
        at = AliasTable.build(rng.integers(0, 3, n), weights)
        if len(at.row):
            assert implied_vs_exact(at) < 1e-9


def test_alias_large_skewed_table_is_exact():
    rng = np.random.default_rng(0)
    n = 200_000
    at = AliasTable.build(rng.integers(0, 500, n), rng.pareto(1.1, n))
    assert implied_vs_exact(at) < 1e-9


def test_draw_frequencies_match_weights_chi_square():
    rng = np.random.default_rng(1)
    weights = np.array([1.0, 2.0, 3.0, 4.0, 0.0, 10.0])
    at = AliasTable.build(np.zeros(6, np.int64), weights)
    slots = at.draw(np.zeros(200_000, np.int64), rng)
    counts = np.bincount(at.row[slots], minlength=6)
    assert counts[4] == 0  # weight 0 never drawn
    expected = weights / weights.sum() * len(slots)
    keep = weights > 0
    assert stats.chisquare(counts[keep], expected[keep]).pvalue > 1e-4


def table_16():
    # 4 categories x 4 items: ids 100 + 10*cat + j, weights 1..4
    ids = np.array([100 + 10 * c + j for c in range(4) for j in range(4)], np.int64)
    cats = np.repeat(np.arange(4), 4)
    weights = np.tile(np.arange(1, 5, dtype=np.float64), 4)
    return make_table(ids, cats, weights), ids, cats


def test_sample_respects_category_and_avoids_own_id():
    table, ids, cats = table_16()
    rng = np.random.default_rng(2)
    pos = np.array([100, 111, 122, 133, 100], np.int64)
    pcat = np.array([0, 1, 2, 3, 0])
    cnts = np.array([50, 50, 50, 50, 0])
    res = table.sample(pos, pcat, cnts, rng=rng)
    assert res.ids.shape == (200,) and res.unfilled == 0
    for i in range(4):
        got = res.ids[50 * i : 50 * (i + 1)]
        assert set((got - 100) // 10) == {pcat[i]}
        assert pos[i] not in got


def test_avoid_all_dedup_ids_never_returns_any_batch_id():
    table, ids, cats = table_16()
    rng = np.random.default_rng(3)
    pos = np.array([100, 101, 102], np.int64)  # three of category 0's four items
    res = table.sample(pos, np.zeros(3, np.int64), np.array([20, 20, 20]), avoid_all=True, rng=rng)
    assert (res.ids == 103).all()  # the only allowed item


def test_put_back_false_gives_distinct_items_and_handles_small_categories():
    table, ids, cats = table_16()
    rng = np.random.default_rng(4)
    pos = np.array([100, 111], np.int64)
    res = table.sample(
        pos, np.array([0, 1]), np.array([3, 5]), put_back=False, missing_id=-7, rng=rng
    )
    first, second = res.ids[:3], res.ids[3:]
    assert sorted(first) == [101, 102, 103]  # exactly the 3 allowed items
    assert sorted(second[second != -7]) == [110, 112, 113]  # 3 allowed, 5 asked
    assert (second == -7).sum() == 2 and res.unfilled == 2


def test_put_back_false_distribution_is_successive_sampling():
    # 2 of 4 items without replacement: P(first pair) from successive sampling.
    table = make_table(np.arange(4), np.zeros(4, np.int64), np.array([1.0, 2.0, 3.0, 4.0]))
    rng = np.random.default_rng(5)
    reps = 20_000
    res = table.sample(
        np.full(reps, 99, np.int64),
        np.zeros(reps, np.int64),
        np.full(reps, 2),
        put_back=False,
        rng=rng,
    )
    pairs = np.sort(res.ids.reshape(reps, 2), axis=1)
    assert (pairs[:, 0] != pairs[:, 1]).all()
    w = np.array([1.0, 2.0, 3.0, 4.0]) / 10
    names, expected = [], []
    for a in range(4):
        for b in range(a + 1, 4):
            names.append((a, b))
            expected.append(w[a] * w[b] / (1 - w[a]) + w[b] * w[a] / (1 - w[b]))
    observed = [int(((pairs[:, 0] == a) & (pairs[:, 1] == b)).sum()) for a, b in names]
    assert stats.chisquare(observed, np.array(expected) * reps).pvalue > 1e-4


def test_bounded_rounds_fallback_when_own_item_holds_almost_all_weight():
    ids = np.arange(5, dtype=np.int64)
    table = make_table(ids, np.zeros(5, np.int64), np.array([1e9, 1.0, 1.0, 1.0, 1.0]))
    rng = np.random.default_rng(6)
    res = table.sample(
        np.array([0], np.int64), np.zeros(1, np.int64), np.array([4000]), max_rounds=3, rng=rng
    )
    assert 0 not in res.ids and res.unfilled == 0
    assert res.fallback_positives == 1 and res.rounds == 3
    counts = np.bincount(res.ids, minlength=5)[1:]
    assert stats.chisquare(counts).pvalue > 1e-4  # uniform among the allowed four


def test_unknown_category_and_no_allowed_item_give_missing_id():
    table = make_table(np.array([1, 2]), np.array([0, 1]), np.array([1.0, 1.0]))
    rng = np.random.default_rng(7)
    res = table.sample(
        np.array([1, 5], np.int64), np.array([0, 42]), np.array([3, 2]), missing_id=-1, rng=rng
    )
    assert (res.ids == -1).all() and res.unfilled == 5


def test_no_categories_draws_from_whole_table():
    table, ids, cats = table_16()
    rng = np.random.default_rng(8)
    res = table.sample(np.array([100], np.int64), None, np.array([5000]), rng=rng)
    counts = np.bincount(res.ids - 100, minlength=34)[ids - 100]
    assert counts[0] == 0
    w = np.tile(np.arange(1, 5, dtype=np.float64), 4)[1:]
    assert stats.chisquare(counts[1:], w / w.sum() * 5000).pvalue > 1e-4


def test_pack_rows_in_order_with_default_value():
    tags = Column("ragged", np.array([7, 8, 9], np.int64), np.array([0, 1, 1, 3], np.int64))
    table = make_table(
        np.array([10, 20, 30]),
        np.zeros(3, np.int64),
        np.ones(3),
        extra={"price": np.array([1.5, 2.5, 3.5], np.float32)},
    )
    table.columns["tags"] = tags
    out = table.pack(np.array([30, 99, 10], np.int64), default_value=20)
    assert out["price"].values.tolist() == [3.5, 2.5, 1.5]
    assert out["item"].values.tolist() == [30, 20, 10]
    assert out["tags"].offsets.tolist() == [0, 2, 2, 3]
    assert out["tags"].values.tolist() == [8, 9, 7]
    none = table.pack(np.array([99], np.int64), default_value=12345)
    assert none["item"].values.tolist() == [12345] and none["price"].values.tolist() == [0.0]
    assert none["tags"].offsets.tolist() == [0, 0]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"w": [1.0, float("nan"), 1.0]}, "row 1 has nan"),
        ({"w": [1.0, -2.0, 1.0]}, "row 1 has -2.0"),
        ({"item": [1, 2, 1]}, "id 1 appears 2 times"),
        ({"item": [1.0, 2.0, 3.0]}, "ids must be integers"),
        ({"cat": [0, 0]}, "'cat' has 2 rows"),
        ({"w": np.ones((3, 1))}, "must be 1-D"),
    ],
)
def test_bad_tables_are_refused_naming_the_problem(change, message):
    cols = {"item": [1, 2, 3], "cat": [0, 0, 0], "w": [1.0, 1.0, 1.0], "skey": ["", "", ""]}
    cols.update(change)
    with pytest.raises(BadTable, match=message):
        NegativeTable(to_columns(cols), TAGS)


def test_missing_tag_and_multi_value_tag_refused():
    with pytest.raises(BadTable, match="weight_tag column 'w' is missing"):
        NegativeTable(to_columns({"item": [1], "cat": [0], "skey": [""]}), TAGS)
    cols = to_columns({"item": [1, 2], "w": [1.0, 1.0], "skey": ["", ""]})
    cols["cat"] = Column("ragged", np.array([0, 1, 2]), np.array([0, 2, 3]))
    with pytest.raises(BadTable, match="row 0 has 2"):
        NegativeTable(cols, TAGS)


def test_avoid_all_fallback_draws_exactly_from_the_allowed_items():
    # Items 0 and 1 are batch ids holding almost all weight; 2, 3, 4 weigh 1:2:3.
    table = make_table(np.arange(5), np.zeros(5, np.int64), np.array([1e9, 1e9, 1.0, 2.0, 3.0]))
    rng = np.random.default_rng(9)
    res = table.sample(
        np.array([0, 1]),
        np.zeros(2, np.int64),
        np.array([3000, 3000]),
        avoid_all=True,
        max_rounds=2,
        rng=rng,
    )
    assert res.fallback_positives == 2 and res.unfilled == 0
    counts = np.bincount(res.ids, minlength=5)
    assert counts[0] == counts[1] == 0
    assert stats.chisquare(counts[2:], np.array([1, 2, 3]) / 6 * 6000).pvalue > 1e-4


def test_put_back_false_stuck_rows_keep_their_draws_and_finish_exactly():
    # Item 0 holds almost all weight: every positive draws it first, then only duplicates of
    # it until the rounds run out; the rest comes uniformly from items 1..9.
    weights = np.array([1e12] + [1.0] * 9)
    table = make_table(np.arange(10), np.zeros(10, np.int64), weights)
    rng = np.random.default_rng(10)
    reps = 3000
    res = table.sample(
        np.full(reps, 99),
        np.zeros(reps, np.int64),
        np.full(reps, 3),
        put_back=False,
        max_rounds=2,
        rng=rng,
    )
    rows = res.ids.reshape(reps, 3)
    assert (rows == 0).sum(axis=1).tolist() == [1] * reps
    assert all(len(set(r)) == 3 for r in rows.tolist())
    counts = np.bincount(rows[rows != 0], minlength=10)[1:]
    assert stats.chisquare(counts).pvalue > 1e-4


def test_zero_counts_mixed_with_others_keep_positions():
    table, ids, cats = table_16()
    rng = np.random.default_rng(11)
    res = table.sample(np.array([100, 111, 122]), np.array([0, 1, 2]), np.array([2, 0, 3]), rng=rng)
    assert res.ids.shape == (5,)
    assert set((res.ids[:2] - 100) // 10) == {0} and set((res.ids[2:] - 100) // 10) == {2}
