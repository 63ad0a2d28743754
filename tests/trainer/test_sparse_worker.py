"""runner.sparse_worker: the pulls and pushes inline on the training thread, or on their own."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from streamrec import layout
from streamrec.trainer.runner import OnlineTrainer
from streamrec.trainer.sparse_worker import InlineExecutor, runs_inline, sparse_executor
from trainer_helpers import small_config, write_stream


def test_inline_calls_run_at_submit_and_keep_their_errors_for_the_result():
    ex = InlineExecutor()
    ran: list[int] = []
    done = ex.submit(lambda x: ran.append(x) or x * 2, 21)
    assert ran == [21] and done.done() and done.result() == 42

    def fail() -> None:
        raise ValueError("bad batch")

    failed = ex.submit(fail)  # not raised here: where the loop takes the result
    with pytest.raises(ValueError, match="bad batch"):
        failed.result()


@pytest.mark.parametrize(
    ("setting", "device", "in_process", "inline"),
    [
        ("auto", "cpu", True, True),
        ("auto", "cpu", False, False),  # a shard's reply is a wait: overlap it
        ("auto", "cuda", True, False),  # a GPU step leaves the host idle
        ("inline", "cuda", False, True),
        ("thread", "cpu", True, False),
    ],
)
def test_auto_runs_inline_only_for_a_cpu_model_with_its_store_in_process(
    setting, device, in_process, inline
):
    assert runs_inline(setting, device, in_process) is inline
    ex = sparse_executor(setting, device, in_process)
    assert isinstance(ex, InlineExecutor if inline else ThreadPoolExecutor)
    ex.shutdown()


def _train(tmp_path, worker: str) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    stream = write_stream(tmp_path / "data", days=1, samples=3000)
    cfg = small_config(
        stream, tmp_path / f"m-{worker}", checkpoint_per_pass=0, sparse_worker=worker
    )
    spec = next(layout.iter_passes("20190720", "20190720", 720, 1))
    with OnlineTrainer(cfg) as t:
        assert isinstance(t._pool, InlineExecutor) is (worker == "inline")
        t.run_pass(spec)
        dense = {k: v.clone() for k, v in t.dense.state_dict().items()}
        rows = []
        for table in t.tables:  # every row of every table, in key order
            keys, full = t.store.tier(table.name).contents()
            order = torch.argsort(keys)
            rows += [keys[order].clone(), full[order].clone()]
    return dense, rows


def test_inline_and_threaded_passes_train_the_same_model(tmp_path):
    """Both run pull(i + 1) before push(i): the same store calls in the same order."""
    dense_inline, rows_inline = _train(tmp_path / "a", "inline")
    dense_thread, rows_thread = _train(tmp_path / "b", "thread")
    assert rows_inline[0].numel() > 100  # the pass created and trained rows
    assert len(rows_inline) == len(rows_thread)
    for a, b in zip(rows_inline, rows_thread, strict=True):
        assert torch.equal(a, b)
    assert dense_inline.keys() == dense_thread.keys()
    for k in dense_inline:
        assert torch.equal(dense_inline[k], dense_thread[k]), k
