"""A pass whose predictions collapsed is visible (real API, real redis-server; the trainer's
reports sent as a trainer sends them): a ``predictions_collapsed`` event naming the pass, the
share and the AUC, and ``streamrec_api_pass_predictions_collapsed`` 1 for the job; a healthy
pass sets it 0 with no event, and deleting the job drops it."""

from __future__ import annotations

from api_helpers import SATURATED_PASS, job_body, land_split, report_pass
from servers import parse_metrics, wait_for

GAUGE = "streamrec_api_pass_predictions_collapsed"

SATURATED = SATURATED_PASS
HEALTHY = {
    **SATURATED,
    "predict_auc": 0.71,
    "train_auc": 0.73,
    "logloss": 0.52,
    "predicted_ctr": 0.27,
    "predict_top_share": 0.004,
    "predict_collapsed": False,
    "train_top_share": 0.003,
    "train_collapsed": False,
    "predictions_collapsed": False,
}


def events_of(client, job_id: str, kind: str) -> list[dict]:
    data = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    return [e for e in data if e["type"] == kind]


def gauge(client, job_id: str) -> float | None:
    return parse_metrics(client.get("/metrics").text).get(f'{GAUGE}{{job_id="{job_id}"}}')


def started(client, roots, name: str) -> str:
    for split in ("0000", "0600", "1200"):
        land_split(roots["data"] / name, "20190720", split)
    job_id = client.post("/v1/jobs", json=job_body(roots, name)).json()["id"]
    assert client.post(f"/v1/jobs/{job_id}/start").status_code == 200
    return job_id


def test_a_collapsed_pass_has_an_event_and_the_gauge_until_a_healthy_one(
    client, roots, redis_server
):
    job_id = started(client, roots, "collapsed")
    report_pass(redis_server.url, job_id, HEALTHY)
    wait_for(lambda: gauge(client, job_id) is not None, what="the gauge after pass 1")
    assert gauge(client, job_id) == 0.0
    assert events_of(client, job_id, "predictions_collapsed") == []

    report_pass(redis_server.url, job_id, SATURATED)
    (event,) = wait_for(
        lambda: events_of(client, job_id, "predictions_collapsed"), what="the collapse event"
    )
    assert event["data"]["pass"] == "20190720/2"
    assert event["data"]["train_top_share"] == 1.0 and event["data"]["train_auc"] == 0.5
    message = event["message"]
    assert message.startswith("pass 20190720/2: the model's predictions collapsed")
    assert "train: 100.0% of rows at one probability, AUC 0.5000" in message
    assert "predict: 100.0% of rows at one probability, AUC 0.5000" in message
    assert "predicted CTR 1.0000 against 0.2600 actual" in message
    assert gauge(client, job_id) == 1.0
    # written with the pass's own event, in its transaction: the pass is done when it shows
    assert client.get(f"/v1/jobs/{job_id}/passes/20190720/2").json()["state"] == "done"

    report_pass(redis_server.url, job_id, HEALTHY)
    wait_for(lambda: gauge(client, job_id) == 0.0, what="the gauge back to 0")
    assert len(events_of(client, job_id, "predictions_collapsed")) == 1


def test_a_fresh_models_first_predictions_alone_are_no_collapse(client, roots, redis_server):
    """The trainer's verdict is ``predictions_collapsed``: a phase flag alone (a fresh model's
    predict phase) is no event."""
    job_id = started(client, roots, "fresh")
    first = {**HEALTHY, "predict_top_share": 1.0, "predict_collapsed": True}
    report_pass(redis_server.url, job_id, first)
    wait_for(lambda: gauge(client, job_id) is not None, what="the gauge after pass 1")
    assert gauge(client, job_id) == 0.0
    assert events_of(client, job_id, "predictions_collapsed") == []


def test_a_record_without_the_flag_sets_nothing_and_a_deleted_job_drops_it(
    client, roots, redis_server
):
    older = started(client, roots, "older-trainer")
    report_pass(redis_server.url, older, {"samples": 1500, "seconds": 0.5})
    wait_for(lambda: client.get(f"/v1/jobs/{older}").json()["passes_done"] == 1, what="pass 1 done")
    assert gauge(client, older) is None

    job_id = started(client, roots, "deleted")
    report_pass(redis_server.url, job_id, SATURATED)
    wait_for(lambda: gauge(client, job_id) == 1.0, what="the gauge at 1")
    assert client.post(f"/v1/jobs/{job_id}/stop").status_code == 200
    wait_for(lambda: client.get(f"/v1/jobs/{job_id}").json()["state"] == "stopped", what="stop")
    assert gauge(client, job_id) == 1.0  # a stopped job keeps its model's verdict
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 204
    wait_for(lambda: gauge(client, job_id) is None, what="the gauge dropped with the job")
