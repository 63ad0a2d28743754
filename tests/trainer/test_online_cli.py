"""``streamrec-trainer export --online`` against a serving Redis that is not there: the base is
written, then one line names the Redis (its password hidden), no traceback; with a password
file (``STREAMREC_ONLINE_REDIS_PASSWORD_FILE``) a Redis that requires one is published to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from servers import RedisServer, free_port
from streamrec.embedding_store import RedisConverter
from streamrec.trainer.runner import OnlineTrainer
from trainer_helpers import small_config

TRAINER = str(Path(sys.executable).parent / "streamrec-trainer")


@pytest.fixture(scope="module")
def trained(stream, tmp_path_factory) -> Path:
    """A job YAML whose model has a checkpoint of the first day."""
    tmp = tmp_path_factory.mktemp("cli")
    cfg = small_config(stream, tmp / "model", end_day="20190720")
    with OnlineTrainer(cfg) as t:
        t.run()
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    return path


def export(config: Path, url: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TRAINER, "export", "--config", str(config), "--online", url, "--log-level", "WARNING"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **env},
    )


@pytest.mark.timeout(240)
def test_an_unreachable_serving_redis_is_one_line_naming_it(trained: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    done = export(trained, url, {})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("streamrec-trainer: error")]
    assert f"serving Redis {url}" in line and "not published" in line, line
    model = yaml.safe_load(trained.read_text())["runner"]["model_save_path"]
    assert (Path(model) / "20190720" / "base" / "sparse").is_dir()  # written first


@pytest.mark.timeout(240)
def test_a_serving_redis_with_a_password_reads_it_from_its_own_file(trained, tmp_path):
    password = tmp_path / "serving-password"
    password.write_text("serving-secret-42\n")
    (tmp_path / "redis").mkdir()
    server = RedisServer(free_port(), tmp_path / "redis")
    server.start()
    try:
        admin = server.client()
        admin.config_set("requirepass", "serving-secret-42")
        admin.close()
        refused = export(trained, server.url, {})  # no password: NOAUTH, one line
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert f"serving Redis {server.url}" in refused.stderr, refused.stderr
        done = export(trained, server.url, {"STREAMREC_ONLINE_REDIS_PASSWORD_FILE": str(password)})
        assert done.returncode == 0, done.stderr
        version = json.loads(done.stdout.splitlines()[-1])["online"]["version"]
        assert version["seq"] == 1 and version["tag"] == "20190720/base"
        url = server.url.replace("redis://", "redis://:serving-secret-42@")
        conv = RedisConverter(url, "streamrec:emb")
        keys, _ = conv.read_rows("slot_0")
        conv.redis.close()
        assert keys.size > 0
    finally:
        server.stop()
