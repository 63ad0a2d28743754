"""Fixtures of the tests that drive the API: a real redis-server and a real API process, both
on free local ports (imported by the conftest of tests/api and of tests/trainer, whose agent
tests run trainer groups under the API)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from api_helpers import TOKEN, ApiServer, make_api
from servers import RedisServer, free_port

__all__ = ["TOKEN"]


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(free_port(), tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("roots")
    out = {"data": base / "data", "model": base / "models", "secret": base / "secret"}
    for p in out.values():
        p.mkdir()
    (out["secret"] / "token").write_text(TOKEN + "\n")
    return out


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, roots: dict[str, Path]) -> Iterator[ApiServer]:
    server = make_api(redis_server.url, roots)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def client(api: ApiServer, r: redis.Redis) -> Iterator[httpx.Client]:
    with api.http() as c:
        yield c
