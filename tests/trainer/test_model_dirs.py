"""A trainer's model directory: one job per directory (owner file, job id in manifests), and a
full disk that leaves no save half-written (staging renamed whole, the error naming the full
filesystem's free bytes)."""

from __future__ import annotations

import errno
import json
import os
import re
import threading
from pathlib import Path

import pytest
from servers import tmpfs
from streamrec import layout
from streamrec.errors import BadRequest
from streamrec.trainer.errors import ModelDirTaken, PassFailed
from streamrec.trainer.model.checkpoint_dirs import read_checkpoint
from streamrec.trainer.model.model_owner import OWNER_NAME, claim
from streamrec.trainer.runner import OnlineTrainer
from trainer_helpers import small_config

ONE_DAY = {"end_day": "20190720", "save_base_at_day_end": False}


def partial_saves(root: Path) -> list[Path]:
    """Save directories ``<day>/<name>/`` without a manifest, and staging left behind."""
    out = [p for p in root.glob("*/.*") if p.is_dir()]
    for d in root.glob("*/*"):
        if d.is_dir() and not d.name.startswith(".") and not (d / layout.MANIFEST_NAME).is_file():
            out.append(d)
    return out


def free_bytes_in(message: str) -> int:
    found = re.search(r"\((\d+) bytes free there", message)
    assert found, message
    return int(found.group(1))


def test_a_model_directory_of_another_job_is_refused_naming_both(stream, tmp_path):
    model = tmp_path / "m"
    cfg = small_config(stream, model, **ONE_DAY)
    with OnlineTrainer(cfg, job_id="job-a") as t:
        t.run_pass(t.passes_todo()[0])
    assert json.loads((model / OWNER_NAME).read_text())["job_id"] == "job-a"
    manifest, _ = read_checkpoint(layout.checkpoint_dir(model, "20190720", 1))
    assert manifest["job_id"] == "job-a"
    with pytest.raises(ModelDirTaken) as err:
        OnlineTrainer(cfg, job_id="job-b")
    assert isinstance(err.value, BadRequest)  # the agent reports it fatal: the API fails B
    text = str(err.value)
    assert "'job-a'" in text and "'job-b'" in text and str(model) in text, text
    # without the owner file, the manifest still names job A
    (model / OWNER_NAME).unlink()
    with pytest.raises(ModelDirTaken, match="MANIFEST.json says so"):
        OnlineTrainer(cfg, job_id="job-b")
    # job A itself goes on from its checkpoint, and claims the directory again
    with OnlineTrainer(cfg, job_id="job-a") as t:
        assert t.warm_start() == ("20190720", 1)
        t.run_pass(t.passes_todo()[0])
    assert json.loads((model / OWNER_NAME).read_text())["job_id"] == "job-a"


def test_a_model_written_before_job_ids_loads_and_goes_to_its_first_job(stream, tmp_path):
    model = tmp_path / "m"
    cfg = small_config(stream, model, **ONE_DAY)
    with OnlineTrainer(cfg) as t:  # on its own: no job id, nothing claimed
        t.run_pass(t.passes_todo()[0])
    assert not (model / OWNER_NAME).exists()
    with OnlineTrainer(cfg, job_id="job-c") as t:
        assert t.warm_start() == ("20190720", 1)
        t.run_pass(t.passes_todo()[0])
    assert json.loads((model / OWNER_NAME).read_text())["job_id"] == "job-c"
    with pytest.raises(ModelDirTaken, match="'job-c'"):
        OnlineTrainer(cfg, job_id="job-d")


def test_a_trainer_that_finds_its_directory_claimed_meanwhile_does_not_save(stream, tmp_path):
    model = tmp_path / "m"
    cfg = small_config(stream, model, **ONE_DAY)
    with OnlineTrainer(cfg, job_id="job-a") as t:
        claim(model, "job-b")  # B was built before A wrote anything, and saved first
        with pytest.raises(PassFailed, match="belongs to job 'job-b'"):
            t.run_pass(t.passes_todo()[0])
    assert not list(model.glob("2019*/*")) and not (model / "passes.jsonl").exists()


def claim_as(root: Path, job: str, start: threading.Barrier, outcomes: list[str]) -> None:
    start.wait()
    try:
        claim(root, job)
        outcomes.append(job)
    except ModelDirTaken:
        outcomes.append("refused")


def test_of_two_claims_one_wins(tmp_path):
    for n in range(20):
        root = tmp_path / str(n)
        outcomes: list[str] = []
        start = threading.Barrier(2)
        threads = [
            threading.Thread(target=claim_as, args=(root, job, start, outcomes))
            for job in ("a", "b")
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        owner = json.loads((root / OWNER_NAME).read_text())["job_id"]
        assert sorted(outcomes) == sorted([owner, "refused"]), outcomes
        assert [p.name for p in root.iterdir()] == [OWNER_NAME]


def test_an_injected_enospc_leaves_no_partial_checkpoint(stream, tmp_path, monkeypatch):
    model = tmp_path / "m"
    cfg = small_config(stream, model, **ONE_DAY)
    with OnlineTrainer(cfg, job_id="job-a") as t:
        specs = t.passes_todo()
        t.run_pass(specs[0])
        monkeypatch.setenv("STREAMREC_FAULT", "checkpoint_enospc")  # after dense.pt
        with pytest.raises(PassFailed) as err:
            t.run_pass(specs[1])
    text = str(err.value)
    assert "[Errno 28]" in text and str(layout.checkpoint_dir(model, "20190720", 2)) in text
    assert partial_saves(model) == []
    assert not layout.checkpoint_dir(model, "20190720", 2).exists()
    read_checkpoint(layout.checkpoint_dir(model, "20190720", 1))  # still complete


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs: a real filesystem that fills up."""
    with tmpfs(tmp_path / "disk", 4 << 20) as root:
        yield root


def fill(disk: Path) -> Path:
    """Writes a file until the filesystem of ``disk`` is full; returns it."""
    filler = disk / "filler"
    with filler.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


def test_a_full_disk_leaves_no_partial_checkpoint_and_names_its_filesystem(
    stream, tmp_path, small_disk
):
    model = small_disk / "m"
    cfg = small_config(stream, model, **ONE_DAY)
    with OnlineTrainer(cfg, job_id="job-a") as t:
        specs = t.passes_todo()
        t.run_pass(specs[0])
        filler = fill(small_disk)
        with pytest.raises(PassFailed) as err:
            t.run_pass(specs[1])
        # a save replacing a complete directory keeps it when the disk is full
        with pytest.raises(OSError) as again:
            t.save_checkpoint("20190720", 1)
        filler.unlink()
        t.run_pass(specs[1])  # space again: the pass and its checkpoint go through
    text = str(err.value)
    assert "[Errno 28]" in text and str(layout.checkpoint_dir(model, "20190720", 2)) in text
    free = free_bytes_in(text)
    assert free < 1 << 20, text  # the tmpfs's (nearly nothing), not the working directory's
    cwd = os.statvfs(".")
    assert free != cwd.f_bavail * cwd.f_frsize
    assert again.value.errno == errno.ENOSPC and free_bytes_in(str(again.value)) < 1 << 20
    assert partial_saves(model) == []
    for pass_id in (1, 2):
        manifest, _ = read_checkpoint(layout.checkpoint_dir(model, "20190720", pass_id))
        assert manifest["job_id"] == "job-a"
    lines = (model / "passes.jsonl").read_text().splitlines()
    assert [json.loads(x)["pass_id"] for x in lines] == [1, 2]


def test_a_disk_full_in_the_stores_part_names_the_model_directory(stream, tmp_path, small_disk):
    """Room for dense.pt but not the store's files: the store's no_space, as an ENOSPC naming
    the checkpoint's directory; nothing of the save left."""
    model = small_disk / "m"
    cfg = small_config(stream, model, **ONE_DAY)
    with OnlineTrainer(cfg, job_id="job-a") as t:
        specs = t.passes_todo()
        t.run_pass(specs[0])
        first = layout.checkpoint_dir(model, "20190720", 1)
        dense = (first / "dense.pt").stat().st_size
        sparse = sum(p.stat().st_size for p in (first / "sparse").rglob("*") if p.is_file())
        assert sparse > dense + (32 << 10), (dense, sparse)  # room for one, not the other
        filler = fill(small_disk)
        with filler.open("r+b") as f:  # give back room for dense.pt (and its directories)
            f.truncate(filler.stat().st_size - dense - (8 << 10))
        with pytest.raises(PassFailed) as err:
            t.run_pass(specs[1])
    text = str(err.value)
    assert "rank 0: OSError: [Errno 28]" in text, text
    assert str(layout.checkpoint_dir(model, "20190720", 2)) in text, text
    assert "sparse" in text, text  # the store's own words, quoted
    assert partial_saves(model) == []
