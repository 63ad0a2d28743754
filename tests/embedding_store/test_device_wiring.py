"""``tier="device"`` and the GPU cache wired through the store, the shard process and the
trainer's in-process store (docs/design-notes.md, "The embedding store on a GPU").

Without a GPU: each refuses with a message naming the tier (or option) and that it needs a
CUDA GPU; the shard process exits nonzero saying so. The store and the shard serve the device
tier on the CPU build of the kernels (``device="cpu"``, ``--device cpu``) everywhere, and on a
GPU (``gpu``); the trainer pulls rows as CUDA tensors from an in-process device store only on a
GPU (what it checks is the handover of CUDA tensors).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from streamrec.embedding_store import EmbeddingStore, TableOptions
from streamrec.embedding_store.errors import TierUnavailable
from streamrec.embedding_store.tiers.device_table import DeviceTable
from streamrec.errors import BadRequest
from streamrec.process import bin_path, free_port

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU; none present"
)
#: the CPU build of the kernels everywhere; the GPU where there is one
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_gpu])]
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
DIM = 4


def options(name: str = "t") -> TableOptions:
    return TableOptions(name=name, dim=DIM, embedx_threshold=0)


def tables_file(tmp_path: Path) -> Path:
    path = tmp_path / "tables.json"
    path.write_text(json.dumps([{"name": "t", "dim": DIM}]))
    return path


def serve(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Runs a shard until it exits (a refused start exits at once; 60 s is the deadline)."""
    return subprocess.run(
        [
            bin_path("streamrec-embedding-store"),
            "serve",
            "--shard-id",
            "0",
            "--num-shards",
            "1",
            "--endpoint",
            f"tcp://127.0.0.1:{free_port()}",
            "--tables",
            str(tables_file(tmp_path)),
            "--insecure-no-auth",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# ---- without a GPU ---------------------------------------------------------------------------
@no_gpu
def test_store_tier_device_says_it_needs_a_gpu() -> None:
    with pytest.raises(TierUnavailable, match="device tier needs a CUDA GPU"):
        EmbeddingStore([options()], tier="device")
    # admission options would be refused too, but the missing GPU is what is said first
    with pytest.raises(TierUnavailable, match="needs a CUDA GPU"):
        EmbeddingStore([TableOptions(name="t", dim=DIM, admission_probability=0.5)], tier="device")


@no_gpu
def test_shard_process_with_tier_device_exits_saying_it_needs_a_gpu(tmp_path: Path) -> None:
    done = serve(tmp_path, "--tier", "device")
    assert done.returncode == 2, done.stderr
    assert "READY" not in done.stdout
    assert "device tier needs a CUDA GPU" in done.stderr, done.stderr


@no_gpu
def test_shard_process_with_a_gpu_cache_exits_saying_it_needs_a_gpu(tmp_path: Path) -> None:
    done = serve(tmp_path, "--gpu-cache-budget-mb", "16")
    assert done.returncode == 2, done.stderr
    assert "READY" not in done.stdout
    assert "gpu_cache_budget_mb" in done.stderr and "needs a CUDA GPU" in done.stderr


def test_shard_refuses_a_gpu_cache_on_tier_device_by_name(tmp_path: Path) -> None:
    done = serve(tmp_path, "--tier", "device", "--gpu-cache-budget-mb", "16")
    assert done.returncode == 2, done.stderr
    assert "gpu_cache_budget_mb caches rows of tier 'host' or 'ssd'" in done.stderr


def test_a_device_with_nothing_to_place_is_refused_by_name(tmp_path: Path) -> None:
    done = serve(tmp_path, "--device", "cpu")
    assert done.returncode == 2, done.stderr
    assert "device 'cpu' places the rows of tier 'device' or of the GPU cache" in done.stderr
    with pytest.raises(BadRequest, match="device 'cuda:1' places the rows of tier 'device'"):
        EmbeddingStore([options()], device="cuda:1")
    with pytest.raises(BadRequest, match="device"):
        EmbeddingStore([options()], tier="device", device="tpu")


def test_a_host_store_has_no_resident_device_and_pulls_to_the_cpu() -> None:
    store = EmbeddingStore([options()])
    assert store.resident_device() is None
    keys = torch.tensor([3, 1, 3])
    assert torch.equal(store.pull("t", keys, device="cpu"), store.pull("t", keys))
    cached = EmbeddingStore([options()], gpu_cache_budget_mb=1.0, gpu_cache_device="cpu")
    assert cached.resident_device() is None  # a cache in RAM is no device


def trainer_config(tier: str | None) -> object:
    from streamrec.control.trainer_config import TrainerConfig

    return TrainerConfig.parse(
        {
            "runner": {"train_data_dir": "/nonexistent", "model_save_path": "/nonexistent"},
            "hyper_parameters": {
                "sparse_inputs_slots": 2,
                "arch_sparse_feature_size": DIM,
                "arch_mlp_bot": f"13-{DIM}",
                "arch_mlp_top": "4-1",
            },
            "store": {"tier": tier},
        }
    )


@no_gpu
def test_trainer_in_process_device_store_needs_a_gpu() -> None:
    from streamrec.trainer.errors import ConfigError
    from streamrec.trainer.store_tables import build_table_options, make_store

    config = trainer_config("device")
    with pytest.raises(ConfigError, match="store.tier is 'device'.*needs a CUDA GPU"):
        make_store(config, build_table_options(config))  # type: ignore[arg-type]


def test_trainer_in_process_host_store_is_unchanged() -> None:
    from streamrec.trainer.sparse import SparseTables
    from streamrec.trainer.store_tables import build_table_options, make_store

    config = trainer_config(None)
    store = make_store(config, build_table_options(config))  # type: ignore[arg-type]
    assert store.stats()["tier"] == "host"
    assert SparseTables(store, config.table_names, DIM).device is None  # type: ignore[attr-defined]
    store.close()


# ---- on the CPU build of the kernels, and on a GPU -------------------------------------------
@pytest.mark.parametrize("where", DEVICES)
def test_store_tier_device_matches_the_host_tier_and_pulls_to_its_device(where: str) -> None:
    host = EmbeddingStore([options()], seed=3)
    device = EmbeddingStore([options()], seed=3, tier="device", device=where)
    assert isinstance(device.tier("t"), DeviceTable)
    resident = torch.device("cuda", torch.cuda.current_device()) if where == "cuda" else None
    assert device.resident_device() == resident  # the CPU build's rows are in host memory
    keys = torch.tensor([5, 9, 5, -(2**63), 2**63 - 1])
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        torch.testing.assert_close(device.pull("t", keys), host.pull("t", keys))
        grads = torch.randn(keys.numel(), DIM, generator=g)
        host.push("t", keys, grads)
        device.push("t", keys, grads)
    pulled = device.pull("t", keys, device=where)
    assert pulled.device.type == where
    torch.testing.assert_close(pulled.cpu(), host.pull("t", keys))
    assert device.stats()["tier"] == "device"


@pytest.mark.parametrize("where", DEVICES)
@pytest.mark.parametrize("tier", ["device", "host"])
def test_shard_process_serves_the_device_tier_and_the_gpu_cache(
    tmp_path: Path, where: str, tier: str
) -> None:
    """``--tier device`` or ``--gpu-cache-budget-mb`` on ``--device``: served, and the
    stats say where the rows are."""
    from streamrec.embedding_store import EmbeddingStoreClient, LocalShards

    tables = tables_file(tmp_path)
    extra = ["--tier", tier, "--device", where]
    if tier == "host":
        extra += ["--gpu-cache-budget-mb", "1"]
    with LocalShards(tables, 1, extra_args=extra) as shards:
        client = EmbeddingStoreClient(shards.endpoints, timeout_s=30)
        keys = torch.tensor([1, 2, 3, 2])
        w = client.pull("t", keys)
        client.push("t", keys, torch.ones(4, DIM))
        assert not torch.equal(client.pull("t", keys), w)
        shard = client.stats()["shards"][0]
        assert shard["tier"] == tier
        if tier == "host":
            assert shard["tables"]["t"]["gpu_cache_hits"] > 0
        client.close()


# ---- on a GPU only: CUDA tensors handed to the trainer -----------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="checks CUDA tensors handed to the trainer: needs a CUDA GPU; none present",
)
@pytest.mark.parametrize("cache", [False, True])
def test_trainer_sparse_tables_pull_cuda_tensors_from_an_in_process_gpu_store(
    cache: bool,
) -> None:
    from streamrec.trainer.data.batches import Batch
    from streamrec.trainer.sparse import SparseTables

    names = ["a", "b"]
    host = EmbeddingStore([options(n) for n in names], seed=1)
    gpu = (
        EmbeddingStore([options(n) for n in names], seed=1, gpu_cache_budget_mb=1.0)
        if cache
        else EmbeddingStore([options(n) for n in names], seed=1, tier="device")
    )
    ref, on_gpu = SparseTables(host, names, DIM), SparseTables(gpu, names, DIM)
    assert ref.device is None and on_gpu.device is not None
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        keys = torch.randint(0, 50, (32, 2), generator=g)
        labels = (torch.rand(32, generator=g) > 0.5).float()
        batch = Batch(torch.zeros(32, 13), labels, keys, None)
        outs = []
        for sp in (ref, on_gpu):
            sb = sp.pull(sp.prepare(batch), create=True)
            ly = sp.forward(sb)
            ly.sum().backward()
            sp.push(sb, labels)
            outs.append(ly)
        assert outs[1].is_cuda and not outs[0].is_cuda
        torch.testing.assert_close(outs[1].cpu(), outs[0].detach())
