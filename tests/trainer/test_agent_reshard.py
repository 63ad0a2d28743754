"""A job through REST across a change of the store's shard count (2 -> 3).

The job trains pass 1 on two store shards (a checkpoint after it) and is stopped over REST;
the shards go and three come up at the deployment's endpoints (the first two the same, as a
StatefulSet scaled, or ``streamrec up --store-shards 3`` after a stop); a trainer group told
of the three starts the job again over REST. It goes on from its checkpoint on three shards
(the checkpoint resharded 2 -> 3, an event naming it), every row of the checkpoint in place,
then trains pass 2: each pass done once.
"""

from __future__ import annotations

import json
import sys
import tempfile
import uuid
from pathlib import Path

import numpy as np
import pytest
from agent_helpers import SMALL_MODEL, agent_args, alive, datagen, small_job, started_job
from api_helpers import make_api
from servers import wait_for
from streamrec.process import spawn, stop_process

pytestmark = pytest.mark.slow


def agent(redis_url: str, job_id: str, log: Path, roots: dict, endpoints: list[str]):
    """An agent that trusts exactly ``endpoints`` as the store's shards (the deployment's)."""
    trust = ["--model-root", str(roots["model"]), "--data-root", str(roots["data"])]
    for e in endpoints:
        trust += ["--store-endpoint", e]
    return spawn(
        [sys.executable, "-m", "streamrec.trainer.agent", *agent_args(redis_url, job_id), *trust],
        log=log,
        die_with_parent=True,
    )


@pytest.mark.timeout(170)
def test_a_job_goes_on_from_its_checkpoint_after_the_store_went_from_2_to_3_shards(
    redis_server, roots, tmp_path
):
    from streamrec.control.trainer_config import TrainerConfig
    from streamrec.embedding_store import EmbeddingStore, EmbeddingStoreClient, LocalShards
    from streamrec.trainer.store_tables import build_table_options

    template = f"ipc://{tempfile.gettempdir()}/streamrec-reshard-{uuid.uuid4().hex[:8]}-{{shard}}"
    endpoints = [template.format(shard=k) for k in range(3)]
    tables = build_table_options(TrainerConfig.parse(SMALL_MODEL))
    (tmp_path / "tables.json").write_text(
        json.dumps({"tables": [t.model_dump(mode="json") for t in tables]})
    )
    data, model = roots["data"] / "reshard", roots["model"] / "reshard"
    datagen(data, max_splits=1)  # pass 1's split only, for now
    api = make_api(redis_server.url, roots, store_endpoints=endpoints)
    api.start()
    try:
        with api.http() as client:
            with LocalShards(tmp_path / "tables.json", 2, endpoint=template) as two:
                assert two.endpoints == endpoints[:2]
                body = small_job("reshard", data, model, store={"endpoints": endpoints[:2]})
                job_id = started_job(client, body)
                log_a = tmp_path / "agent-a.log"
                first = agent(redis_server.url, job_id, log_a, roots, endpoints[:2])
                try:
                    wait_for(
                        lambda: (
                            alive(first, log_a)
                            or client.get(f"/v1/jobs/{job_id}").json()["last_checkpoint"]
                            == "20190720/1"
                        ),
                        timeout=90,
                        interval=0.2,
                        what="pass 1 and its checkpoint",
                    )
                    assert client.post(f"/v1/jobs/{job_id}/stop").status_code == 200
                    wait_for(
                        lambda: client.get(f"/v1/jobs/{job_id}").json()["state"] == "stopped",
                        timeout=30,
                        interval=0.2,
                        what="job stopped",
                    )
                finally:
                    stop_process(first)
            # what the checkpoint holds, read by one in-process store
            saved = EmbeddingStore(tables)
            saved.load(str(model / "20190720" / "1" / "sparse"))
            parts = sorted((model / "20190720" / "1" / "sparse").glob("shard-*-of-2"))
            assert len(parts) == 2
            saved_keys = {
                t: np.concatenate([np.load(p / f"{t}.keys.npy") for p in parts])
                for t in saved.tables
            }
            with LocalShards(tmp_path / "tables.json", 3, endpoint=template) as three:
                assert three.endpoints == endpoints
                log_b = tmp_path / "agent-b.log"
                second = agent(redis_server.url, job_id, log_b, roots, endpoints)
                try:
                    assert client.post(f"/v1/jobs/{job_id}/start").status_code == 200
                    up = wait_for(
                        lambda: (
                            alive(second, log_b)
                            or next(
                                (
                                    e
                                    for e in events(client, job_id)
                                    if e["type"] == "trainer" and e["data"].get("resumed_from")
                                ),
                                None,
                            )
                        ),
                        timeout=60,
                        interval=0.2,
                        what="the group up from the checkpoint",
                    )
                    assert up["data"]["resharded"] == "2 -> 3", up
                    assert "checkpoint 20190720/1 resharded 2 -> 3 shards" in up["message"], up
                    # every row of the checkpoint in place, each on the shard it routes to
                    with EmbeddingStoreClient(endpoints, namespace=job_id) as store:
                        for t, keys in saved_keys.items():
                            assert keys.size and store.size(t) == keys.size
                            np.testing.assert_array_equal(
                                store.pull(t, keys, create=False).numpy().view(np.int32),
                                saved.pull(t, keys, create=False).numpy().view(np.int32),
                            )
                    datagen(data)  # pass 2's split lands
                    job = wait_for(
                        lambda: (
                            alive(second, log_b)
                            or (j := client.get(f"/v1/jobs/{job_id}").json())["state"]
                            in ("succeeded", "failed")
                            and j
                        ),
                        timeout=90,
                        interval=0.2,
                        what="job finished",
                    )
                finally:
                    stop_process(second)
            assert job["state"] == "succeeded", job
            assert (job["passes_done"], job["last_checkpoint"]) == (2, "20190720/2"), job
            passes = client.get(f"/v1/jobs/{job_id}/passes").json()["data"]
            assert [(p["pass_id"], p["state"]) for p in passes] == [(1, "done"), (2, "done")]
            assert not [e for e in events(client, job_id) if e["type"] == "rollback"]
            records = [json.loads(x) for x in (model / "passes.jsonl").read_text().splitlines()]
            assert [r["pass_id"] for r in records] == [1, 2]
            assert not [r for r in records if r.get("rolled_back")]
            assert "resharded 2 -> 3" in log_b.read_text()
            saved.close()
    finally:
        api.stop()


def events(client, job_id: str) -> list[dict]:
    return client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
