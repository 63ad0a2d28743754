"""Save and load of a store: full checkpoints, batch models, base and delta models (PaddleRec's).

A save writes one directory (one store or one shard; the trainer puts the shards and the
dense part under ``model_root/YYYYMMDD/<pass_id>/``, see docs/architecture.md)::

    <path>/
      <table>.keys.npy          (n,) int64            checkpoint / batch: every row
      <table>.rows.npy          (n, width) float32    full rows: stats, weights, optimizer state,
                                                      as stored (the table's dtype, in options)
      <table>.deleted.npy       (d,) int64            keys deleted since the last base/delta
      <table>.<mode>.keys.npy   (n,) int64            base / delta through FileConverter
      <table>.<mode>.values.npy (n, dim) float32      weights only (serving)
      <table>.delta.deleted.npy (d,) int64            a delta's deletes
      MANIFEST.json             written last: format, version, mode, day, model_version,
                                applies_on, tables (options, rows, dim, width, deleted),
                                files (sha256, bytes), converter, extra

Crash safety: everything is written into a sibling ``.<name>.tmp-<uuid>`` directory, fsynced,
the manifest last, then renamed onto ``<path>`` (an existing ``<path>`` is first renamed aside
and removed after). A crash or a full disk leaves the previous ``<path>`` as it was, so a
directory with a MANIFEST.json is always complete; a save that fails also removes the
parent directories it created. Disk errors come back as codes (``no_space`` with the path
and the bytes free, ``exists``, ``bad_request``; :mod:`~streamrec.embedding_store.disk`);
a shard backs off saves to a filesystem it found full. Loading verifies every file's size and
sha256 and every table before changing anything in the store (the manifest readers and
checks: :mod:`~streamrec.embedding_store.persistence.manifests`).

A shard service's save is one such directory per shard, ``<path>/shard-K-of-N/`` (the
client's ``save``). The in-process store loads either shape (:func:`saved_parts`): all N
shard directories are verified, then every row of every shard goes into the one store (a
model trained on N shards serves, predicts and warm-starts in one process).

Compact rows (``TableOptions.dtype`` fp16, bf16): checkpoints hold the rows' words as the
table stores them, the dtype in the table's manifest options; a checkpoint loads into a table
of another dtype converted (decoded, encoded to nearest; logged), and its NaN/Inf check reads
the decoded values. Base, delta and the online export write float32 weights whatever the dtype.

Selections: checkpoint and batch take every row (batch is meant after the daily shrink);
base takes score >= base_threshold; delta takes rows changed since the previous base/delta
with score >= delta_threshold and unseen days <= delta_keep_days. Base and delta clear the
changed flags (restored if the save fails).

Deletes and versions (:mod:`~streamrec.embedding_store.deletes`, :mod:`.versions`): a delta
also carries the keys deleted since the previous base/delta (less those it writes), a base
drops that record, both restore it if the save fails; checkpoint and batch keep it in
``<table>.deleted.npy``. Each base and delta is numbered (``model_version``, a delta's
``applies_on``); loading a delta removes its deleted keys and is refused unless it applies
on the store's version. A base or delta loaded, or a checkpoint, sets the store's version.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from streamrec.dirs import make_parents, remove_created
from streamrec.embedding_store.deletes import DeleteReason
from streamrec.embedding_store.disk import disk_error
from streamrec.embedding_store.errors import CheckpointError, InvalidInput
from streamrec.embedding_store.persistence.converters import (
    Converter,
    FileConverter,
    NpyWriter,
    load_deleted,
    load_npy,
    save_npy,
)
from streamrec.embedding_store.persistence.manifests import (
    FORMAT,
    MANIFEST,
    VERSION,
    check_deleted_count,
    check_one_save,
    check_path,
    check_rows_finite,
    check_table,
    deleted_file,
    file_sha256,
    log_conversion,
    read_manifest,
    rows_for_tier,
    saved_dtype,
    saved_parts,
)
from streamrec.embedding_store.persistence.reshard import load_resharded
from streamrec.embedding_store.persistence.versions import (
    SaveVersion,
    check_applies,
    held_version,
)
from streamrec.embedding_store.tiers import row_codec
from streamrec.embedding_store.tiers.table_tier import SELECT_ALL, SELECT_BASE, SELECT_DELTA
from streamrec.save_modes import FULL_MODES, SaveMode, parse_save_mode

if TYPE_CHECKING:
    from streamrec.embedding_store.persistence.tables import TablesOnTiers


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_store(
    store: TablesOnTiers,
    path: str | os.PathLike[str],
    mode: SaveMode,
    converter: Converter | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Writes ``store`` to ``path`` in ``mode``; returns the manifest (see the module doc)."""
    mode = parse_save_mode(mode, "mode", InvalidInput)
    if converter is not None and not isinstance(converter, Converter):
        raise InvalidInput(f"converter must be a Converter, got {type(converter).__name__}")
    path = check_path(path)
    created: list[Path] = []
    try:
        created = make_parents(path)
        return _save(store, path, mode, converter, extra)
    except OSError as exc:
        remove_created(created)
        mapped = disk_error(exc, path)
        if mapped is exc:
            raise
        raise mapped from exc
    except BaseException:
        remove_created(created)
        raise


def _save(
    store: TablesOnTiers,
    path: Path,
    mode: SaveMode,
    converter: Converter | None,
    extra: dict[str, Any] | None,
) -> dict[str, Any]:
    """:func:`save_store` into a staging directory renamed onto ``path`` when complete."""
    started = time.time()
    staging = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"
    staging.mkdir()
    cleared: dict[str, torch.Tensor] = {}
    taken: dict[str, torch.Tensor] = {}  # the deletes record a base/delta took, per table
    full = mode in FULL_MODES
    version = None if full else SaveVersion.next(store.model_version, mode)
    conv = converter or FileConverter(staging)
    try:
        tables: dict[str, Any] = {}
        hashed: dict[str, tuple[str, int]] = {}  # files written streaming: sha256, bytes
        for name in store.tables:
            with store.exclusive(name) as tier:
                record = store.deleted_keys(name)
                if full and tier.streams_rows:
                    n = _save_streaming(tier, staging, name, hashed)
                    deleted = record.keys()
                    save_npy(staging / deleted_file(name), deleted.numpy())
                    tables[name] = {
                        "rows": n,
                        "dim": tier.dim,
                        "width": tier.width,
                        "options": tier.options.model_dump(mode="json"),
                        "deleted": int(deleted.numel()),
                    }
                    continue
                if full:
                    keys, rows = tier.export(SELECT_ALL)
                    deleted = record.keys()
                else:
                    keys, rows = tier.export(SELECT_BASE if mode == SaveMode.BASE else SELECT_DELTA)
                    tier.clear_dirty()
                    cleared[name] = keys
                    taken[name] = record.take()
                    # a key deleted and made again since is written, not deleted
                    deleted = taken[name][~torch.isin(taken[name], keys)]
                    if mode == SaveMode.BASE:
                        deleted = deleted[:0]
            if full:
                save_npy(staging / f"{name}.keys.npy", keys.numpy())
                save_npy(staging / f"{name}.rows.npy", rows.numpy())
                save_npy(staging / deleted_file(name), deleted.numpy())
            else:
                values = tier.weights_of(rows).numpy()  # float32 whatever the dtype
                conv.write_rows(
                    name,
                    keys.numpy(),
                    values,
                    mode,
                    mode,
                    deleted=deleted.numpy() if mode == SaveMode.DELTA else None,
                    version=version,
                )
            tables[name] = {
                "rows": int(keys.numel()),
                "dim": tier.dim,
                "width": tier.width,
                "options": tier.options.model_dump(mode="json"),
                "deleted": int(deleted.numel()),
            }
        files = {
            p.name: {
                "sha256": hashed[p.name][0] if p.name in hashed else file_sha256(p),
                "bytes": p.stat().st_size,
            }
            for p in sorted(staging.iterdir())
            if p.is_file()
        }
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "mode": mode,
            "day": store.day,
            **(SaveVersion(store.model_version) if version is None else version).fields(),
            "tier": store.options.tier,
            "seed": store.options.seed,
            "created_unix": started,
            "save_seconds": time.time() - started,
            "converter": "files" if converter is None else conv.describe(),
            "tables": tables,
            "files": files,
            "extra": extra or {},
        }
        tmp = staging / (MANIFEST + ".part")
        with open(tmp, "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, staging / MANIFEST)
        _fsync_dir(staging)
        _replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for name, keys in cleared.items():  # the failed save saved nothing: changes stay due
            with store.exclusive(name) as tier:
                tier.mark_dirty(keys)
                store.deleted_keys(name).add(taken.get(name, keys[:0]))
        raise
    if version is not None:
        store.model_version = version.number
    return manifest


def _save_streaming(tier: Any, staging: Path, name: str, hashed: dict[str, tuple[str, int]]) -> int:
    """Writes every row of ``tier`` (a tier that ``streams_rows``: the ssd tier) to the
    table's .keys.npy and .rows.npy a chunk at a time (:class:`NpyWriter`, hashed as
    written): the save holds one chunk, whatever the table's size. Returns the rows."""
    n = tier.size()
    keys_f = NpyWriter(staging / f"{name}.keys.npy", np.int64, (n,))
    rows_f = NpyWriter(staging / f"{name}.rows.npy", np.float32, (n, tier.width))
    try:
        for keys, rows in tier.export_chunks(SELECT_ALL):
            keys_f.write(keys.numpy())
            rows_f.write(rows.numpy())
    finally:
        for f in (keys_f, rows_f):
            digest = f.close()
            hashed[f.path.name] = (digest, f.bytes)
    return n


def _replace(staging: Path, path: Path) -> None:
    """Renames the complete ``staging`` onto ``path``, keeping the old one until then."""
    aside = None
    if path.exists() or path.is_symlink():
        aside = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:12]}"
        os.rename(path, aside)
    try:
        os.rename(staging, path)
    except BaseException:
        if aside is not None:
            os.rename(aside, path)
        raise
    _fsync_dir(path.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def load_store(
    store: TablesOnTiers,
    path: str | os.PathLike[str],
    converter: Converter | None = None,
    shard: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Loads a save written by :func:`save_store` into ``store``: one directory, or the
    ``shard-K-of-N/`` directories of a shard service's save (:func:`saved_parts`), whose rows
    all go into this one store (the shards' keys are disjoint; the day is the latest one).
    ``shard`` (K, N): only the keys of shard K of N, from a save of any shard count
    (:mod:`~streamrec.embedding_store.persistence.reshard`, streaming).

    checkpoint/batch replace the rows of the tables they hold (day, version and deletes
    record included); base/delta set the weights of their keys, a delta also removes the
    keys it deleted and applies only on the version it was saved after (VersionConflict
    otherwise, naming both). Everything is read and checked before the store changes, so a
    bad checkpoint leaves the store as it was.

    Returns:
        The manifest (of a sharded save: shard 0's, with ``shards``: the number of parts).
    """
    if shard is not None:
        return load_resharded(store, path, shard[0], shard[1], converter)
    parts = saved_parts(path)
    manifests = [read_manifest(part) for part in parts]
    check_one_save(parts, manifests)
    manifest = manifests[0]
    full = manifest["mode"] in FULL_MODES
    version = SaveVersion.of_manifest(manifest)
    check_applies(path, version, store.model_version)
    if full and any(
        name in store.tables and store.tier(name).streams_rows for name in manifest["tables"]
    ):
        # the ssd tier: streaming, a chunk at a time (all of this store's keys: shard 0 of 1)
        loaded = load_resharded(store, path, 0, 1, converter)
        for k in ("resharded", "rows", "seconds", "bytes_read"):
            loaded.pop(k)
        if len(parts) == 1:
            loaded.pop("shards")
        return loaded
    if len(parts) > 1 and converter is not None and not full:
        raise InvalidInput(
            f"converter: a save of {len(parts)} shards is read from each shard's files, got "
            f"{converter.describe()} (load it into the shards that saved it)"
        )
    read = [
        _read_part(store, part, m, converter or FileConverter(part))
        for part, m in zip(parts, manifests, strict=True)
    ]
    staged: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    for name in manifest["tables"]:
        keys = np.concatenate([r[name][0] for r in read])
        values = np.concatenate([r[name][1] for r in read])
        deleted = np.unique(np.concatenate([r[name][2] for r in read]))
        if np.unique(keys).size != keys.shape[0]:
            across = f" across its {len(parts)} shards" if len(parts) > 1 else ""
            raise CheckpointError(f"{str(path)!r}: table {name!r} repeats keys{across}")
        cap = store.tier(name).capacity
        if full and cap is not None and keys.shape[0] > cap:
            raise CheckpointError(
                f"{str(path)!r}: table {name!r} has {keys.shape[0]} rows, capacity is {cap}"
            )
        staged[name] = (torch.from_numpy(keys), torch.from_numpy(values), torch.from_numpy(deleted))
    for name, (staged_keys, staged_values, staged_deleted) in staged.items():
        with store.exclusive(name) as tier:
            if full:
                tier.reset()
                tier.import_rows(staged_keys, staged_values)
                store.deleted_keys(name).replace(staged_deleted)
            else:
                tier.import_weights(staged_keys, staged_values)
                gone = tier.erase(staged_deleted)
                store.count_deleted(name, DeleteReason.DELTA_LOAD, int(gone.numel()))
    if full:
        store.day = max(int(m.get("day", 0)) for m in manifests)
    held = held_version(manifests)
    if held is not None:
        store.model_version = held
    return manifest if len(parts) == 1 else {**manifest, "shards": len(parts)}


def _read_part(
    store: TablesOnTiers, path: Path, manifest: dict[str, Any], conv: Converter
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The rows (keys, values) and deleted keys per table of one verified directory, checked
    against ``store``'s tables and ``manifest`` (nothing of the store changes)."""
    full = manifest["mode"] in FULL_MODES
    out: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for name, meta in manifest["tables"].items():
        tier = check_table(store, path, name, meta, full)
        if full:
            keys = load_npy(path / f"{name}.keys.npy")
            values = load_npy(path / f"{name}.rows.npy")
            deleted = load_deleted(path / deleted_file(name))
            width = row_codec.row_width(saved_dtype(path, name, meta), tier.payload)
            want = (keys.shape[0], width) if keys.ndim == 1 else None
        else:
            keys, values = conv.read_rows(name, manifest["mode"])
            deleted = conv.read_deleted(name, manifest["mode"])
            want = (keys.shape[0], tier.dim) if keys.ndim == 1 else None
        if full or isinstance(conv, FileConverter):  # a serving Redis applied them already
            check_deleted_count(path, name, meta, deleted)
        if (
            keys.dtype != np.int64
            or want is None
            or values.dtype != np.float32
            or (values.shape != want)
            or keys.shape[0] != meta.get("rows")
        ):
            raise CheckpointError(
                f"{str(path)!r}: table {name!r}: keys {keys.dtype} {keys.shape} and values "
                f"{values.dtype} {values.shape} do not match the manifest ({meta.get('rows')} rows)"
            )
        if full:  # rows as saved: a compact row's values decoded first
            check_rows_finite(path, name, meta, tier, torch.from_numpy(values))
            log_conversion(path, name, meta, tier)
            values = rows_for_tier(path, name, meta, tier, torch.from_numpy(values)).numpy()
        elif not np.isfinite(values).all():
            raise CheckpointError(f"{str(path)!r}: table {name!r} holds NaN or Inf")
        out[name] = (keys, values, deleted)
    return out
