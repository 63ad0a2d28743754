"""Trainer checkpoints in PaddleRec's model layout (see :mod:`streamrec.layout`).

A full checkpoint ``model_root/YYYYMMDD/<pass_id>/`` holds::

    dense.pt        dense model + optimizer + LR scheduler + trainer state (torch.save of
                    plain tensors and numbers, read back with weights_only=True)
    sparse/         the embedding store's own save (its manifest carries its checksums)
    MANIFEST.json   written last: day, pass_id, sha256 of dense.pt and of every JSON file
                    under sparse/ (the store's manifests)

A directory without MANIFEST.json was interrupted and is never loaded; a manifest whose
checksums do not match raises :class:`CheckpointError` before anything is changed.

Base, delta and batch models have the same shape (their ``sparse/`` holds the store's save in
that mode). :func:`write_model` writes any of them, :func:`read_checkpoint` and
:func:`restore_dense` read a checkpoint back; the trainer only decides when and on which rank.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from streamrec import layout
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


def save_dense(path: Path, state: dict[str, Any]) -> None:
    """torch.save via a temporary name, so a crash never leaves a half file under ``path``."""
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


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


def read_manifest(directory: Path) -> dict[str, Any]:
    """Reads and verifies a manifest; raises CheckpointError naming the first mismatch."""
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
    directory: Path, state: dict[str, Any], store: SparseStore, mode: str, info: dict[str, Any]
) -> Path:
    """Dense state, the store's save in ``mode`` and the manifest (last) into a fresh
    ``directory``. One process writes it (the store saves every shard)."""
    fresh_dir(directory)
    save_dense(directory / DENSE_NAME, state)
    faults.checkpoint_write(str(directory))
    store.save(str(directory / SPARSE_NAME), mode=mode)
    write_manifest(directory, dict(info, mode=mode))
    return directory


def read_checkpoint(directory: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest, dense state) of a complete checkpoint, checksums verified."""
    manifest = read_manifest(directory)
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


def load_sparse(store: SparseStore, directory: Path) -> None:
    """The store's part of a checkpoint back into ``store`` (every shard)."""
    store.load(str(directory / SPARSE_NAME))
