"""The API process loads neither torch nor the store, the trainer or the sampler, even while
it checks a job's table parameters (their schema is the torch-free streamrec.store_schema)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
import streamrec.api.app
from streamrec.api.models import JobCreate
from streamrec.api.spec_checks import table_problems

def job(params):
    return JobCreate.model_validate({
        "name": "j",
        "data": {"train_data_dir": "/d", "start_day": "20190720", "end_day": "20190720"},
        "checkpoint": {"model_save_path": "/m"},
        "store": {"endpoints": ["tcp://127.0.0.1:5555"], "table_parameters": params},
    })

good = table_problems(job({"embedx_threshold": 5, "nonclk_coeff": 0.2}))
bad = table_problems(job({"embedx_threshold": "lots"}))
loaded = sorted(
    m for m in sys.modules
    if m == "torch" or m.startswith(("streamrec.embedding_store", "streamrec.trainer",
                                     "streamrec.sampler"))
)
print(json.dumps({"good": good, "bad": [p[0] for p in bad], "loaded": loaded}))
"""


@pytest.mark.timeout(120)
def test_checking_a_jobs_table_parameters_loads_no_store_and_no_torch():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=100, check=True
    )
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["good"] == [] and got["bad"] == ["store.table_parameters.embedx_threshold"], got
    assert got["loaded"] == [], got["loaded"]
