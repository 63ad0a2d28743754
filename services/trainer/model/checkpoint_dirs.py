"""Trainer checkpoints in PaddleRec's model layout (see :mod:`streamrec.layout`).

A full checkpoint ``model_root/YYYYMMDD/<pass_id>/`` holds::

    dense.pt        dense model + optimizer + LR scheduler + trainer state (torch.save of
                    plain tensors and numbers, read back with weights_only=True)
    sparse/         the embedding store's own save (its manifest carries its checksums)
    MANIFEST.json   written last: day, pass_id, sha256 of dense.pt and of every JSON file
                    under sparse/ (the store's manifests)

Everything is written into a staging sibling ``.<name>.tmp-<id>/`` (dense part, the store's
save, the manifest last) that is renamed onto ``<name>/`` once complete, so a failure (a full
disk) leaves no ``<name>/`` holding part of a save: the staging is removed, a directory it was
to replace is kept, and a full disk is an ``OSError`` (ENOSPC) naming the directory and the
bytes free on its filesystem. A directory without MANIFEST.json was interrupted (written
before staging) and is never loaded; a manifest whose checksums do not match raises
:class:`CheckpointError` before anything is changed. The manifest names the job that wrote it
(``job_id``, :mod:`.model_owner`); manifests without one (written before) load as well.

Base, delta and batch models have the same shape (their ``sparse/`` holds the store's save in
that mode). :func:`write_model` writes any of them, :func:`read_checkpoint` and
:func:`restore_dense` read a checkpoint back; the trainer only decides when and on which rank.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from streamrec import layout
from streamrec.dirs import free_bytes, make_parents, remove_created
from streamrec.layout import MANIFEST_NAME
from streamrec.save_modes import SaveMode
from streamrec.trainer import faults
from streamrec.trainer.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from streamrec.embedding_store import SparseStore

DENSE_NAME = "dense.pt"
SPARSE_NAME = "sparse"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


#: errnos that mean the disk (or the user's quota) is full
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def save_dense(path: Path, state: dict[str, Any]) -> None:
    """torch.save via a temporary name, so a crash never leaves a half file under ``path``.

    Serialized in memory first (the dense part is small) and written with plain file I/O:
    torch.save into a full disk says ``unexpected pos`` without an errno, a write says ENOSPC.
    """
    buf = io.BytesIO()
    torch.save(state, buf)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        f.write(buf.getbuffer())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def no_space(exc: OSError, directory: Path, what: str) -> OSError:
    """The ENOSPC of ``what`` into ``directory``, naming it and the bytes free on its
    filesystem (not the process's working directory's)."""
    free = free_bytes(directory)
    left = "unknown" if free is None else f"{free} bytes"
    return OSError(
        exc.errno,
        f"{what} to {directory}: no space left on its filesystem ({left} free there; "
        f"{exc.strerror or exc}); nothing of this save was kept",
        str(directory),
    )


def load_dense(path: Path) -> dict[str, Any]:
    """Reads a dense state; never unpickles arbitrary objects (weights_only=True)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as exc:
        raise CheckpointError(f"dense state {path} is missing") from exc
    except Exception as exc:  # a corrupt or foreign file: say which
        raise CheckpointError(f"cannot read dense state {path}: {exc}") from exc


def _checked_files(directory: Path) -> list[Path]:
    files = [directory / DENSE_NAME] if (directory / DENSE_NAME).is_file() else []
    sparse = directory / SPARSE_NAME
    if sparse.is_dir():
        files += sorted(p for p in sparse.rglob("*.json") if p.is_file())
    return files


def write_manifest(directory: Path, info: dict[str, Any]) -> Path:
    """Writes MANIFEST.json last (via rename) with checksums of the files it vouches for."""
    checks = {str(p.relative_to(directory)): sha256_file(p) for p in _checked_files(directory)}
    body = dict(info, written_at=time.time(), sha256=checks)
    tmp = directory / f".{MANIFEST_NAME}.tmp"
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True))
    os.replace(tmp, directory / MANIFEST_NAME)
    return directory / MANIFEST_NAME


def read_model_manifest(directory: Path) -> dict[str, Any]:
    """Reads and verifies a model directory's manifest (the trainer's, not the store's
    :func:`streamrec.embedding_store.persistence.manifests.read_manifest`); raises CheckpointError
    naming the first mismatch."""
    path = directory / MANIFEST_NAME
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise CheckpointError(f"{directory} has no {MANIFEST_NAME}: incomplete") from exc
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if not isinstance(body, dict) or not isinstance(body.get("sha256"), dict):
        raise CheckpointError(f"{path}: not a trainer manifest (no sha256 map)")
    for rel, digest in body["sha256"].items():
        f = directory / rel
        if not f.is_file():
            raise CheckpointError(f"{path}: file {rel} is missing")
        if sha256_file(f) != digest:
            raise CheckpointError(f"{path}: checksum of {rel} does not match")
    return body


def fresh_dir(directory: Path) -> Path:
    """Removes a leftover (incomplete) directory and creates it empty."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    return directory


def model_dir(model_root: Path, mode: str, day: str, pass_id: int | None = None) -> Path:
    """Where a save of ``mode`` after ``day`` (and pass ``pass_id``) goes (streamrec.layout)."""
    if mode in (SaveMode.CHECKPOINT, SaveMode.DELTA):
        if pass_id is None:
            raise ConfigError(f"a {mode} save needs a pass_id")
        if mode == SaveMode.CHECKPOINT:
            return layout.checkpoint_dir(model_root, day, pass_id)
        return layout.delta_dir(model_root, day, pass_id)
    if mode == SaveMode.BASE:
        return layout.base_dir(model_root, day)
    if mode == SaveMode.BATCH:
        return layout.batch_dir(model_root, day)
    raise ConfigError(f"mode must be one of {[m.value for m in SaveMode]}, got {mode!r}")


def dense_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    last_pass: tuple[str, int] | None,
    step: int,
    arch: dict[str, Any],
) -> dict[str, Any]:
    """What ``dense.pt`` holds: plain tensors, numbers and strings (loadable weights_only)."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "trainer": {
            "day": last_pass[0] if last_pass else "",
            "pass_id": last_pass[1] if last_pass else 0,
            "step": step,
        },
        "arch": json.dumps(arch),
    }


def write_model(
    directory: Path, state: dict[str, Any], store: SparseStore, mode: SaveMode, info: dict[str, Any]
) -> Path:
    """Dense state, the store's save in ``mode`` and the manifest (last) into a staging
    sibling of ``directory``, renamed onto it once complete (an existing ``directory`` is
    replaced then). One process writes it (the store saves every shard).

    Raises:
        OSError: ENOSPC naming ``directory`` and the bytes free on its filesystem; nothing
            of the save is left (staging and the parents it created removed).
    """
    created = _make_parents(directory)
    _remove_leftovers(directory)
    staging = directory.with_name(f".{directory.name}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        staging.mkdir()
        save_dense(staging / DENSE_NAME, state)
        faults.checkpoint_write(str(staging))
        store.save(str(staging / SPARSE_NAME), mode=mode)
        write_manifest(staging, dict(info, mode=mode))
        _swap_in(staging, directory)
    except BaseException as exc:
        full = None
        if _is_no_space(exc):
            own = isinstance(exc, OSError) and exc.errno in NO_SPACE
            cause = exc if isinstance(exc, OSError) and own else OSError(errno.ENOSPC, str(exc))
            full = no_space(cause, directory, f"{mode} save")
        shutil.rmtree(staging, ignore_errors=True)
        remove_created(created)
        if full is not None:
            raise full from exc
        raise
    return directory


def _is_no_space(exc: BaseException) -> bool:
    """A full disk: an OSError's errno, or the store's ``no_space`` (in-process or a shard's)."""
    return (isinstance(exc, OSError) and exc.errno in NO_SPACE) or (
        getattr(exc, "code", None) == "no_space"
    )


def _swap_in(staging: Path, directory: Path) -> None:
    """Renames the complete ``staging`` onto ``directory`` (one set aside first, then removed)."""
    old = None
    if directory.exists():
        old = directory.with_name(f".{directory.name}.old-{uuid.uuid4().hex[:12]}")
        os.replace(directory, old)
    os.replace(staging, directory)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _remove_leftovers(directory: Path) -> None:
    """Staging and set-aside copies of ``directory`` left by a killed save (one job writes a
    model directory, :mod:`.model_owner`: none is another save's)."""
    for pattern in (f".{directory.name}.tmp-*", f".{directory.name}.old-*"):
        for p in directory.parent.glob(pattern):
            shutil.rmtree(p, ignore_errors=True)


def _make_parents(directory: Path) -> list[Path]:
    """The missing parents of ``directory`` made (:func:`streamrec.dirs.make_parents`); a
    full disk raises ENOSPC naming the path and its filesystem's free bytes."""
    try:
        return make_parents(directory)
    except OSError as exc:
        if exc.errno in NO_SPACE:
            raise no_space(exc, directory.parent, "a save") from exc
        raise


def read_checkpoint(directory: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest, dense state) of a complete checkpoint, checksums verified."""
    manifest = read_model_manifest(directory)
    return manifest, load_dense(directory / DENSE_NAME)


def restore_dense(
    state: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    source: Path,
) -> int:
    """Loads a dense state into the model, optimizer and LR scheduler; returns its step.

    Raises CheckpointError naming ``source`` when the state does not fit this model.
    """
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        return int(state["trainer"]["step"])
    except (KeyError, RuntimeError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{source}: dense state does not fit this model: {exc}") from exc


def load_sparse(store: SparseStore, directory: Path) -> str | None:
    """The store's part of a checkpoint back into ``store`` (every shard); "M -> N" when it
    was saved by M shards and loaded into N (resharded), else None."""
    loaded = store.load(str(directory / SPARSE_NAME))
    resharded = loaded.get("resharded") if isinstance(loaded, dict) else None
    return str(resharded) if resharded else None
