"""GPU memory of a store shard, read from torch.cuda at scrape time (no exporter)."""

from __future__ import annotations

import pytest
import torch
from streamrec.embedding_store.service.metrics import PREFIX, StoreMetrics


def gpu_samples(metrics: StoreMetrics) -> dict[str, float]:
    return {
        s.name: s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name.startswith(f"{PREFIX}_gpu_")
    }


@pytest.mark.skipif(torch.cuda.is_initialized(), reason="CUDA already initialised here")
def test_a_shard_that_never_used_cuda_has_no_gpu_series_and_creates_no_context() -> None:
    metrics = StoreMetrics(None, "0-of-1")
    assert gpu_samples(metrics) == {}
    assert not torch.cuda.is_initialized()  # the scrape did not initialise CUDA


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_shard_holding_gpu_memory_exports_it() -> None:
    metrics = StoreMetrics(None, "0-of-1")
    block = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # 64 MiB
    samples = gpu_samples(metrics)
    total = samples[f"{PREFIX}_gpu_memory_total_bytes"]
    used = samples[f"{PREFIX}_gpu_memory_used_bytes"]
    allocated = samples[f"{PREFIX}_gpu_memory_allocated_bytes"]
    assert total == torch.cuda.get_device_properties(0).total_memory
    assert allocated >= block.numel() and used >= allocated and used <= total
    del block
