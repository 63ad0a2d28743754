"""The API appends a job's events in one place (``state.append_event``): an event's shape
(type, message, data JSON, ts) cannot drift between the modules that report them."""

from __future__ import annotations

from pathlib import Path

API = Path(__file__).resolve().parents[2] / "services" / "api"


def test_only_append_event_writes_the_event_stream():
    writers = []
    for path in sorted(API.glob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            names_stream = "keys.events(" in line and "xrange(" not in line  # reads are fine
            if names_stream or "event_fields(" in line:
                writers.append(f"{path.name}:{n}")
    # state.py: event_fields itself, and append_event naming the stream and calling it
    assert writers and all(w.startswith("state.py:") for w in writers), writers
    assert len(writers) == 2, writers
