"""Show/click, score, embedx expansion, day advance, shrink, base/delta selection and
admission, against the plain-numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from es_reference import RefTable
from streamrec.embedding_store import EmbeddingStore, FileConverter, TableOptions


def table(**kw) -> TableOptions:
    base = dict(
        name="t",
        dim=4,
        embedx_threshold=2.0,
        nonclk_coeff=0.1,
        click_coeff=1.0,
        base_threshold=1.5,
        delta_threshold=0.5,
        delta_keep_days=1,
        show_click_decay_rate=0.9,
        delete_threshold=0.3,
        delete_after_unseen_days=2,
        embed_sgd_param={"name": "adagrad", "learning_rate": 0.1, "initial_range": 0.2},
        embedx_sgd_param={"name": "std_adagrad", "learning_rate": 0.1, "initial_range": 0.2},
    )
    base.update(kw)
    return TableOptions(**base)


def make(t: TableOptions) -> tuple[EmbeddingStore, RefTable]:
    store = EmbeddingStore([t], seed=11)
    return store, RefTable(t, lambda k, e: store.initial_values(t.name, k, e).numpy())


def compare(store: EmbeddingStore, ref: RefTable, keys: np.ndarray) -> None:
    np.testing.assert_allclose(
        store.pull("t", keys, create=False).numpy(),
        ref.pull(keys, create=False),
        rtol=1e-5,
        atol=1e-6,
    )
    st = store.inspect("t", keys)
    rows = [ref.rows.get(int(k)) for k in keys]
    assert st["present"].tolist() == [r is not None for r in rows]
    np.testing.assert_allclose(st["show"].numpy(), [r.show if r else 0 for r in rows], rtol=1e-5)
    np.testing.assert_allclose(st["click"].numpy(), [r.click if r else 0 for r in rows], rtol=1e-5)
    np.testing.assert_allclose(
        st["score"].numpy(), [ref.score(r) if r else 0 for r in rows], rtol=1e-5, atol=1e-6
    )
    assert st["unseen_days"].tolist() == [r.unseen if r else 0 for r in rows]
    assert st["expanded"].tolist() == [bool(r and r.expanded) for r in rows]


def test_score_uses_show_minus_click() -> None:
    t = table(nonclk_coeff=0.25, click_coeff=2.0)
    store, _ = make(t)
    store.push("t", torch.tensor([1]), torch.zeros(1, 4), torch.tensor([10.0]), torch.tensor([3.0]))
    # 0.25 * (10 - 3) + 2 * 3: non-clicked shows add to the score (seed README note)
    assert float(store.inspect("t", torch.tensor([1]))["score"][0]) == pytest.approx(7.75)
    assert t.score(10, 3) == pytest.approx(7.75)


def test_embedx_reads_zero_and_is_not_trained_until_the_score_reaches_the_threshold() -> None:
    store, ref = make(table())
    k = torch.tensor([5])
    g = torch.ones(1, 4)
    w0 = store.pull("t", k)
    assert w0[0, 1:].abs().sum() == 0 and w0[0, 0] != 0
    store.push("t", k, g, torch.tensor([1.0]), torch.tensor([1.0]))  # score 1 < 2
    ref.push(k.numpy(), g.numpy().astype(np.float64), np.ones(1), np.ones(1))
    w1 = store.pull("t", k)
    assert w1[0, 1:].abs().sum() == 0 and w1[0, 0] < w0[0, 0]
    assert not bool(store.inspect("t", k)["expanded"][0])
    store.push("t", k, g, torch.tensor([1.0]), torch.tensor([1.0]))  # score 2: expands
    ref.push(k.numpy(), g.numpy().astype(np.float64), np.ones(1), np.ones(1))
    w2 = store.pull("t", k)
    assert bool(store.inspect("t", k)["expanded"][0])
    # the embedx part is initialised (not yet trained) at expansion
    torch.testing.assert_close(w2[0, 1:], store.initial_values("t", k, expanded=True)[0, 1:])
    store.push("t", k, g, torch.tensor([1.0]), torch.tensor([0.0]))  # now trained
    ref.push(k.numpy(), g.numpy().astype(np.float64), np.ones(1), np.zeros(1))
    compare(store, ref, np.array([5]))
    assert store.stats()["tables"]["t"]["rows_expanded"] == 1


def test_random_schedule_of_pushes_days_shrinks_and_saves_matches_reference(tmp_path) -> None:
    store, ref = make(table())
    rng = np.random.default_rng(5)
    deleted = 0
    for step in range(30):
        keys = rng.integers(0, 60, 40)
        grads = rng.normal(0, 1, (40, 4)).astype(np.float32)
        shows = rng.integers(1, 3, 40).astype(np.float32)
        clicks = (rng.random(40) < 0.3).astype(np.float32)
        store.pull("t", keys)
        ref.pull(keys)
        store.push("t", keys, grads, shows, clicks)
        ref.push(keys, grads.astype(np.float64), shows, clicks)
        if step % 7 == 6:
            store.advance_day()
            ref.advance_day()
        if step % 10 == 9:
            got = store.shrink()["t"]
            assert got == ref.shrink()
            deleted += got
        if step % 5 == 4:
            mode = "base" if step % 15 == 14 else "delta"
            out = tmp_path / f"s{step}"
            manifest = store.save(str(out), mode)
            keys_saved, values = FileConverter(out).read_rows("t", mode)
            want = ref.select(mode)
            assert set(keys_saved.tolist()) == want
            assert manifest["tables"]["t"]["rows"] == len(want)
            if want:
                np.testing.assert_allclose(
                    values, ref.pull(keys_saved, create=False), rtol=1e-5, atol=1e-6
                )
        compare(store, ref, np.arange(60))
    assert deleted > 0, "the schedule must delete rows to test shrink"
    assert store.size("t") == len(ref.rows)
    assert store.stats()["tables"]["t"]["rows_deleted"] == deleted


def test_shrink_deletes_by_score_and_by_unseen_days() -> None:
    store, ref = make(table(delete_threshold=0.5, delete_after_unseen_days=1))
    keys = np.array([1, 2, 3])
    shows = np.array([10.0, 1.0, 10.0], np.float32)
    clicks = np.array([1.0, 0.0, 1.0], np.float32)
    store.push("t", keys, np.zeros((3, 4), np.float32), shows, clicks)
    ref.push(keys, np.zeros((3, 4)), shows, clicks)
    store.advance_day()
    ref.advance_day()
    store.push("t", np.array([1]), np.zeros((1, 4), np.float32))  # key 1 seen again
    ref.push(np.array([1]), np.zeros((1, 4)))
    store.advance_day()
    ref.advance_day()
    # key 2: score 0.1 * 0.9 < 0.5; key 3: unseen 2 days > 1; key 1 stays
    assert store.shrink() == {"t": 2}
    assert ref.shrink() == 2
    assert store.inspect("t", keys)["present"].tolist() == [True, False, False]
    compare(store, ref, keys)
    # the compacted table still finds, creates and trains
    store.push("t", np.array([2, 1]), np.ones((2, 4), np.float32))
    ref.push(np.array([2, 1]), np.ones((2, 4)))
    compare(store, ref, keys)


def test_admission_probability_refuses_some_new_keys() -> None:
    store = EmbeddingStore([table(admission_probability=0.25)], seed=3)
    keys = torch.arange(4000)
    w = store.pull("t", keys)
    n = store.size("t")
    assert 800 < n < 1200
    st = store.inspect("t", keys)
    assert (w[~st["present"]] == 0).all()
    assert store.stats()["tables"]["t"]["rows_refused"] == 4000 - n
    # refused keys' pushes are dropped, not created
    absent = keys[~st["present"]][:10]
    store.push("t", absent, torch.ones(10, 4))
    assert store.size("t") <= n + 10
    assert store.stats()["tables"]["t"]["push_keys"] == 10


@pytest.mark.parametrize("tier", ["host", "ssd"])
def test_admission_by_score_lets_clicked_keys_in_first(tmp_path, tier) -> None:
    t = table(admission_score=0.2, nonclk_coeff=0.1, click_coeff=1.0)
    kw = {}
    if tier == "ssd":
        kw = {"persistent_path": str(tmp_path), "cache_budget_mb": 0.05, "capacity": 10_000}
    store = EmbeddingStore([t], tier=tier, seed=2, **kw)
    keys = torch.arange(4000)
    assert store.pull("t", keys).abs().sum() == 0 and store.size("t") == 0  # pulls never create
    clicked = keys[:1000]
    store.push("t", clicked, torch.zeros(1000, 4), torch.ones(1000), torch.ones(1000))
    assert store.size("t") == 1000  # score 1 >= 0.2: always admitted
    shown = keys[1000:]
    store.push("t", shown, torch.zeros(3000, 4), torch.ones(3000), torch.zeros(3000))
    admitted = store.size("t") - 1000
    assert 1300 < admitted < 1700  # score 0.1 / 0.2: half of them
    st = store.inspect("t", shown)
    assert int(st["present"].sum()) == admitted
    assert store.stats()["tables"]["t"]["rows_refused"] >= 3000 - admitted
