"""The Criteo walk-through of services/trainer/README.md, run as written: its commands, one
by one in a shell, on a generated Criteo-format file (4 malformed lines, a blank one), with a
real redis-server for the online export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import redis
import yaml
from doc_blocks import blocks_for
from servers import RedisServer, free_port
from streamrec.datagen.planted import PlantedStream, StreamParams
from streamrec.datagen.text_lines import to_criteo_text
from streamrec.embedding_store import FileConverter, RedisConverter


def walkthrough_commands() -> list[str]:
    """The commands of the README's walk-through block, as written (tests/doc_blocks.py
    RUN_BY)."""
    (block,) = blocks_for(__file__)
    return [line for line in block.splitlines() if line.strip()]


def criteo_file(path: Path, day: str, n: int, seed: int, bad: bool) -> None:
    """n Criteo lines of the planted stream (26 hex slots); with ``bad``, 4 malformed lines
    and a blank one among the first 1000 lines (3,005 lines in all for n = 3000)."""
    stream = PlantedStream(StreamParams(slots=26, vocab=100, seed=3), "20190720")
    s = stream.draw(day, n, np.random.default_rng(seed))
    keys = s["keys"] & 0xFFFFFFFF  # Criteo's categorical fields: 32-bit hex
    lines = to_criteo_text(s["label"], s["ints"], keys).splitlines(keepends=True)
    if bad:
        for i, line in zip(
            (10, 200, 400, 600),
            [b"1\t2\n", b"x" + lines[1], b"2" + lines[2][1:], b"0\t" * 45 + b"\n"],
            strict=True,
        ):
            lines.insert(i, line)
        lines.insert(700, b"\n")
    path.write_bytes(b"".join(lines))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_readme_walkthrough_runs_as_written(tmp_path):
    criteo_file(tmp_path / "day_0", "20190720", 3000, 1, bad=True)
    criteo_file(tmp_path / "day_1", "20190721", 1000, 2, bad=False)
    assert len((tmp_path / "day_0").read_bytes().splitlines()) == 3005
    server = RedisServer(free_port(), tmp_path)
    server.start()
    env = dict(os.environ, REDIS_URL=server.url)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    outs = []
    try:
        commands = walkthrough_commands()
        assert len(commands) == 5
        for command in commands:
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=240,
            )
            assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
            outs.append(done)
        lay, train, export, online, predict = outs

        counts = json.loads(lay.stdout)
        assert counts["splits"] == 4 and counts["lines"] == 3005
        assert (counts["end_day"], counts["last_split"]) == ("20190720", "0015")
        job = yaml.safe_load((tmp_path / "job.yaml").read_text())
        assert job["runner"]["end_split"] == "0015" and job["runner"]["data_format"] == "criteo"

        rows = [line.split() for line in train.stdout.splitlines()[1:-1]]
        assert [(r[0], r[1]) for r in rows] == [("20190720", str(i)) for i in (1, 2, 3, 4)]
        assert sum(int(r[2]) for r in rows) == 3000  # 4 malformed and the blank skipped
        assert train.stdout.splitlines()[-1].startswith(
            "streamrec-trainer: done: trained through split 20190720/0015 (end_split 0015)"
        )
        records = [
            json.loads(x) for x in (tmp_path / "model" / "passes.jsonl").read_text().splitlines()
        ]
        assert sum(r["malformed_lines"] for r in records) == 4

        assert json.loads(export.stdout)["exported"] == "serving"
        assert (tmp_path / "serving" / "dense_int8.pt").is_file()

        published = json.loads(online.stdout)["online"]
        assert published["version"]["seq"] == 1 and published["version"]["tag"] == "20190720/base"
        # what Redis serves is the exported model's rows (both the same checkpoint's base)
        files = FileConverter(tmp_path / "serving" / "sparse")
        conv = RedisConverter(server.url, "streamrec:emb")
        for table in ("slot_0", "slot_25"):
            keys, values = conv.read_rows(table)
            want_k, want_v = files.read_rows(table, "base")
            order = np.argsort(want_k)
            np.testing.assert_array_equal(keys, want_k[order])
            np.testing.assert_array_equal(values, want_v[order])
            assert keys.size > 0
        conv.redis.close()
        seq = redis.Redis.from_url(server.url).hget("streamrec:emb:version", "seq")
        assert seq == b"1"

        scored = json.loads(predict.stdout)
        assert scored["samples"] == 1000 and scored["held_out"] is True
        assert scored["auc"] > 0.55 and "in-sample" not in predict.stderr
        assert np.loadtxt(tmp_path / "scores.txt").shape == (1000,)
    finally:
        server.stop()
