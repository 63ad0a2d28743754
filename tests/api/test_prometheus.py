"""A real Prometheus (/usr/bin/prometheus) scrapes the API's /metrics; queries see the jobs."""

from __future__ import annotations

import shutil

import httpx
import pytest
from api_helpers import free_port, job_body
from servers import wait_for
from streamrec.process import spawn, stop_process

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


@pytest.mark.timeout(120)
def test_prometheus_scrapes_api_metrics(api, client, roots, tmp_path):
    job = client.post("/v1/jobs", json=job_body(roots, "prom")).json()
    client.post(f"/v1/jobs/{job['id']}/start")
    client.post("/v1/jobs", json=job_body(roots, "prom2"))
    port = free_port()
    host_port = api.url.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: streamrec-api\n"
        f"    static_configs: [{{targets: ['{host_port}']}}]\n"
    )
    proc = spawn(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        die_with_parent=True,
    )
    base = f"http://127.0.0.1:{port}"

    def query(q: str) -> list:
        try:
            resp = httpx.get(f"{base}/api/v1/query", params={"query": q}, timeout=2)
        except httpx.TransportError:
            return []
        return resp.json()["data"]["result"] if resp.status_code == 200 else []

    try:
        up = wait_for(
            lambda: query('up{job="streamrec-api"}'), timeout=60, interval=0.5, what="first scrape"
        )
        assert up[0]["value"][1] == "1"
        by_state = wait_for(
            lambda: {
                r["metric"]["state"]: float(r["value"][1]) for r in query("streamrec_api_jobs")
            },
            timeout=30,
            interval=0.5,
            what="jobs gauge",
        )
        assert by_state["running"] == 1 and by_state["created"] == 1
        assert by_state["succeeded"] == 0
        leader = query("streamrec_api_scheduler_leader")
        assert leader and leader[0]["value"][1] == "1"
        reqs = query('sum(streamrec_api_requests_total{route="/v1/jobs",method="POST"})')
        assert reqs and float(reqs[0]["value"][1]) == 2
        assert query("streamrec_api_request_seconds_count")  # the histogram, unit in its name
    finally:
        stop_process(proc, timeout_s=20)
