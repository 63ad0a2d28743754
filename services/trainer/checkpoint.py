"""Trainer checkpoints in the model layout of seed 002 (see :mod:`streamrec.layout`).

A full checkpoint ``model_root/YYYYMMDD/<pass_id>/`` holds::

    dense.pt        dense model + optimizer + LR scheduler + trainer state (torch.save of
                    plain tensors and numbers, read back with weights_only=True)
    sparse/         the embedding store's own save (its manifest carries its checksums)
    MANIFEST.json   written last: day, pass_id, sha256 of dense.pt and of every JSON file
                    under sparse/ (the store's manifests)

A directory without MANIFEST.json was interrupted and is never loaded; a manifest whose
checksums do not match raises :class:`CheckpointError` before anything is changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from streamrec.layout import MANIFEST_NAME
from streamrec.trainer.errors import CheckpointError

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
