"""schemathesis against the live API's OpenAPI spec: no 5xx, no response breaking the schema."""

from __future__ import annotations

import itertools

import pytest
import schemathesis
from api_helpers import TOKEN, job_body
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    schemathesis.checks.not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def api_schema(api, redis_server, roots):
    redis_server.client().flushall()
    with api.http() as c:  # some real state, so list/get endpoints answer with data too
        job = c.post("/v1/jobs", json=job_body(roots, "fuzz")).json()
        c.post(f"/v1/jobs/{job['id']}/start")
        c.post(f"/v1/jobs/{job['id']}/triggers", json={"kind": "shrink"})
    return schemathesis.openapi.from_url(api.url + "/openapi.json")


def test_no_5xx_and_schema_conformant(api, api_schema):
    """Every operation, a bounded number of generated requests each (valid and invalid)."""
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 15
    for op, mode in itertools.product(operations, list(GenerationMode)):

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(
            max_examples=15,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case):
            case.call_and_validate(
                headers={"Authorization": f"Bearer {TOKEN}"}, checks=CHECKS, timeout=10
            )

        try:
            run()
        except Unsatisfiable:  # nothing to make invalid (no parameters, no body)
            assert mode == GenerationMode.NEGATIVE, op.label
    with api.http() as c:  # the requests really reached the server
        text = c.get("/metrics").text
    served = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("streamrec_api_requests_total{")
    )
    assert served >= 2 * len(operations) * 3
    statuses = {
        line.split('status="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("streamrec_api_requests_total{")
    }
    assert not any(s.startswith("5") for s in statuses), statuses
