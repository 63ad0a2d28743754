"""Fixtures: a real redis-server on a free local port."""

from api_fixtures import redis_server  # noqa: F401
