"""The default serving Redis (``--default-online-redis-url``): a job that names no
``model.online.redis_url`` publishes there on the export trigger's mode ``online``, and only
then; without a default, that trigger is a 422 naming ``mode`` instead of a trigger the
trainers fail later."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
import redis
from api_helpers import ApiServer, job_body, make_api
from servers import RedisServer
from streamrec.api.config import Settings
from streamrec.api.errors import ApiConfigError
from streamrec.control import keys

SERVING = "redis://127.0.0.1:6390/0"


@pytest.fixture(scope="module")
def serving_api(redis_server: RedisServer, roots) -> Iterator[ApiServer]:
    server = make_api(
        redis_server.url, roots, extra=["--default-online-redis-url", SERVING, "--no-scheduler"]
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def serving_client(serving_api: ApiServer, r: redis.Redis) -> Iterator[httpx.Client]:
    with serving_api.http() as c:
        yield c


def online_of(r: redis.Redis, job_id: str) -> dict:
    """The ``online`` section of the trainer config the API stored for the job."""
    return json.loads(r.hget(keys.job(job_id), "trainer_config"))["online"]


def test_a_job_naming_no_serving_redis_gets_the_default_for_the_trigger_only(
    serving_client, r, roots
):
    job = serving_client.post("/v1/jobs", json=job_body(roots, "plain"))
    assert job.status_code == 201, job.text
    assert online_of(r, job.json()["id"]) == {"modes": [], "redis_url": SERVING}
    assert "online" not in job.json()["spec"]["model"]  # the job as given; the config has it

    # its own prefix and modes are kept: it asked for its deltas to be published
    body = job_body(roots, "modes")
    body["model"] = {"online": {"prefix": "ctr", "modes": ["delta"]}}
    job = serving_client.post("/v1/jobs", json=body)
    assert job.status_code == 201, job.text
    assert online_of(r, job.json()["id"]) == {
        "prefix": "ctr",
        "modes": ["delta"],
        "redis_url": SERVING,
    }

    # the default is allowed by name; another URL is not
    body = job_body(roots, "named")
    body["model"] = {"online": {"redis_url": SERVING}}
    job = serving_client.post("/v1/jobs", json=body)
    assert job.status_code == 201, job.text
    assert online_of(r, job.json()["id"]) == {"redis_url": SERVING}
    body = job_body(roots, "other")
    body["model"] = {"online": {"redis_url": "redis://127.0.0.1:6391/0"}}
    res = serving_client.post("/v1/jobs", json=body)
    assert res.status_code == 422 and "model.online.redis_url" in res.text, res.text


def test_the_online_trigger_without_a_serving_redis_is_refused_naming_mode(client, roots):
    job = client.post("/v1/jobs", json=job_body(roots, "unserved")).json()
    assert client.post(f"/v1/jobs/{job['id']}/start").status_code == 200
    res = client.post(f"/v1/jobs/{job['id']}/triggers", json={"kind": "export", "mode": "online"})
    assert res.status_code == 422, res.text
    assert "mode" in res.text and "--default-online-redis-url" in res.text, res.text
    assert client.get(f"/v1/jobs/{job['id']}/triggers").json()["count"] == 0  # nothing queued
    res = client.post(f"/v1/jobs/{job['id']}/triggers", json={"kind": "export", "mode": "base"})
    assert res.status_code == 202, res.text


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://:secret@serving:6379/0", "carries a password"),
        ("http://serving:6379/0", "must be a redis:// URL"),
    ],
)
def test_a_bad_default_is_refused_at_start_up(url, message):
    with pytest.raises(ApiConfigError, match=message):
        Settings.load({"auth_disabled": True, "default_online_redis_url": url}, env={})


def test_the_default_is_one_of_the_allowed_urls():
    other = "redis://serving-b:6379/0"
    settings = Settings.load(
        {"auth_disabled": True, "default_online_redis_url": SERVING},
        env={"STREAMREC_API_ONLINE_REDIS_URLS": other},
    )
    assert settings.online_redis_urls == [other, SERVING]
    assert settings.policy().default_online_redis_url == SERVING
