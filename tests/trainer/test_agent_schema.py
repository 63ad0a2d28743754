"""A data.schema job over REST, trained by the real trainer agent: Parquet and slot text
with a list column and 2 dense features finish with per-pass AUCs; a Parquet file without
a schema column is a bad split under on_bad_split."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from agent_helpers import finished, run_agent, small_job, started_job
from streamrec.process import stop_process
from test_feature_data import SHARED, write_planted

MODEL = {
    "runner": {"train_batch_size": 128},
    "hyper_parameters": {
        "arch_sparse_feature_size": 4,
        "arch_mlp_bot": "2-16-4",
        "arch_mlp_top": "8-1",
        "learning_rate": 0.05,
    },
}


def schema_job(name: str, data, model, fmt: str) -> dict:
    body = small_job(name, data, model)
    body["data"] |= {"data_format": fmt, "schema": SHARED, "end_day": "20190721"}
    body["model"] = MODEL
    return body


def succeeded(client, redis_url: str, job_id: str, log: Path) -> None:
    """Runs the job to its end with one real agent; it must succeed."""
    agent = run_agent(redis_url, job_id, log)
    try:
        job = finished(client, job_id, agent, log)
        assert job["state"] == "succeeded", (job, log.read_text()[-3000:])
    finally:
        stop_process(agent)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("fmt", ["parquet", "slot"])
def test_a_schema_job_finishes_over_rest_with_pass_aucs(client, roots, redis_server, tmp_path, fmt):
    data, model = roots["data"] / f"schema-{fmt}", roots["model"] / f"schema-{fmt}"
    write_planted(data, fmt)
    job_id = started_job(client, schema_job(f"schema-{fmt}", data, model, fmt))
    succeeded(client, redis_server.url, job_id, tmp_path / "agent.log")
    passes = client.get(f"/v1/jobs/{job_id}/passes").json()["data"]
    assert len(passes) == 4
    for p in passes:
        assert p["samples"] == 1500 and isinstance(p["predict_auc"], float), p
    last = max(passes, key=lambda p: (p["day"], p["pass_id"]))
    assert last["predict_auc"] > 0.7, passes


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_parquet_file_without_a_schema_column_is_a_skipped_split(
    client, roots, redis_server, tmp_path
):
    data, model = roots["data"] / "schema-missing", roots["model"] / "schema-missing"
    write_planted(data, "parquet")
    part = data / "20190720" / "1200" / "part-00000"
    pq.write_table(pq.read_table(part).drop_columns(["genres"]), part)
    body = schema_job("schema-missing", data, model, "parquet")
    body["data"] |= {"on_bad_split": "skip", "end_day": "20190720"}
    job_id = started_job(client, body)
    succeeded(client, redis_server.url, job_id, tmp_path / "agent.log")
    p2 = client.get(f"/v1/jobs/{job_id}/passes/20190720/2").json()
    assert p2["skipped_splits"] == ["1200"], p2
    events = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    assert [e for e in events if e["type"] == "skip"], events
    # the failed attempt named the column (its event, or the agent's log)
    said = str(events) + (tmp_path / "agent.log").read_text()
    assert "no column 'genres'" in said, said[-3000:]
