"""The client's row moves (C++): take_rows, sum_rows, all_finite, against numpy."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from streamrec.embedding_store import _C, unique_groups, unique_keys


def test_take_rows_of_parts_equals_index_select_of_their_concatenation() -> None:
    rng = np.random.default_rng(0)
    src = torch.from_numpy(rng.normal(size=(5_000, 7)).astype(np.float32))
    idx = torch.from_numpy(rng.integers(0, 5_000, 40_000))
    assert torch.equal(_C.take_rows([src], idx), src.index_select(0, idx))
    parts = [src[:1_000], src[1_000:1_000], src[1_000:4_321], src[4_321:]]  # one part empty
    assert torch.equal(_C.take_rows(parts, idx), src.index_select(0, idx))
    with pytest.raises(RuntimeError, match="outside"):
        _C.take_rows([src], torch.tensor([0, 5_000]))


def test_large_results_reuse_freed_buffers_and_never_share_a_live_one() -> None:
    """Results of 1 MiB or more come from a pool of mappings: a live result keeps its own
    buffer, a freed one is taken again by the next result that fits (its pages mapped)."""
    src = torch.arange(70_000 * 4, dtype=torch.float32).view(70_000, 4)  # 1.1 MB results
    idx = torch.arange(70_000).flip(0)
    a = _C.take_rows([src], idx)
    b = _C.take_rows([src], idx)
    assert a.data_ptr() != b.data_ptr()
    assert torch.equal(a, src.flip(0)) and torch.equal(b, src.flip(0))
    freed = a.data_ptr()
    del a
    c = _C.take_rows([src], idx)
    assert c.data_ptr() == freed and torch.equal(c, src.flip(0))
    b.fill_(-1.0)  # a result is the caller's to write
    assert torch.equal(c, src.flip(0))
    small = _C.take_rows([src], idx[:100])  # under 1 MiB: from the heap
    assert torch.equal(small, src.flip(0)[:100])


@pytest.mark.parametrize("skewed", [True, False])
def test_sum_rows_sums_repeats_in_float64_and_flags_non_finite(skewed: bool) -> None:
    rng = np.random.default_rng(1)
    # skewed: hot keys repeat thousands of times (rows grouped by a counting sort); else a
    # few repeats among distinct keys (the first positions copied, repeats added after)
    keys = rng.zipf(1.3, 30_000) % 3_000 if skewed else rng.integers(0, 10**6, 30_000)
    uniq, inverse = unique_keys(torch.from_numpy(keys))
    assert (uniq.numel() < 10_000) == skewed
    grads = rng.normal(size=(keys.size, 5)).astype(np.float32)
    summed, finite = _C.sum_rows(torch.from_numpy(grads), inverse, uniq.numel())
    expect = np.zeros((uniq.numel(), 5))
    np.add.at(expect, inverse.numpy(), grads.astype(np.float64))
    assert finite
    np.testing.assert_allclose(summed.numpy(), expect.astype(np.float32), rtol=1e-6, atol=1e-6)
    grads[17, 2] = np.nan  # a repeat or a first occurrence: either way the sum is not finite
    assert not _C.sum_rows(torch.from_numpy(grads), inverse, uniq.numel())[1]
    with pytest.raises(RuntimeError, match="without a position"):
        _C.sum_rows(torch.ones(2, 3), torch.tensor([0, 0]), 2)


def test_unique_groups_is_unique_keys_of_each_group_end_to_end() -> None:
    rng = np.random.default_rng(4)
    counts = [300, 0, 1, 2_000, 57]  # an empty group, a group of one
    keys = torch.from_numpy(rng.integers(0, 400, sum(counts)))
    keys[300] = keys[0]  # a key of two groups: one row in each
    distinct, inverse, per_group = unique_groups(keys, counts)
    want_keys, want_inverse, shift = [], [], 0
    for part in keys.split(counts):
        u, inv = unique_keys(part)
        want_keys.append(u)
        want_inverse.append(inv + shift)
        shift += u.numel()
    assert per_group == [u.numel() for u in want_keys]
    assert torch.equal(distinct, torch.cat(want_keys))
    assert torch.equal(inverse, torch.cat(want_inverse))
    assert torch.equal(distinct[inverse], keys)
    for bad, text in (([300, 0, 1, 2_000], "counts sum to"), ([-1, 2_359], "< 0")):
        with pytest.raises(RuntimeError, match=text):
            unique_groups(keys, bad)


def test_all_finite() -> None:
    t = torch.zeros(100_000)
    assert _C.all_finite(t)
    for bad in (float("nan"), float("inf"), -float("inf")):
        t[77_777] = bad
        assert not _C.all_finite(t)
        t[77_777] = 0.0


def test_keep_freed_memory_applies_once_and_can_be_turned_off() -> None:
    code = "from streamrec.malloc import keep_freed_memory as k; print(k(), k())"
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert on.stdout.split() == ["True", "True"]
    env = {"STREAMREC_KEEP_FREED_MEMORY": "0", "PATH": "/usr/bin:/bin"}
    off = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert off.stdout.split() == ["False", "False"]
