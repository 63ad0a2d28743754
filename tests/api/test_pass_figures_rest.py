"""REST shows what a pass record keeps of a trainer's ``pass_done`` report (real API, real
redis-server; the report sent as a trainer sends it): the collapse figures (each phase's
``top_share`` and ``collapsed``, the pass's ``predictions_collapsed``) and the training
``batch_size``, in the passes page and in the one pass; a report without them (an older
trainer's) shows None."""

from __future__ import annotations

from api_helpers import SATURATED_PASS, job_body, land_split, report_pass
from servers import wait_for

#: A stalled model's pass as the trainer writes it, with the training batch size.
STALLED = {**SATURATED_PASS, "train_top_share": 0.995, "batch_size": 32}
SHOWN = (
    "predict_top_share",
    "predict_collapsed",
    "train_top_share",
    "train_collapsed",
    "predictions_collapsed",
    "batch_size",
)


def test_a_pass_reports_collapse_figures_and_batch_size_come_back_over_rest(
    client, roots, redis_server
):
    for split in ("0000", "0600", "1200"):
        land_split(roots["data"] / "figures", "20190720", split)
    job_id = client.post("/v1/jobs", json=job_body(roots, "figures")).json()["id"]
    assert client.post(f"/v1/jobs/{job_id}/start").status_code == 200

    first = report_pass(redis_server.url, job_id, STALLED)
    second = report_pass(redis_server.url, job_id, {"samples": 1500, "seconds": 0.5})
    wait_for(lambda: client.get(f"/v1/jobs/{job_id}").json()["passes_done"] == 2, what="2 done")

    page = client.get(f"/v1/jobs/{job_id}/passes").json()["data"]
    by_key = {f"{p['day']}/{p['pass_id']}": p for p in page}
    assert {k: by_key[first][k] for k in SHOWN} == {k: STALLED[k] for k in SHOWN}
    assert {k: by_key[second][k] for k in SHOWN} == dict.fromkeys(SHOWN)  # an older trainer's
    one = client.get(f"/v1/jobs/{job_id}/passes/{first}").json()
    assert one == by_key[first]
    assert one["state"] == "done" and one["samples"] == 1500
