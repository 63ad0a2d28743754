"""A store shard restarted empty under a trainer (as Kubernetes restarts a crashed pod): the
pass fails classified store_lost (the class the control plane acts on: back to the last
checkpoint), and loading that checkpoint is the recovery."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from servers import torchrun_command, wait_for
from streamrec.embedding_store import LocalShards
from streamrec.process import free_port, spawn, stop_process
from streamrec.trainer.errors import PassFailed
from streamrec.trainer.runner import OnlineTrainer
from streamrec.trainer.store_tables import build_table_options
from trainer_helpers import small_config

HERE = Path(__file__).parent
WORKER = "two_rank_restart_worker.py"


def tables_file(config, path: Path) -> Path:
    path.write_text(
        json.dumps({"tables": [t.model_dump(mode="json") for t in build_table_options(config)]})
    )
    return path


def test_a_pass_against_a_restarted_shard_fails_store_lost_and_the_checkpoint_recovers(
    tmp_path: Path, stream: Path
):
    config = small_config(stream, tmp_path / "model", end_day="20190720", checkpoint_per_pass=1)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with LocalShards(tables_file(config, tmp_path / "tables.json"), 1, endpoint=endpoint) as shards:
        remote = config.model_copy(
            update={"store": config.store.model_copy(update={"endpoints": shards.endpoints})}
        )
        with OnlineTrainer(remote) as t:
            first, second = t.passes_todo()
            record = t.run_pass(first)
            assert record["checkpoint"]
            rows = t.store.stats()["total"]["rows"]

            shards.kill(0)  # the pod crashes; its orchestrator starts it again, empty
            shards.start_shard(0)
            assert shards.endpoints == [endpoint]
            with pytest.raises(PassFailed) as info:
                t.run_pass(second)
            assert info.value.kind == "store_lost" and "ShardRestarted" in str(info.value)
            assert not t.clean and t.store.stats()["total"]["rows"] == 0

            t.load_checkpoint(first.day, first.pass_id)  # what the retry does
            assert t.store.stats()["total"]["rows"] == rows
            assert t.run_pass(second)["samples"] > 0

            shards.kill(0)  # no checkpoint to go back to: the agent goes on as the shards are
            shards.start_shard(0)
            assert t.accept_store_restarts() == [endpoint]
            assert t.run_pass(second)["samples"] > 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_ranks_fail_the_pass_and_both_train_on_after_the_checkpoint(
    tmp_path: Path, stream: Path
):
    """Rank 0 loads the checkpoint into the shards; rank 1's client takes the restarted
    shard's incarnation from rank 0 (without it, rank 1 would fail every pass)."""
    config = small_config(stream, tmp_path / "model", end_day="20190720", checkpoint_per_pass=1)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with LocalShards(tables_file(config, tmp_path / "tables.json"), 1, endpoint=endpoint) as shards:
        job = config.model_dump(mode="json")
        job["store"]["endpoints"] = shards.endpoints
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
        log = tmp_path / "group.log"
        group = spawn(
            torchrun_command(2, str(HERE / WORKER), str(tmp_path / "job.yaml"), str(tmp_path)),
            log=log,
            env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
            die_with_parent=True,
        )
        try:
            wait_for(
                lambda: all((tmp_path / f"rank{r}.ready").exists() for r in (0, 1)),
                120,
                0.1,
                what="both ranks ready",
                gone=lambda: None if group.poll() is None else "the group exited",
                detail=lambda: log.read_text()[-3000:],
            )
            shards.kill(0)
            shards.start_shard(0)
            (tmp_path / "restarted").touch()
            assert group.wait(timeout=120) == 0, log.read_text()[-6000:]
        finally:
            stop_process(group)
    outs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(o["failed"]["kind"] == "store_lost" for o in outs), outs
    assert all("ShardRestarted" in o["failed"]["message"] for o in outs), outs
    assert all(o["samples"] > 0 for o in outs), outs
