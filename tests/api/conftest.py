"""Fixtures: a real redis-server and a real API process, both on free local ports."""

from api_fixtures import TOKEN, api, client, r, redis_server, roots  # noqa: F401
