"""Which job a model directory belongs to: one model directory, one job.

Two jobs writing one ``model_save_path`` overwrite each other's checkpoints and lineage (the
API refuses such a job, this is the trainer's own guard, e.g. for jobs created before that)::

    model_root/owner.json          {"job_id": ..., "claimed_at": ...}: written by the first
                                   save of a job into the directory (created exclusively: of
                                   two trainers saving at once, the second finds the first's)
    model_root/*/*/MANIFEST.json   every save's manifest names its job (``job_id``)

A trainer of job B finding job A named there refuses with
:class:`~streamrec.trainer.errors.ModelDirTaken` (a ``BadRequest``: raised while the trainer
is built, the agent reports it ``fatal`` and the API fails the job; again before each save
and pass record, should A have claimed the directory since). Directories written before (no
owner file, manifests without a job id) stay loadable and belong to the first job that saves
there. A trainer without a job id (on its own, without a store namespace) neither checks nor
claims.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

from streamrec.layout import MANIFEST_NAME
from streamrec.trainer.errors import CheckpointError, ModelDirTaken

OWNER_NAME = "owner.json"


def owner_of(model_root: Path) -> tuple[str, Path] | None:
    """(job id, the file naming it) of ``model_root``: its owner file, else the first save's
    manifest that names a job; None when nothing there names one."""
    owner = model_root / OWNER_NAME
    try:
        body = json.loads(owner.read_text())
    except FileNotFoundError:
        body = None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {owner}: {exc}") from exc
    if body is not None:
        job_id = body.get("job_id") if isinstance(body, dict) else None
        if not isinstance(job_id, str) or not job_id:
            raise CheckpointError(f"{owner}: no job_id (not a model directory's owner file)")
        return job_id, owner
    for manifest in sorted(model_root.glob(f"*/*/{MANIFEST_NAME}")):
        try:
            body = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue  # unreadable: read_model_manifest says so if it is ever loaded
        job_id = body.get("job_id") if isinstance(body, dict) else None
        if isinstance(job_id, str) and job_id:
            return job_id, manifest
    return None


def check_owner(model_root: Path, job_id: str | None) -> None:
    """Raises :class:`ModelDirTaken` when ``model_root`` belongs to a job other than
    ``job_id`` (None: not checked)."""
    if job_id is None:
        return
    found = owner_of(model_root)
    if found is not None and found[0] != job_id:
        other, where = found
        raise ModelDirTaken(
            f"model directory {model_root} belongs to job {other!r} ({where} says so), not to "
            f"job {job_id!r}: one model directory, one job (give job {job_id!r} another "
            f"checkpoint.model_save_path)"
        )


def claim(model_root: Path, job_id: str | None) -> None:
    """:func:`check_owner`, then ``owner.json`` naming ``job_id`` when there is none yet
    (linked into place: it appears whole, and only one of two claims wins)."""
    if job_id is None:
        return
    check_owner(model_root, job_id)
    owner = model_root / OWNER_NAME
    if not owner.exists():
        model_root.mkdir(parents=True, exist_ok=True)
        tmp = model_root / f".{OWNER_NAME}.tmp-{uuid.uuid4().hex[:12]}"
        tmp.write_text(json.dumps({"job_id": job_id, "claimed_at": time.time()}))
        try:
            os.link(tmp, owner)
        except FileExistsError:
            pass  # another trainer claimed it meanwhile: its file decides, below
        finally:
            tmp.unlink(missing_ok=True)
    check_owner(model_root, job_id)  # the file there now, ours or the first claim's
