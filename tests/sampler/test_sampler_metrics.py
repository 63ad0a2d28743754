"""The sampler's request series exist at 0 for every op from the server's start, so the latency
alert and the dashboards' rates have a series before the first request of an op."""

from __future__ import annotations

import urllib.request


def test_every_op_has_its_request_series_before_its_first_request(server):
    body = (
        urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10)
        .read()
        .decode()
    )
    values = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    for op in ("sample_ids", "reload", "valid_sample_ids", "pack_feature", "unknown"):
        assert values[f'streamrec_sampler_requests_total{{op="{op}"}}'] == 0
        assert values[f'streamrec_sampler_request_seconds_count{{op="{op}"}}'] == 0
        assert values[f'streamrec_sampler_request_seconds_bucket{{le="+Inf",op="{op}"}}'] == 0
    # the default registry's process collector
    assert values["process_resident_memory_bytes"] > 0
