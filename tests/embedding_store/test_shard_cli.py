"""``streamrec-embedding-store serve``'s command line: bad configs refused with exit 2 and a
message naming the field, the shard id taken from a StatefulSet hostname."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from in_process import run_main
from streamrec.embedding_store import __main__ as store_main
from streamrec.errors import BadRequest


@pytest.fixture
def tables_file(tmp_path):
    path = tmp_path / "tables.json"
    path.write_text(json.dumps({"tables": [{"name": "user", "dim": 4}]}))
    return str(path)


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamrec.embedding_store", "serve", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_refuses_bad_configs_with_clear_errors(tables_file, tmp_path):
    base = ["--endpoint", "tcp://127.0.0.1:*"]
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("tables:\n  - name: u\n    dim: 4\n    embedx_dim: 7\n")
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps([{"name": "u", "dim": 4, "learning_rate": 1}]))
    cases = [
        (["--shard-id", "2", "--num-shards", "2", "--tables", tables_file], "is not below"),
        (
            ["--shard-id", "0", "--num-shards", "1", "--tables", str(tmp_path / "none.yaml")],
            "cannot read",
        ),
        (["--shard-id", "0", "--num-shards", "1", "--tables", str(bad_yaml)], "embedx_dim=7"),
        (["--shard-id", "0", "--num-shards", "1", "--tables", str(unknown)], "learning_rate"),
        (
            ["--shard-id", "0", "--num-shards", "1", "--tables", tables_file, "--tier", "ssd"],
            "persistent_path",
        ),
        (
            ["--shard-id", "from-hostname", "--num-shards", "1", "--tables", tables_file],
            "does not end in -K",
        ),
    ]
    # the first through the installed process; the others through the same main() in this
    # process (a process each cost ~4 s of imports for a check that binds nothing)
    done = _serve(*base, *cases[0][0])
    assert done.returncode == 2, done.stderr[-2000:]
    assert cases[0][1] in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    for args, text in cases[1:]:
        done = run_main(store_main.main, ["serve", *base, *args])
        assert done.returncode == 2, (args, done.stderr[-2000:])
        assert text in done.stderr, (args, done.stderr[-2000:])


def test_shard_id_from_a_statefulset_hostname():
    from streamrec.embedding_store.__main__ import shard_id_arg

    assert shard_id_arg("3") == 3
    assert shard_id_arg("from-hostname", "embedding-store-12") == 12
    with pytest.raises(BadRequest, match="store-x"):
        shard_id_arg("from-hostname", "store-x")
