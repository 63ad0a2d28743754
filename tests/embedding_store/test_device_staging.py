"""Pinned staging of a step's host inputs (device_staging.Staging): buffers reused between
calls and grown by doubling, a buffer overwritten only after its last copy's fence, inputs
already on the device passed through with no host round trip. The buffer logic runs here on
the CPU (unpinned); pinning, the asynchronous copy and the CUDA event need a GPU (the
cuda-only tests)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from streamrec.embedding_store.tiers.device_staging import MIN_BYTES, Staging
from streamrec.store_schema import TableOptions

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="pinned buffers, the asynchronous H2D copy and its CUDA event need a CUDA GPU",
)
CPU = torch.device("cpu")


def test_without_cuda_nothing_is_pinned_and_device_inputs_pass_through() -> None:
    staging = Staging(CPU)
    assert not staging.pin
    keys = torch.arange(10)
    assert staging.to_device("keys", keys, torch.int64) is keys  # no copy at all
    cast = staging.to_device("shows", torch.ones(4, dtype=torch.float64), torch.float32)
    assert cast.dtype == torch.float32 and torch.equal(cast, torch.ones(4))
    assert staging.allocations == 0 and staging.nbytes() == 0


def test_a_misaligned_input_on_the_device_is_copied_aligned() -> None:
    """A received message's float32 view may start at any byte (the shard's pushes on the CPU
    build): the kernels get an aligned copy, an aligned input goes as it is."""
    staging = Staging(CPU)
    odd = torch.frombuffer(bytearray(range(4 * 6 + 1)), dtype=torch.float32, offset=1, count=6)
    assert odd.data_ptr() % 4 != 0
    out = staging.to_device("grads", odd, torch.float32)
    assert out.data_ptr() % 4 == 0 and torch.equal(out, odd)
    even = torch.ones(6)
    assert staging.to_device("grads", even, torch.float32) is even


def test_buffers_are_reused_and_grow_by_doubling() -> None:
    staging = Staging(CPU, pin=False)
    a = staging.stage("keys", torch.arange(100), torch.int64)
    first = a.data_ptr()
    assert staging.allocations == 1 and staging.nbytes() == MIN_BYTES
    b = staging.stage("keys", torch.arange(50) * 3, torch.int64)
    assert b.data_ptr() == first and staging.allocations == 1  # reused
    assert torch.equal(b, torch.arange(50) * 3)
    big = torch.arange(10_000)  # 80,000 bytes: past the 65,536 buffer, so 131,072
    c = staging.stage("keys", big, torch.int64)
    assert staging.allocations == 2 and staging.nbytes() == 2 * MIN_BYTES
    assert torch.equal(c, big)
    d = staging.stage("keys", torch.arange(16_000), torch.int64)  # 128,000: fits
    assert d.data_ptr() == c.data_ptr() and staging.allocations == 2
    # another input has its own buffer; a strided float64 input is packed and cast in one go
    grads = torch.randn(8, 6, dtype=torch.float64).t()
    g = staging.stage("grads", grads, torch.float32)
    assert g.is_contiguous() and torch.equal(g, grads.to(torch.float32))
    assert staging.allocations == 3


class RecordingFence:
    """Records what the buffer held when it was waited on (pure logic: no CUDA here)."""

    def __init__(self, buf: torch.Tensor) -> None:
        self.buf, self.seen = buf, None

    def synchronize(self) -> None:
        self.seen = self.buf[:8].clone()


def test_a_buffer_waits_for_its_last_copy_before_it_is_overwritten() -> None:
    staging = Staging(CPU, pin=False)
    staging.stage("keys", torch.full((1,), 7), torch.int64)
    fence = RecordingFence(staging._bufs["keys"])
    staging._fences["keys"] = fence  # as to_device leaves it after an H2D copy
    staging.stage("keys", torch.full((1,), 9), torch.int64)
    assert fence.seen is not None and int(fence.seen.view(torch.int64)[0]) == 7
    assert "keys" not in staging._fences  # waited once
    fence.seen = None
    staging.stage("keys", torch.full((1,), 11), torch.int64)
    assert fence.seen is None


def test_the_push_path_reads_back_only_the_miss_count_and_the_expansions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the CPU build: a steady-state push (every key present) calls .item() twice (the
    miss count, the rows expanded) and .cpu() never; nothing is staged (the inputs are on the
    device already)."""
    from streamrec.embedding_store.tiers.device_table import DeviceTable

    table = DeviceTable(TableOptions(name="t", dim=8), 3, device="cpu")
    keys = torch.arange(500) * 7919
    table.pull(keys, True)
    calls: dict[str, int] = {"item": 0, "cpu": 0}
    for name in calls:
        real = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *a: Any, _real: Any = real, _n: str = name) -> Any:
            calls[_n] += 1
            return _real(self, *a)

        monkeypatch.setattr(torch.Tensor, name, counted)
    ones = torch.ones(keys.numel())
    assert table.push(keys, torch.full((keys.numel(), 8), 0.1), ones, ones)
    assert calls == {"item": 2, "cpu": 0}
    assert table.staging.allocations == 0


@pytest.mark.gpu
@needs_gpu
def test_on_a_gpu_host_inputs_go_through_pinned_buffers_reused_every_step() -> None:
    from streamrec.embedding_store.tiers.device_table import DeviceTable

    table = DeviceTable(TableOptions(name="t", dim=8), 3, device="cuda")
    keys = torch.arange(2000) * 7919
    ones = torch.ones(keys.numel())
    for _ in range(3):
        table.push(keys, torch.full((keys.numel(), 8), 0.1), ones, ones)
    assert table.staging.pin and table.staging.allocations == 4  # keys, grads, shows, clicks
    assert all(b.is_pinned() for b in table.staging._bufs.values())
    torch.testing.assert_close(table.inspect(keys[:5])["show"], torch.full((5,), 3.0))
    # inputs already on the GPU take no buffer
    table.push(keys.cuda(), torch.full((keys.numel(), 8), 0.1).cuda(), ones.cuda(), ones.cuda())
    assert table.staging.allocations == 4
