"""Pinned staging (streamrec.trainer.model.staging): a batch's host tensors to the dense model's
device through buffers reused every step, the rows' gradient back to the host.

The logic runs on the CPU with the staging forced on (``stage=True, pin=False``: the same
buffers, a host copy where a GPU takes the H2D one); the GPU tests check the pinned path."""

from __future__ import annotations

import pytest
import torch
from streamrec.trainer.model.staging import MIN_BYTES, Staging

CPU = torch.device("cpu")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


def staging_on_cpu(slots: int = 2) -> Staging:
    return Staging(CPU, stage=True, pin=False, slots=slots)


def test_on_a_cpu_model_nothing_is_staged_or_copied():
    st = Staging(CPU)
    assert not st.active and not st.pin
    rows = torch.randn(8, 3, 4, requires_grad=True)
    dense = torch.randn(8, 13)
    assert st.rows(rows) is rows  # no copy, no autograd node: the CPU path as it was
    assert st.to_device("dense", dense) is dense
    parts = [torch.randn(8, 4), torch.randn(8, 2)]
    assert all(a is b for a, b in zip(st.rows(parts), parts, strict=True))
    assert st.allocations == 0 and st.nbytes() == 0


def test_values_arrive_unchanged_in_shape_and_dtype_whatever_the_layout():
    st = staging_on_cpu()
    rows = torch.randn(16, 5, 4)
    cols = torch.randn(13, 16).t()  # not contiguous
    keys = torch.arange(40, dtype=torch.int64).view(8, 5)
    for name, t in (("rows", rows), ("dense", cols), ("keys", keys)):
        out = st.to_device(name, t)
        assert out.shape == t.shape and out.dtype == t.dtype and out.is_contiguous()
        assert torch.equal(out, t)
        assert out.data_ptr() != st.buffer(f"{name}#0", 0).data_ptr()  # a copy, not the buffer


def test_a_buffer_is_reused_across_steps_and_grown_by_doubling():
    st = staging_on_cpu(slots=1)
    big = torch.randn(64, 26, 16)  # 106,496 bytes: over MIN_BYTES
    st.to_device("rows", big)
    first = st.buffer("rows#0", 0)
    assert first.numel() == big.numel() * 4 > MIN_BYTES
    for b in (64, 30, 64, 1):  # the same size or smaller (a pass's last batch): no allocation
        out = st.to_device("rows", torch.randn(b, 26, 16))
        assert out.shape == (b, 26, 16)
    assert st.allocations == 1 and st.buffer("rows#0", 0).data_ptr() == first.data_ptr()
    st.to_device("rows", torch.randn(65, 26, 16))  # bigger: one new buffer, double the size
    assert st.allocations == 2 and st.buffer("rows#0", 0).numel() == 2 * first.numel()
    st.to_device("dense", torch.randn(4, 13))  # a small tensor: MIN_BYTES
    assert st.allocations == 3 and st.buffer("dense#0", 0).numel() == MIN_BYTES
    assert st.nbytes() == 2 * first.numel() + MIN_BYTES
    st.release()
    assert st.nbytes() == 0


def test_double_buffered_each_name_fills_its_two_buffers_in_turn():
    st = staging_on_cpu()
    assert st.slots == 2 and st.slot_names("rows") == ["rows#0", "rows#1"]
    for step in range(6):  # steady state: one buffer a slot, reused every other step
        st.to_device("rows", torch.randn(64, 26, 16))
        if step % 2 == 0:
            st.to_device("dense", torch.randn(64, 13))
    assert st.allocations == 4  # rows#0, rows#1, dense#0, dense#1
    ptrs = {n: st.buffer(n, 0).data_ptr() for n in [*st.slot_names("rows"), "dense#0"]}
    assert len(set(ptrs.values())) == 3  # each slot its own memory
    st.to_device("rows", torch.randn(64, 26, 16))  # step 6: rows#0 again, not reallocated
    assert st.allocations == 4 and st.buffer("rows#0", 0).data_ptr() == ptrs["rows#0"]
    st.release()
    assert st.nbytes() == 0 and st.slot("rows") == "rows#0"  # the turns start again


def test_double_buffered_a_batch_stays_in_its_buffer_while_the_next_is_staged():
    """What an H2D copy still in flight reads: staging batch i + 1 must not overwrite the
    buffer batch i's copy reads (single-buffered it does, once that copy's fence is waited;
    double-buffered it goes to the other buffer and batch i's bytes stay until i + 2)."""
    for slots, kept in ((2, True), (1, False)):
        st = staging_on_cpu(slots)
        a, b, c = (torch.full((32, 26, 16), v) for v in (1.0, 2.0, 3.0))
        st.to_device("rows", a)
        st.to_device("rows", b)  # batch i + 1 while batch i's copy may still read its buffer
        first = st.buffer("rows#0", 0)[: a.numel() * 4].view(torch.float32).view(a.shape)
        assert torch.equal(first, a) is kept
        if slots == 2:
            assert torch.equal(
                st.buffer("rows#1", 0)[: b.numel() * 4].view(torch.float32), b.view(-1)
            )
            st.to_device("rows", c)  # batch i + 2: batch i's buffer again
            assert torch.equal(first, c)


def test_slots_must_be_at_least_one():
    with pytest.raises(ValueError, match="slots must be >= 1"):
        Staging(CPU, stage=True, slots=0)


def test_an_earlier_step_keeps_its_values_when_the_buffer_is_refilled():
    st = staging_on_cpu()
    a, b = torch.full((32, 8), 1.0), torch.full((32, 8), 2.0)
    out_a = st.to_device("rows", a)
    out_b = st.to_device("rows", b)
    assert torch.equal(out_a, a) and torch.equal(out_b, b)


def test_the_rows_gradient_comes_back_to_the_host_tensor():
    st = staging_on_cpu()
    weights = torch.randn(6, 4, requires_grad=True)  # the pulled rows' leaf
    index = torch.tensor([[0, 1], [2, 2], [5, 3]])
    ly = weights[index]  # (3, 2, 4): the sparse forward's gather
    out = st.rows(ly)
    assert out.grad_fn is not None and out.data_ptr() != ly.data_ptr()
    w = torch.randn(3, 2, 4)
    (out * w).sum().backward()
    expect = torch.zeros(6, 4).index_add_(0, index.reshape(-1), w.reshape(-1, 4))
    assert weights.grad is not None and torch.allclose(weights.grad, expect)


def test_a_list_of_rows_of_several_widths_is_staged_each_with_its_gradient():
    st = staging_on_cpu()
    parts = [torch.randn(8, 4, requires_grad=True), torch.randn(8, 2, requires_grad=True)]
    out = st.rows(parts)
    assert isinstance(out, list) and [o.shape for o in out] == [(8, 4), (8, 2)]
    assert st.allocations == 2  # a buffer each
    sum(o.sum() * (k + 1) for k, o in enumerate(out)).backward()
    assert torch.equal(parts[0].grad, torch.ones(8, 4))
    assert torch.equal(parts[1].grad, torch.full((8, 2), 2.0))


def test_under_no_grad_the_rows_are_staged_without_a_graph():
    st = staging_on_cpu()
    rows = torch.randn(4, 3, 2, requires_grad=True)
    with torch.no_grad():
        out = st.rows(rows)
    assert out.grad_fn is None and torch.equal(out, rows)


@pytest.mark.gpu
@needs_gpu
def test_on_a_gpu_host_tensors_arrive_through_pinned_buffers_with_gradients_back():
    gpu = torch.device("cuda")
    st = Staging(gpu)
    assert st.active and st.pin
    weights = torch.randn(50, 16, requires_grad=True)
    index = torch.randint(0, 50, (256, 26))
    ly = weights[index]  # (256, 26, 16) on the host
    out = st.rows(ly)
    dense = torch.randn(13, 256).t()
    x = st.to_device("dense", dense)
    assert out.is_cuda and x.is_cuda and st.buffer("rows#0", 0).is_pinned()
    assert torch.equal(out.cpu(), ly.detach()) and torch.equal(x.cpu(), dense)
    w = torch.randn(256, 26, 16, device=gpu)
    (out * w).sum().backward()
    expect = torch.zeros(50, 16).index_add_(0, index.reshape(-1), w.cpu().reshape(-1, 16))
    assert weights.grad is not None and not weights.grad.is_cuda
    assert torch.allclose(weights.grad, expect, atol=1e-5)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("slots", [1, 2, 3])
def test_on_a_gpu_a_buffer_is_refilled_only_after_its_copy_finished(slots):
    """64 MiB a copy: refilling a buffer while an earlier copy still reads it would change
    what arrives (its fence prevents it), single-, double- or triple-buffered."""
    st = Staging(torch.device("cuda"), slots=slots)
    a, b, c = torch.randn(1 << 24), torch.randn(1 << 24), torch.randn(1 << 24)
    for _ in range(3):
        outs = [st.to_device("rows", t) for t in (a, b, c)]
        torch.cuda.synchronize()
        assert all(torch.equal(o.cpu(), t) for o, t in zip(outs, (a, b, c), strict=True))
    assert st.allocations == slots
