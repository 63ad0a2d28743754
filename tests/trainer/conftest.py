"""Fixtures of the trainer tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from api_fixtures import api, client, r, redis_server, roots  # noqa: F401 (the agent tests)
from trainer_helpers import write_stream


@pytest.fixture(scope="session")
def stream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two days of the planted stream, 2 splits a day, 2 files a split (read-only)."""
    return write_stream(tmp_path_factory.mktemp("stream"))
