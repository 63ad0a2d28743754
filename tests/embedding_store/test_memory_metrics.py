"""A shard's memory in its /metrics: its resident bytes against its memory limit (the store
near capacity alert divides them), and the process collector's series."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from servers import scrape_metrics
from streamrec.embedding_store import EmbeddingStoreClient, LocalShards
from streamrec.embedding_store.service.metrics import memory_limit_bytes, resident_bytes

TABLES = [
    {
        "name": "user",
        "embedx_dim": 8,
        "embedx_threshold": 0,
        "embed_sgd_param": {"name": "naive", "learning_rate": 0.1},
        "embedx_sgd_param": {"name": "naive", "learning_rate": 0.1},
    }
]
MEMINFO = "MemTotal:       16384 kB\nMemFree:         1024 kB\n"


def test_a_shard_exports_its_resident_bytes_and_limit(tmp_path: Path) -> None:
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps({"tables": TABLES}))
    with LocalShards(str(tables), 2, metrics=True) as shards:
        for k, port in enumerate(shards.metrics_ports):
            assert port is not None
            got = scrape_metrics(port)
            shard = f'shard="{k}-of-2"'
            resident = got[f"streamrec_embedding_store_resident_bytes{{{shard}}}"]
            limit = got[f"streamrec_embedding_store_memory_limit_bytes{{{shard}}}"]
            assert 0 < resident < limit
            assert limit == memory_limit_bytes()  # the shard runs in this cgroup
            # the process collector of the shard's own registry: the same process's RSS
            assert got["process_resident_memory_bytes"] == pytest.approx(resident, rel=0.5)
            assert got["process_cpu_seconds_total"] > 0
        # rows arriving grow the shard's resident memory
        port = shards.metrics_ports[0]
        assert port is not None
        before = scrape_metrics(port)['streamrec_embedding_store_resident_bytes{shard="0-of-2"}']
        with EmbeddingStoreClient(shards.endpoints, timeout_s=60) as client:
            client.pull("user", torch.arange(400_000, dtype=torch.int64))
        after = scrape_metrics(port)['streamrec_embedding_store_resident_bytes{shard="0-of-2"}']
        assert after > before


def test_the_limit_is_the_cgroups_else_the_machines(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    v2 = tmp_path / "memory.max"
    v1 = tmp_path / "memory.limit_in_bytes"
    # no cgroup file: the machine's memory
    assert memory_limit_bytes((v2, v1), meminfo) == 16384 * 1024
    # cgroup v2 without a limit says "max"
    v2.write_text("max\n")
    assert memory_limit_bytes((v2, v1), meminfo) == 16384 * 1024
    v2.write_text(f"{4 << 20}\n")
    assert memory_limit_bytes((v2, v1), meminfo) == 4 << 20
    # cgroup v1 without a limit: a huge number, larger than the machine
    v2.unlink()
    v1.write_text(f"{(1 << 63) - 4096}\n")
    assert memory_limit_bytes((v2, v1), meminfo) == 16384 * 1024
    v1.write_text(f"{8 << 20}\n")
    assert memory_limit_bytes((v2, v1), meminfo) == 8 << 20


def test_resident_bytes_reads_statm_pages(tmp_path: Path) -> None:
    statm = tmp_path / "statm"
    statm.write_text("1000 250 100 1 0 300 0\n")
    assert resident_bytes(statm) == 250 * os.sysconf("SC_PAGE_SIZE")
    assert resident_bytes() > 0
