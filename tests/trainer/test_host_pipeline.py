"""The host side of a step ahead of it: batches read in order on one thread, prepared (the
keys' dedup) on a pool of workers sized to the machine (sparse_worker.prefetch_workers,
the sampler's Prefetcher with ``workers``), results in order, a pass trained the same."""

from __future__ import annotations

import threading

import pytest
import torch
from streamrec import layout
from streamrec.sampler import Prefetcher
from streamrec.trainer.runner import OnlineTrainer
from streamrec.trainer.sparse_worker import (
    BUSY_THREADS,
    MAX_PREFETCH_WORKERS,
    host_cores,
    prefetch_workers,
)
from trainer_helpers import small_config, write_stream

DEADLINE_S = 10.0


def test_workers_run_side_by_side_and_results_keep_the_source_order():
    """Each group of 3 items meets at a barrier: it passes only if 3 calls run at once
    (one thread would time out there); the later items finish first, the order holds."""
    barrier = threading.Barrier(3, timeout=DEADLINE_S)
    names: set[str] = set()

    def fn(x: int) -> int:
        names.add(threading.current_thread().name)
        barrier.wait()
        return x * 10

    with Prefetcher(range(9), fn, depth=3, workers=3) as p:
        assert list(p) == [x * 10 for x in range(9)]
    assert len(names) == 3 and all(n.startswith("streamrec-prefetch-fn") for n in names)


def test_calls_in_flight_are_bounded_by_depth_and_workers():
    """At most depth + 2 calls at once (the queue's, the one the consumer waits on, the
    reader's) and at most ``workers``: what a prefetch may hold in memory."""
    cond = threading.Condition()
    release = threading.Event()
    calls = {"active": 0, "peak": 0}

    def fn(x: int) -> int:
        with cond:
            calls["active"] += 1
            calls["peak"] = max(calls["peak"], calls["active"])
            cond.notify_all()
        release.wait(DEADLINE_S)
        with cond:
            calls["active"] -= 1
        return x

    for depth, workers, full in ((2, 8, 3), (16, 2, 2)):
        calls["peak"] = 0
        release.clear()
        with Prefetcher(range(50), fn, depth=depth, workers=workers) as p:
            with cond:  # before the consumer takes any: the queue's and the reader's
                assert cond.wait_for(lambda n=full: calls["active"] == n, DEADLINE_S)
            release.set()
            assert list(p) == list(range(50))
        assert full <= calls["peak"] <= min(depth + 2, workers)


def test_an_error_is_raised_at_its_batch_after_the_earlier_ones():
    def fn(x: int) -> int:
        if x == 5:
            raise ValueError("bad batch 5")
        return x

    got = []
    with pytest.raises(ValueError, match="bad batch 5"), Prefetcher(range(20), fn, 4, 3) as p:
        for y in p:
            got.append(y)
    assert got == [0, 1, 2, 3, 4]

    def source():
        yield from range(4)
        raise OSError("disk gone after batch 3")

    got = []
    with pytest.raises(OSError, match="disk gone"), Prefetcher(source(), lambda x: x, 2, 3) as p:
        for y in p:
            got.append(y)
    assert got == [0, 1, 2, 3]


def test_close_stops_the_reader_and_the_workers():
    p = Prefetcher(iter(range(10**9)), lambda x: x, depth=2, workers=3)
    assert next(p) == 0 and next(p) == 1
    p.close()
    assert not p._thread.is_alive()
    alive = [t for t in threading.enumerate() if t.name.startswith("streamrec-prefetch")]
    assert alive == []
    with pytest.raises(StopIteration):
        next(p)
    with pytest.raises(ValueError, match="workers must be >= 1"):
        Prefetcher(range(3), lambda x: x, workers=0)


@pytest.mark.parametrize(
    ("device", "cores", "local_ranks", "workers"),
    [
        ("cpu", 64, 1, 1),  # a CPU model's cores are its gemms'
        ("cuda", 16, 1, MAX_PREFETCH_WORKERS),  # a GPU host's idle cores, up to the cap
        ("cuda", 5, 1, 5 - BUSY_THREADS),  # less the training loop and the sparse worker
        ("cuda", 2, 1, 1),  # never none
        ("cuda", 16, 8, 1),  # 8 ranks on the node: 2 cores each, both busy
        ("cuda", 16, 4, 4 - BUSY_THREADS),
    ],
)
def test_the_pool_is_sized_to_the_rank_share_of_the_host(device, cores, local_ranks, workers):
    assert prefetch_workers(device, cores, local_ranks) == workers


def test_the_node_ranks_and_cores_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert prefetch_workers("cuda", cores=16) == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert prefetch_workers("cuda") == max(1, min(MAX_PREFETCH_WORKERS, host_cores() - 2))
    assert host_cores() >= 1


def _train(tmp_path, workers: int) -> tuple[dict[str, torch.Tensor], list[torch.Tensor], set]:
    """A predicted and trained pass with its batches prepared on ``workers`` threads: the
    dense state, every table's rows in key order, and the threads that prepared."""
    stream = write_stream(tmp_path / "data", days=1, samples=3000)
    cfg = small_config(stream, tmp_path / "m", checkpoint_per_pass=0, train_batch_size=64)
    spec = next(layout.iter_passes("20190720", "20190720", 720, 1))
    threads: set[str] = set()
    with OnlineTrainer(cfg) as t:
        assert t.prefetch_workers == 1  # a CPU model: on the reading thread
        t.prefetch_workers = workers  # as a GPU rank's pool (the step stays on the CPU)
        prepare = t._prepare

        def recorded(batch):
            threads.add(threading.current_thread().name)
            return prepare(batch)

        t._prepare = recorded  # type: ignore[method-assign]
        t.run_pass(spec)
        dense = {k: v.clone() for k, v in t.dense.state_dict().items()}
        rows = []
        for table in t.tables:
            keys, full = t.store.tier(table.name).contents()
            order = torch.argsort(keys)
            rows += [keys[order].clone(), full[order].clone()]
    return dense, rows, threads


def test_a_pass_prepared_on_a_pool_trains_the_model_of_one_thread(tmp_path):
    """Same batches in the same order, the same store calls: the same model to the last bit."""
    dense_one, rows_one, threads_one = _train(tmp_path / "one", 1)
    dense_pool, rows_pool, threads_pool = _train(tmp_path / "pool", 3)
    assert threads_one == {"streamrec-prefetch"}
    assert len(threads_pool) > 1 and all(
        n.startswith("streamrec-prefetch-fn") for n in threads_pool
    )
    assert rows_one[0].numel() > 100 and len(rows_one) == len(rows_pool)
    for a, b in zip(rows_one, rows_pool, strict=True):
        assert torch.equal(a, b)
    assert dense_one.keys() == dense_pool.keys()
    for k in dense_one:
        assert torch.equal(dense_one[k], dense_pool[k]), k
