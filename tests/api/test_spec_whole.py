"""The job spec checked whole at create time, over real HTTP: every nested field the trainer
would refuse or that reaches past the deployment's allow-lists is a 422 naming it, and no
value comes back longer than QUOTE_LIMIT (RELIABILITY.md, "No door left open")."""

from __future__ import annotations

import pytest
from api_helpers import job_body
from streamrec.errors import QUOTE_LIMIT


def errors(resp) -> list[tuple[str, str, str]]:
    return [(".".join(map(str, e["loc"])), e["msg"], e["type"]) for e in resp.json()["detail"]]


def refused(client, body: dict, loc: str, words: str) -> list[tuple[str, str, str]]:
    """Posts ``body``: a 422 with an error at ``loc`` whose message holds ``words``; nothing
    stored, the API still serving."""
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 422, resp.text
    found = errors(resp)
    assert any(where == loc and words in msg for where, msg, _ in found), found
    assert client.get("/v1/jobs").json()["count"] == 0
    assert client.get("/healthz").status_code == 200
    return found


@pytest.mark.parametrize(
    "params,loc,words",
    [
        (
            {"embedx_threshold": "abc"},
            "body.store.table_parameters.embedx_threshold",
            "valid number",
        ),
        ({"bogus": 1}, "body.store.table_parameters.bogus", "Extra inputs"),
        ({"dim": 8}, "body.store.table_parameters.dim", "set by the trainer"),
    ],
)
def test_table_parameters_are_checked_by_name_and_type(client, roots, params, loc, words):
    body = job_body(roots, "tables")
    body["store"] = {"table_parameters": params}
    refused(client, body, loc, words)


def test_table_parameters_of_the_model_section_too(client, roots):
    body = job_body(roots, "tables")
    body["model"] = {"table_parameters": {"delta_threshold": [1]}}
    refused(client, body, "body.model.table_parameters.delta_threshold", "valid number")


def test_good_table_parameters_pass(client, roots):
    body = job_body(roots, "tables")
    body["store"] = {"table_parameters": {"embedx_threshold": 5, "delete_threshold": 0.5}}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 201, resp.text


def test_the_sampler_table_is_confined_to_the_data_roots(client, roots):
    body = job_body(roots, "shadow")
    body["sampler"] = {"neg_num": 2}
    body["model"] = {"negative_sampling": {"table_path": "/etc/shadow"}}
    found = refused(client, body, "body.model.negative_sampling.table_path", "outside")
    assert "path_refused" in {t for _, _, t in found}, found


def test_a_sampler_table_under_the_data_root_is_stored_resolved(client, roots):
    body = job_body(roots, "table")
    body["sampler"] = {"neg_num": 2}
    table = roots["data"] / "t" / ".." / "items.parquet"
    body["model"] = {"negative_sampling": {"table_path": str(table)}}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 201, resp.text
    stored = resp.json()["spec"]["model"]["negative_sampling"]["table_path"]
    assert stored == str(roots["data"].resolve() / "items.parquet")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3"])
def test_a_metrics_bind_beyond_the_loopback_is_refused(client, roots, host):
    body = job_body(roots, "bind")
    body["model"] = {"runner": {"metrics_host": host}}
    refused(client, body, "body.model.runner.metrics_host", "not an allowed address")


def test_a_loopback_metrics_bind_passes(client, roots):
    body = job_body(roots, "bind")
    body["model"] = {"runner": {"metrics_host": "127.0.0.1"}}
    assert client.post("/v1/jobs", json=body).status_code == 201


@pytest.mark.parametrize(
    "where",
    [("data", "train_data_dir"), ("checkpoint", "model_save_path")],
)
def test_a_path_component_longer_than_name_max_is_refused(client, roots, where):
    section, key = where
    body = job_body(roots, "long")
    root = roots["data"] if section == "data" else roots["model"]
    body[section][key] = str(root / ("x" * 300))
    refused(client, body, f"body.{section}.{key}", "longer than NAME_MAX (255)")


def test_a_store_endpoint_listed_twice_is_refused(client, roots):
    body = job_body(roots, "twice")
    body["store"] = {"endpoints": ["tcp://127.0.0.1:7701", "tcp://127.0.0.1:7701"]}
    refused(client, body, "body.store.endpoints[1]", "listed twice")


def test_a_sampler_endpoint_not_allowed_is_refused(client, roots):
    body = job_body(roots, "smp")
    body["sampler"] = {"endpoint": "tcp://127.0.0.1:19990", "neg_num": 2}
    body["model"] = {"negative_sampling": {"table_path": str(roots["data"] / "items.parquet")}}
    found = refused(client, body, "body.sampler.endpoint", "not an allowed sampler endpoint")
    assert {t for _, _, t in found} == {"endpoint_refused"}


def test_an_online_redis_not_allowed_is_refused(client, roots):
    body = job_body(roots, "online")
    body["model"] = {"online": {"redis_url": "redis://10.9.9.9:6379/0"}}
    refused(client, body, "body.model.online.redis_url", "not an allowed serving Redis")


def test_an_online_redis_url_with_a_password_is_refused_unechoed(client, roots, redis_server):
    body = job_body(roots, "online")
    host = redis_server.url.split("//", 1)[1]
    body["model"] = {"online": {"redis_url": f"redis://:hunter2secret@{host}"}}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 422, resp.text
    assert "hunter2secret" not in resp.text
    assert "carries a password" in resp.text


def test_every_problem_is_named_at_once(client, roots):
    body = job_body(roots, "many")
    body["store"] = {"table_parameters": {"bogus": 1}}
    body["model"] = {"runner": {"metrics_host": "0.0.0.0"}}
    body["sampler"] = {"endpoint": "tcp://127.0.0.1:19990", "neg_num": 2}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 422
    locs = {loc for loc, _, _ in errors(resp)}
    assert {
        "body.store.table_parameters.bogus",
        "body.model.runner.metrics_host",
        "body.sampler.endpoint",
    } <= locs


def bounded(value) -> None:
    """No string in a response longer than QUOTE_LIMIT plus its quoting and size note."""
    if isinstance(value, str):
        assert len(value) <= QUOTE_LIMIT + 40, value[:300]
    elif isinstance(value, dict):
        for k, v in value.items():
            bounded(k)
            bounded(v)
    elif isinstance(value, list):
        for v in value:
            bounded(v)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b, k: b.update(model={k: 1}),  # an unknown trainer section
        lambda b, k: b.update(model={"runner": {k: 1}}),  # an unknown runner field
        lambda b, k: b.update(store={"table_parameters": {k: 1}}),
        lambda b, k: b.update(model={"online": {"redis_url": "redis://" + k}}),
        lambda b, k: b.update(sampler={"endpoint": "tcp://" + k + ":1", "neg_num": 1}),
    ],
)
def test_a_900_kb_key_comes_back_cut_to_200_characters(client, roots, mutate):
    body = job_body(roots, "huge")
    key = "k" * 900_000
    mutate(body, key)
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code in (413, 422), resp.status_code
    assert len(resp.content) < 8_000, len(resp.content)
    bounded(resp.json())
