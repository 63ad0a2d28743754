"""The suite's order: the files holding ``slow`` tests first, each file's tests together and
in their own order. ``make test`` runs the files on two workers (pytest-xdist,
``--dist loadfile``, which hands files out in this order): the minute-long stack tests start
at once, side by side with the short ones, instead of forming a tail at the end."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    first_seen: dict[object, int] = {}
    for i, item in enumerate(items):
        first_seen.setdefault(item.path, i)
    items.sort(key=lambda item: (item.path not in slow_files, first_seen[item.path]))
