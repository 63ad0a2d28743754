"""Hostile job bodies over real HTTP: every client error is a 4xx naming the field, and no
request costs more than its size (a 200-year job, NaN, NUL, lone surrogates; see
docs/design-notes.md)."""

from __future__ import annotations

import json
import time

import pytest
from api_helpers import job_body
from streamrec.api.models import MAX_JOB_DAYS, MAX_JOB_PASSES


def post_raw(client, text: str):
    """Posts JSON text as written (NaN, Infinity and ``\\ud800`` escapes reach the server)."""
    return client.post(
        "/v1/jobs", content=text.encode("ascii"), headers={"content-type": "application/json"}
    )


def errors(resp) -> list[tuple[str, str]]:
    return [(".".join(map(str, e["loc"])), e["msg"]) for e in resp.json()["detail"]]


def assert_refused(client, resp, loc: str, words: str) -> None:
    """A 422 whose error sits at ``loc`` and whose message holds ``words``; nothing stored."""
    assert resp.status_code == 422, resp.text
    found = errors(resp)
    assert any(where == loc and words in msg for where, msg in found), found
    assert client.get("/v1/jobs").json()["count"] == 0
    assert client.get("/healthz").status_code == 200


def test_a_200_year_job_is_refused_fast_naming_end_day(client, roots):
    body = job_body(roots, start_day="19000101", end_day="20991231", split_interval=1)
    t0 = time.monotonic()
    resp = client.post("/v1/jobs", json=body)
    took = time.monotonic() - t0
    assert_refused(client, resp, "body.data.end_day", f"MAX_JOB_DAYS ({MAX_JOB_DAYS})")
    assert "73049 days" in resp.text
    assert took < 1.0, took


def test_too_many_passes_is_refused_naming_split_per_pass(client, roots):
    # a year of 1-minute passes: 365 x 1440 = 525,600 passes
    body = job_body(roots, start_day="20190101", end_day="20191231", split_interval=1)
    t0 = time.monotonic()
    resp = client.post("/v1/jobs", json=body)
    assert time.monotonic() - t0 < 1.0
    assert_refused(client, resp, "body.data.split_per_pass", "525600 passes (365 days x 1440")
    assert f"MAX_JOB_PASSES ({MAX_JOB_PASSES})" in resp.text


@pytest.mark.parametrize(
    "start,end,interval,per_pass,total",
    [
        ("20100101", "20191229", 1440, 1, 3650),  # ten years of daily passes
        ("20190101", "20191231", 5, 1, 365 * 288),  # a year of 5-minute passes
        ("20190101", "20190101", 1, 7, 206),  # 1440 splits, 7 a pass: the last pass is short
        ("20190101", "20190102", 60, 1440, 2),  # more splits a pass than a day holds
    ],
)
def test_a_large_job_within_the_limits_is_counted_fast(
    client, roots, start, end, interval, per_pass, total
):
    body = job_body(roots, start_day=start, end_day=end, split_interval=interval)
    body["data"]["split_per_pass"] = per_pass
    t0 = time.monotonic()
    resp = client.post("/v1/jobs", json=body)
    assert time.monotonic() - t0 < 1.0
    assert resp.status_code == 201, resp.text
    assert resp.json()["passes_total"] == total


@pytest.mark.parametrize(
    "section,key", [("data", "train_data_dir"), ("checkpoint", "model_save_path")]
)
def test_a_nul_byte_in_a_path_is_422(client, roots, section, key):
    body = job_body(roots)
    body[section][key] += "\x00/x"
    resp = client.post("/v1/jobs", json=body)
    assert_refused(client, resp, f"body.{section}.{key}", "NUL byte")


@pytest.mark.parametrize(
    "old,new,loc,words",
    [
        ('"name": "t"', '"name": "\\ud800"', "body.name", "unicode"),
        ('"name": "t"', '"name": "t\\udfff"', "body.name", "unicode"),
        (
            '"train_data_dir": "',
            '"train_data_dir": "\\ud800',
            "body.data.train_data_dir",
            "unicode",
        ),
        ('"name": "t"', '"name": "t", "model": {"\\ud800": 1}', "body.model", "UTF-8"),
        (
            '"name": "t"',
            '"name": "t", "store": {"table_parameters": {"a": ["\\udc80"]}}',
            "body.store.table_parameters",
            "table_parameters.a[0]: not valid UTF-8",
        ),
    ],
)
def test_a_lone_surrogate_is_422(client, roots, old, new, loc, words):
    text = json.dumps(job_body(roots))
    assert old in text
    resp = post_raw(client, text.replace(old, new, 1))
    assert_refused(client, resp, loc, words)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_float_is_422(client, roots, literal):
    text = json.dumps(job_body(roots))
    old = '"data_sleep_second": 0.05'
    assert old in text
    resp = post_raw(client, text.replace(old, f'"data_sleep_second": {literal}'))
    assert_refused(client, resp, "body.data.data_sleep_second", "finite number")


@pytest.mark.parametrize(
    "section,loc,words",
    [
        (
            '"model": {"hyper_parameters": {"learning_rate": NaN}}',
            "body.model",
            "model.hyper_parameters.learning_rate: nan is not a finite number",
        ),
        (
            '"store": {"table_parameters": {"embedx_threshold": Infinity}}',
            "body.store.table_parameters",
            "embedx_threshold: inf is not a finite number",
        ),
    ],
)
def test_a_non_finite_float_in_a_free_form_section_is_422(client, roots, section, loc, words):
    text = json.dumps(job_body(roots))
    resp = post_raw(client, text.replace('"name": "t"', f'"name": "t", {section}', 1))
    assert_refused(client, resp, loc, words)


def test_a_huge_bad_value_is_quoted_bounded(client, roots):
    body = job_body(roots)
    body["name"] = "x" * 500_000
    resp = client.post("/v1/jobs", json=body)
    assert_refused(client, resp, "body.name", "pattern")
    assert len(resp.content) < 4096, len(resp.content)
    assert "500000 chars" in resp.text


@pytest.mark.parametrize(
    "body", ["[]", '"x"', "1e999", "null", "NaN", '{"\\ud800": 1}', "{" * 5000]
)
def test_a_body_that_is_no_object_is_422(client, roots, body):
    for path in ("/v1/jobs", "/v1/jobs/feedfacefeedface/triggers"):
        resp = client.post(
            path, content=body.encode(), headers={"content-type": "application/json"}
        )
        assert resp.status_code == 422, (path, body, resp.text)
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize("after", ["99999999999999999999-0", "0-99999999999999999999"])
def test_an_event_cursor_out_of_range_is_422(client, roots, after):
    job = client.post("/v1/jobs", json=job_body(roots)).json()
    resp = client.get(f"/v1/jobs/{job['id']}/events", params={"after": after})
    assert resp.status_code == 422, resp.text
    assert "after" in resp.text


def test_a_path_through_a_symlink_loop_is_422(client, roots):
    loop = roots["data"] / "loop"
    loop.symlink_to(loop.name)
    try:
        body = job_body(roots)
        body["data"]["train_data_dir"] = str(loop / "x")
        resp = client.post("/v1/jobs", json=body)
        assert_refused(client, resp, "body.data.train_data_dir", "cannot be resolved")
    finally:
        loop.unlink()
