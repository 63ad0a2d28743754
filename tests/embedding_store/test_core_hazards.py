"""Hazards of the C++ core that must raise a clear RuntimeError, not hang, crash or pass
silently: a full hash index, row ids outside the table, params changed after finalize(), sizes
whose arithmetic overflows. Each test calls a `_C` op directly on a tiny table.

A full index used to make the probe loop forever: those calls run in a worker thread with a
deadline, as pytest-timeout cannot interrupt C++ running on the main thread. A size that
overflowed used to crash the process: that call runs in a child process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from streamrec.embedding_store import _C

DEADLINE_S = 20.0  # the calls below take microseconds; a hang is the old probe loop
FULL = r"index is full \(capacity 4 slots"


def call_with_deadline(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) in a daemon thread: its result, or its exception raised here; fails the test
    when it has not returned within DEADLINE_S."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn(*args)
        except BaseException as exc:  # re-raised in the test's thread
            box["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(DEADLINE_S)
    if worker.is_alive():
        pytest.fail(f"{fn.__name__} did not return within {DEADLINE_S} s (a probe that loops)")
    if "error" in box:
        raise box["error"]
    return box["result"]


def raise_in_child(code: str) -> None:
    """Runs code in a child Python (torch and _C imported) and raises here the RuntimeError
    it raised; a child that returns, dies by a signal or raises anything else fails the test."""
    script = (
        "import sys, torch\n"
        "from streamrec.embedding_store import _C\n"
        "try:\n" + textwrap.indent(textwrap.dedent(code), "    ") + "\n"
        "except RuntimeError as exc:\n"
        "    print(exc.args[0].splitlines()[0])\n"
        "    sys.exit(3)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    if proc.returncode == 3:
        raise RuntimeError(proc.stdout.strip())
    pytest.fail(f"child exited with {proc.returncode}, no RuntimeError: {proc.stderr[-2000:]}")


def params(dim: int = 4) -> _C.TableParams:
    p = _C.TableParams()
    p.dim = dim
    p.finalize()
    return p


def table(rows: int, used: int, p: _C.TableParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(data (rows, width) float32, row_keys (rows,) int64) with rows [0, used) created for
    keys 10, 11, ... and the rest zeros."""
    data = torch.zeros(rows, p.width)
    row_keys = torch.zeros(rows, dtype=torch.int64)
    row_keys[:used] = torch.arange(10, 10 + used)
    _C.init_rows(data, row_keys, 0, used, p)
    return data, row_keys


def same_index(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two indexes hold the same entries in the same slots (the key of an empty slot,
    row -1, is never read, and an undone insert leaves its key there)."""
    used = a[:, 1] != -1
    return torch.equal(a[:, 1], b[:, 1]) and torch.equal(a[used, 0], b[used, 0])


def full_index() -> torch.Tensor:
    """A 4-slot index whose every slot holds a key: 10, 11, 12, 13 -> rows 0, 1, 2, 3."""
    slots = _C.index_build(4, torch.arange(10, 13))  # capacity > keys: one slot left empty
    _rows, new = _C.find_or_insert(slots, torch.tensor([13]), 3)  # takes the last one
    assert new.tolist() == [13] and bool((slots[:, 1] >= 0).all())
    return slots


# -- a full index ------------------------------------------------------------------------------


def test_lookups_on_a_full_index_read_absent_keys_as_absent() -> None:
    slots = full_index()
    keys = torch.tensor([10, 99, 13])
    assert call_with_deadline(_C.find, slots, keys).tolist() == [0, -1, 3]
    rows, misses = call_with_deadline(_C.find_count, slots, keys)
    assert rows.tolist() == [0, -1, 3] and misses == 1  # -1: no empty slot to hint at
    p = params()
    data, _ = table(4, 4, p)
    out, rows, misses = call_with_deadline(_C.find_gather, slots, keys, data, p, True)
    assert rows.tolist() == [0, -1, 3] and misses == 1
    w = _C.EMBED_W
    assert torch.equal(out[0], data[0, w : w + 4]) and torch.equal(out[2], data[3, w : w + 4])
    assert not out[1].any()


def test_find_or_insert_on_a_full_index_raises_and_leaves_it_as_it_was() -> None:
    slots = _C.index_build(4, torch.arange(10, 12))  # two empty slots, three new keys
    before = slots.clone()
    with pytest.raises(RuntimeError, match=FULL + r".* key 22"):
        call_with_deadline(_C.find_or_insert, slots, torch.tensor([20, 10, 21, 22]), 2)
    assert same_index(slots, before)  # 20 and 21 were inserted, then taken back
    rows, new = _C.find_or_insert(slots, torch.tensor([20, 21, 20]), 2)  # room for two
    assert rows.tolist() == [2, 3, 2] and new.tolist() == [20, 21]


def test_insert_or_assign_on_a_full_index_raises_and_undoes_the_whole_call() -> None:
    slots = _C.index_build(4, torch.arange(10, 12))
    before = slots.clone()
    with pytest.raises(RuntimeError, match=FULL + r".* key 22"):
        call_with_deadline(
            _C.insert_or_assign, slots, torch.tensor([10, 20, 21, 22]), torch.tensor([7, 8, 9, 5])
        )
    assert same_index(slots, before)  # key 10's new value undone too
    assert _C.find(slots, torch.tensor([10, 11, 20])).tolist() == [0, 1, -1]


def test_insert_or_assign_refuses_negative_values() -> None:
    """-1 marks an empty slot: stored as a value it would cut the probe runs through it."""
    slots = _C.index_build(8, torch.arange(10, 12))
    with pytest.raises(RuntimeError, match="vals must be row ids >= 0, got -1 at position 1"):
        _C.insert_or_assign(slots, torch.tensor([20, 21]), torch.tensor([3, -1]))


@pytest.mark.parametrize("hinted", [True, False])
def test_insert_init_on_a_full_index_raises_and_writes_nothing(hinted: bool) -> None:
    p = params()
    data, row_keys = table(8, 2, p)  # rows to spare, an index of 4 slots holding 2 keys
    slots = _C.index_build(4, row_keys[:2])
    keys = torch.tensor([10, 20, 11, 21, 20, 22])
    rows, misses = _C.find_count(slots, keys)
    assert misses == 4
    out = torch.zeros(keys.numel(), p.dim)
    index = slots.clone()
    state = [t.clone() for t in (data, row_keys, rows, out)]
    with pytest.raises(RuntimeError, match=FULL + r".* key 2[012]"):
        call_with_deadline(_C.insert_init, slots, data, row_keys, keys, rows, out, 2, p, hinted)
    assert same_index(slots, index)
    for now, then in zip((data, row_keys, rows, out), state, strict=True):
        assert torch.equal(now, then)
    # the index is whole: two of the three keys still fit
    keys = torch.tensor([20, 21, 20])
    rows = _C.find_count(slots, keys)[0]
    assert _C.insert_init(slots, data, row_keys, keys, rows, out[:3], 2, p, hinted) == 2
    assert rows.tolist() == [2, 3, 2] and row_keys[2:4].tolist() == [20, 21]
    assert _C.find(slots, torch.tensor([10, 11, 20, 21])).tolist() == [0, 1, 2, 3]


# -- rows outside the table --------------------------------------------------------------------


@pytest.mark.parametrize("n", [3, 10_000])  # one thread, or each thread owning some rows
def test_update_raises_on_a_row_outside_the_table_and_writes_nothing(n: int) -> None:
    p = params()
    data, row_keys = table(4, 4, p)
    rows = torch.arange(n) % 4
    rows[n // 2] = 4
    grads, shows, clicks = torch.ones(n, p.dim), torch.ones(n), torch.zeros(n)
    before = data.clone()
    with pytest.raises(RuntimeError, match=rf"update: row 4 at position {n // 2} is outside "):
        _C.update(data, row_keys, rows, grads, shows, clicks, p)
    assert torch.equal(data, before)
    rows[n // 2] = -1  # an absent key is skipped, as before
    _C.update(data, row_keys, rows, grads, shows, clicks, p)
    assert data[:, _C.SHOW].sum().item() == n - 1


def test_gather_raises_on_a_row_outside_the_table() -> None:
    p = params()
    data, _ = table(4, 4, p)
    with pytest.raises(RuntimeError, match="gather: row 4 at position 1 is outside the table's 4"):
        _C.gather(data, torch.tensor([1, 4, -1]), p)
    out = _C.gather(data, torch.tensor([1, -1]), p)
    assert torch.equal(out[0], data[1, _C.EMBED_W : _C.EMBED_W + p.dim]) and not out[1].any()


def test_find_gather_raises_on_an_index_of_another_table() -> None:
    p = params()
    data, _ = table(4, 4, p)
    slots = _C.index_build(8, torch.arange(10, 15))  # key 14 -> row 4: data has rows 0..3
    with pytest.raises(RuntimeError, match="maps key 14 to row 4, outside the table's 4 rows"):
        _C.find_gather(slots, torch.tensor([10, 14]), data, p, True)


def test_params_changed_after_finalize_or_never_finalized_are_refused() -> None:
    p = params(4)
    data, _ = table(4, 4, p)
    p.dim = 2  # the rows are still 4 weights wide
    with pytest.raises(RuntimeError, match="gather: table params are not finalized for dim 2"):
        _C.gather(data, torch.tensor([0]), p)
    with pytest.raises(RuntimeError, match="initial_weights: table params are not finalized"):
        _C.initial_weights(torch.tensor([1]), _C.TableParams(), False)


# -- misaligned inputs -------------------------------------------------------------------------


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """A copy of t whose data starts 2 bytes past an aligned address, as an array decoded from
    a message can (a load through it was undefined behaviour, found by `make sanitize`)."""
    nbytes = t.numel() * t.element_size()
    out = torch.frombuffer(bytearray(nbytes + 2), dtype=t.dtype, offset=2, count=t.numel())
    assert out.data_ptr() % t.element_size() != 0
    return out.view(t.shape).copy_(t)


def test_misaligned_inputs_give_the_results_of_aligned_ones() -> None:
    p = params()
    data, row_keys = table(8, 6, p)
    slots = _C.index_build(16, row_keys[:6])
    keys = torch.tensor([11, 99, 15, 11])
    assert torch.equal(_C.find(slots, misaligned(keys)), _C.find(slots, keys))
    assert _C.find_count(slots, misaligned(keys))[1] == 1
    out, rows, misses = _C.find_gather(slots, misaligned(keys), data, p, True)
    assert torch.equal(out, _C.find_gather(slots, keys, data, p, True)[0]) and misses == 1
    grads, shows, clicks = torch.randn(4, p.dim), torch.rand(4), torch.zeros(4)
    assert _C.check_push(misaligned(grads), misaligned(shows), misaligned(clicks)) == (0, 0)
    twin = data.clone()
    _C.update(data, row_keys, rows, grads, shows, clicks, p)
    args = (misaligned(row_keys), misaligned(rows), misaligned(grads))
    _C.update(twin, *args, misaligned(shows), misaligned(clicks), p)
    assert torch.equal(data, twin)
    with pytest.raises(RuntimeError, match="data must be aligned to its 4-byte elements"):
        _C.advance_day(misaligned(data), 8)


# -- size arithmetic ---------------------------------------------------------------------------


def test_row_ranges_whose_end_overflows_raise() -> None:
    p = params()
    data, row_keys = table(4, 0, p)
    with pytest.raises(RuntimeError, match=r"init_rows: rows \[1, 1 \+ 9223372036854775807\)"):
        _C.init_rows(data, row_keys, 1, 2**63 - 1, p)
    slots = _C.index_build(8, torch.zeros(0, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="next_row 9223372036854775807 with 2 keys"):
        _C.find_or_insert(slots, torch.tensor([1, 2]), 2**63 - 1)
    with pytest.raises(RuntimeError, match=r"u = -1 outside \[0, 0\]"):
        _C.sum_rows(torch.zeros(0, 3), torch.zeros(0, dtype=torch.int64), -1)


def test_a_dim_whose_row_width_overflows_is_refused() -> None:
    p = _C.TableParams()
    p.dim = 2**63 - 1
    with pytest.raises(ValueError, match="overflows the row width"):
        p.finalize()


def test_a_result_whose_byte_size_overflows_raises() -> None:
    """2**18 rows of 2**44 + 1 floats: 2**64 + 2**20 bytes, which wrapped to 1 MiB; the pool
    then mapped 2 MiB under a tensor claiming the rest, and the copy crashed."""
    with pytest.raises(RuntimeError, match="step_buffer: size .* overflows int64"):
        raise_in_child(
            """
            p = _C.TableParams()
            p.dim = 2**44 + 1
            p.finalize()
            data = torch.empty(0, p.width)
            _C.gather(data, torch.full((2**18,), -1, dtype=torch.int64), p)
            """
        )


def test_a_tensor_on_another_device_is_refused_by_name() -> None:
    """The ops follow host pointers: a tensor on another device (meta here: no GPU needed)
    is refused naming the op and the argument, before anything is read or written."""
    p = params()
    data, _ = table(4, 4, p)
    meta_rows = torch.tensor([0, 1]).to("meta")
    with pytest.raises(RuntimeError, match="gather: rows must be a CPU tensor, got one on meta"):
        _C.gather(data, meta_rows, p)
    with pytest.raises(RuntimeError, match="must be a CPU tensor, got one on meta"):
        _C.gather(data.to("meta"), torch.tensor([0, 1]), p)
    slots = _C.index_build(8, torch.arange(4))
    with pytest.raises(RuntimeError, match="find: keys must be a CPU tensor, got one on meta"):
        _C.find(slots, torch.arange(3).to("meta"))
