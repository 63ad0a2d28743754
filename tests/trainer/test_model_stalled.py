"""A stalled model is visible, live: the real trainer agent trains a job over REST whose one
dense feature (values about 1e6) is fed unnormalized (``normalize: false``), which kills the
model: every row at one probability. Its pass records say so (``passes.jsonl``), the API has
the ``predictions_collapsed`` event and ``streamrec_api_pass_predictions_collapsed`` 1, and a
real Prometheus scraping the API with the generated rules fires ``StreamRecModelStalled``
for it. The same job with the feature normalized trains: the gauge 0, no event, no alert."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from agent_helpers import finished, run_agent, small_job, started_job
from api_helpers import free_port
from servers import parse_metrics, wait_for
from streamrec.observability import alerts
from streamrec.process import spawn, stop_process

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
GAUGE = "streamrec_api_pass_predictions_collapsed"
ALERT = "StreamRecModelStalled"


def write_big_dense(root: Path, samples: int = 1500) -> None:
    """Two splits of day 20190720 (Parquet): the click follows the user (50 users with hidden
    weights) and a little the dense ``big``, uniform in [0.5e6, 1.5e6]."""
    w = np.random.default_rng(0).normal(0.0, 1.5, 50)
    for s, split in enumerate(("0000", "1200")):
        rng = np.random.default_rng(s + 1)
        user = rng.integers(0, 50, samples)
        big = rng.uniform(0.5, 1.5, samples)
        logit = w[user] + 2.0 * (big - 1.0)
        click = (rng.random(samples) < 1 / (1 + np.exp(-logit))).astype(np.int64)
        d = root / "20190720" / split
        d.mkdir(parents=True)
        cols = {"click": click, "big": big * 1e6, "user_id": [f"u{u}" for u in user]}
        pq.write_table(pa.table(cols), d / "part-00000")
        (d / "to.hadoop.done").write_text("")


def big_dense_job(name: str, data: Path, model: Path, normalize: bool) -> dict:
    body = small_job(name, data, model)
    schema = {
        "label": "click",
        "dense": [{"name": "big", "normalize": normalize}],
        "sparse": [{"name": "user_id"}],
    }
    body["data"] |= {"data_format": "parquet", "schema": schema}
    # PaddleRec's sparse rule, the trainer's default before torch's Adagrad: under it the raw
    # 1e6 kills the model on its first pass; torch's larger first steps on the user rows can
    # keep a few rows apart (the saturation is what is under test here, not the rule)
    rule = {"name": "StdAdaGradSGDRule", "learning_rate": 0.05, "initial_g2sum": 3.0}
    body.setdefault("store", {})["table_parameters"] = {
        "embed_sgd_param": rule,
        "embedx_sgd_param": rule,
    }
    body["model"] = {
        "runner": {"train_batch_size": 128},
        "hyper_parameters": {
            "arch_sparse_feature_size": 4,
            "arch_mlp_bot": "1-16-4",
            "arch_mlp_top": "8-1",
            "learning_rate": 0.05,
        },
    }
    return body


class Prometheus:
    """A real Prometheus scraping the API every second with the generated alert rules."""

    def __init__(self, api_url: str, tmp: Path) -> None:
        port = free_port()
        rules = tmp / "alerts.rules.yml"
        shutil.copy(ROOT / alerts.RULES_FILE, rules)
        (tmp / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: ['{rules}']\n"
            "scrape_configs:\n"
            "  - job_name: streamrec-api\n"
            f"    static_configs: [{{targets: ['{api_url.removeprefix('http://')}']}}]\n"
        )
        self.proc = spawn(
            [
                PROMETHEUS,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            log=tmp / "prometheus.log",
            die_with_parent=True,
        )
        self.url = f"http://127.0.0.1:{port}"

    def query(self, q: str) -> list[dict]:
        try:
            resp = httpx.get(f"{self.url}/api/v1/query", params={"query": q}, timeout=2)
        except httpx.TransportError:
            return []
        return resp.json()["data"]["result"] if resp.status_code == 200 else []

    def stop(self) -> None:
        stop_process(self.proc, timeout_s=20)


def run_job(client, redis_url: str, body: dict, log: Path) -> tuple[str, dict]:
    """Runs ``body`` to its end with one real agent; returns the job id and the job."""
    job_id = started_job(client, body)
    agent = run_agent(redis_url, job_id, log)
    try:
        job = finished(client, job_id, agent, log, timeout=180)
    finally:
        stop_process(agent)
    return job_id, job


def collapse_events(client, job_id: str) -> list[dict]:
    data = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    return [e for e in data if e["type"] == "predictions_collapsed"]


def passes_log(model: Path) -> list[dict]:
    (path,) = model.rglob("passes.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_saturated_model_is_an_event_a_metric_and_a_firing_alert(
    client, api, roots, redis_server, tmp_path
):
    data = roots["data"] / "big-dense"
    write_big_dense(data)
    prom = Prometheus(api.url, tmp_path)
    try:
        # healthy: the same data with the feature standardized
        model_ok = roots["model"] / "big-dense-normalized"
        healthy, job = run_job(
            client,
            redis_server.url,
            big_dense_job("normalized", data, model_ok, normalize=True),
            tmp_path / "healthy.log",
        )
        assert job["state"] == "succeeded", job
        records = passes_log(model_ok)
        assert [r["predictions_collapsed"] for r in records] == [False, False], records
        assert collapse_events(client, healthy) == []
        metrics = parse_metrics(client.get("/metrics").text)
        assert metrics[f'{GAUGE}{{job_id="{healthy}"}}'] == 0.0

        # stalled: 1e6 fed as it is kills the model after its first pass
        model_bad = roots["model"] / "big-dense-raw"
        stalled, job = run_job(
            client,
            redis_server.url,
            big_dense_job("raw", data, model_bad, normalize=False),
            tmp_path / "stalled.log",
        )
        assert job["state"] == "succeeded", job  # it trains on: only the figures tell
        last = passes_log(model_bad)[-1]
        assert last["predictions_collapsed"] and last["predict_collapsed"], last
        assert last["predict_top_share"] >= 0.99 and last["predict_auc"] == 0.5, last
        (event,) = collapse_events(client, stalled)
        assert event["data"]["pass"] == "20190720/2"
        assert "predict: 100.0% of rows at one probability, AUC 0.5000" in event["message"]
        metrics = parse_metrics(client.get("/metrics").text)
        assert metrics[f'{GAUGE}{{job_id="{stalled}"}}'] == 1.0

        # Prometheus: both gauges scraped, the rule evaluated on them: one alert, the stalled
        # job's
        wait_for(
            lambda: len(prom.query(f'{GAUGE}{{job_id=~"{healthy}|{stalled}"}}')) == 2,
            timeout=60,
            interval=0.5,
            what="both jobs' gauges scraped",
        )
        firing = wait_for(
            lambda: prom.query(f'ALERTS{{alertname="{ALERT}", alertstate="firing"}}'),
            timeout=60,
            interval=0.5,
            what=f"{ALERT} firing",
        )
        assert [a["metric"]["job_id"] for a in firing] == [stalled], firing
        assert firing[0]["metric"]["severity"] == "critical"
    finally:
        prom.stop()
