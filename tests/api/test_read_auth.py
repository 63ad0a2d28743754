"""Reads are authenticated by default: every GET route of the app, enumerated from the app
itself (a new GET route is covered without touching this file), answers 401 without the
token or with a wrong one, against a real API process over HTTP; only the probes, /metrics
and the OpenAPI schema and UI stay open (services/api/README.md, "Auth")."""

from __future__ import annotations

import re

import httpx
import pytest
from api_helpers import TOKEN, job_body
from starlette.routing import BaseRoute
from streamrec.api.app import create_app
from streamrec.api.config import Settings

#: GET routes open without a token: the probes (kubelet), /metrics (Prometheus holds no
#: token; counts and pass metrics by job id, no spec) and the API's own description.
OPEN = {
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.json",
    "/docs",
    "/docs/oauth2-redirect",
    "/redoc",
}
#: The reads that existed when reads were closed: the enumeration must find at least these.
KNOWN_READS = {
    "/v1/jobs",
    "/v1/jobs/{job_id}",
    "/v1/jobs/{job_id}/workers",
    "/v1/jobs/{job_id}/passes",
    "/v1/jobs/{job_id}/passes/{day}/{pass_id}",
    "/v1/jobs/{job_id}/triggers",
    "/v1/jobs/{job_id}/triggers/{trigger_id}",
    "/v1/jobs/{job_id}/events",
}


def get_routes() -> set[str]:
    """The path of every route of the app that answers GET (nothing is connected): the
    app's own routes and, through its OpenAPI paths, those of the routers it includes
    (FastAPI may keep an included router's routes behind one entry of ``app.routes``)."""
    app = create_app(Settings.load({"auth_disabled": True}, env={}), start_scheduler=False)
    routes: list[BaseRoute] = list(app.routes)
    own = {r.path for r in routes if "GET" in (getattr(r, "methods", None) or ())}
    return own | {path for path, ops in app.openapi()["paths"].items() if "get" in ops}


def concrete(path: str, values: dict[str, str]) -> str:
    """``path`` with each ``{name}`` set from ``values`` (a new parameter fails by name)."""

    def value(m: re.Match[str]) -> str:
        assert m.group(1) in values, f"no sample value for {{{m.group(1)}}} in {path}: add one"
        return values[m.group(1)]

    return re.sub(r"\{(\w+)(?::\w+)?\}", value, path)


@pytest.fixture
def samples(client: httpx.Client, roots) -> dict[str, str]:
    """A job (with paths in its spec), started, and a trigger: reads with data behind them."""
    job = client.post("/v1/jobs", json=job_body(roots, "secretive")).json()
    assert client.post(f"/v1/jobs/{job['id']}/start").status_code == 200
    trigger = client.post(f"/v1/jobs/{job['id']}/triggers", json={"kind": "shrink"}).json()
    return {"job_id": job["id"], "day": "20190720", "pass_id": "1", "trigger_id": trigger["id"]}


def test_settings_close_reads_by_default_and_open_them_only_when_told() -> None:
    token = {"token": TOKEN}
    assert Settings.load(token, env={}).auth_reads is True
    opened = Settings.load(token, env={"STREAMREC_API_AUTH_READS": "false"})
    assert opened.auth_reads is False


def test_every_get_route_but_the_open_ones_needs_the_token(api, client, samples, roots) -> None:
    routes = get_routes()
    assert routes >= KNOWN_READS, KNOWN_READS - routes
    assert {"/healthz", "/readyz", "/metrics"} <= routes
    closed = sorted(routes - OPEN)
    tried = 0
    with api.http(token=None) as anon, api.http(token="wrong-token-0123456789") as wrong:
        for template in closed:
            path = concrete(template, samples)
            for who, caller in (("no token", anon), ("a wrong token", wrong)):
                resp = caller.get(path)
                assert resp.status_code == 401, (template, who, resp.status_code, resp.text)
                assert resp.headers["www-authenticate"].startswith("Bearer"), (template, who)
                assert str(roots["data"]) not in resp.text and samples["job_id"] not in resp.text
                tried += 1
            ok = client.get(path)
            assert ok.status_code in (200, 404), (template, ok.status_code, ok.text)
        for template in sorted(routes & OPEN):
            resp = anon.get(template)
            assert resp.status_code == 200, (template, resp.status_code, resp.text)
    assert tried == 2 * len(closed) >= 2 * len(KNOWN_READS)
    job = client.get(f"/v1/jobs/{samples['job_id']}").json()  # the token reads it whole
    assert job["spec"]["data"]["train_data_dir"] == str(roots["data"] / "secretive")
