"""A save of any shard count loaded into shard K of N (resharding), streaming.

A save of M shards (``path/shard-J-of-M/``, or one store's ``path/MANIFEST.json``: M = 1)
holds each key in the part of shard ``keyhash.shard_of(key, M)``. Shard K of N takes the
keys with ``shard_of(key, N) == K`` from every part, full rows (weights, optimizer state,
show/click, flags) as saved::

    save of 2     shard-0-of-2 keys [a, b, c]        shard-1-of-2 keys [d, e]
    shard_of(., 3)               0  2  1                               1  0
    shard 0 of 3  [a]  + [e]       shard 1 of 3  [c] + [d]       shard 2 of 3  [b]

Streaming: each part's files are read :func:`chunk_rows` rows at a time by ``pread``
(``converters.NpyReader``: nothing mapped); only the rows routed here are kept, so the load
adds one chunk to the rows the shard ends with, whatever the table's size.

Two passes over each part. The first changes nothing: the manifests (sizes, sha256), one
mode and one set of tables, each table's dim, width and optimizers against this store, every
key in the part of the shard that saved it (so the parts are disjoint), the rows kept finite,
their number within the tier's capacity. The second imports the kept rows chunk by chunk
under the table's write lock: checkpoint/batch replace the table's rows (and the day: the
latest part's; the deletes record: this shard's keys of it), base/delta set the weights of
their keys over what the store holds (load the base, then each delta in order: a delta also
removes this shard's keys of its deletes, and applies only on the store's version,
:mod:`.versions`). Base/delta rows are read from the parts' files: a save sent
to a serving Redis loads only into the shards that saved it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from streamrec.embedding_store.deletes import DeleteReason
from streamrec.embedding_store.errors import CheckpointError, InvalidInput
from streamrec.embedding_store.persistence.converters import (
    Converter,
    FileConverter,
    NpyReader,
    load_deleted,
)
from streamrec.embedding_store.persistence.manifests import (
    check_deleted_count,
    check_one_save,
    check_rows_finite,
    check_table,
    deleted_file,
    log_conversion,
    read_manifest,
    rows_for_tier,
    saved_dtype,
    saved_parts,
)
from streamrec.embedding_store.persistence.versions import SaveVersion, check_applies, held_version
from streamrec.embedding_store.tiers import row_codec
from streamrec.keyhash import shard_of
from streamrec.save_modes import FULL_MODES

if TYPE_CHECKING:
    from streamrec.embedding_store.persistence.tables import TablesOnTiers

log = logging.getLogger(__name__)

#: bytes of rows read from a part at a time (one chunk's copy is what a load adds)
CHUNK_BYTES = 16 << 20


def chunk_rows(width: int) -> int:
    """Rows per chunk of rows ``width`` floats wide."""
    return max(1024, CHUNK_BYTES // (4 * max(1, width)))


def _mapped(path: Path) -> NpyReader:
    """An .npy file read a chunk at a time by pread (never unpickled; nothing stays mapped)."""
    return NpyReader(path)


def _files(part: Path, name: str, mode: str) -> tuple[Path, Path]:
    if mode in FULL_MODES:
        return part / f"{name}.keys.npy", part / f"{name}.rows.npy"
    return FileConverter(part).paths(name, mode)


def _deleted(part: Path, name: str, mode: str) -> np.ndarray:
    """The deleted keys (d,) int64 of table ``name`` in ``part``: a checkpoint's record, a
    delta's deletes (none for a base)."""
    if mode in FULL_MODES:
        return load_deleted(part / deleted_file(name))
    return FileConverter(part).read_deleted(name, mode)


def _chunks(
    keys: NpyReader, values: NpyReader, shard_id: int, num_shards: int
) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """(start, chunk's keys, mask of the ones routed to ``shard_id``, their rows) per chunk."""
    step = chunk_rows(values.shape[1] if values.ndim == 2 else 1)
    for start in range(0, keys.shape[0], step):
        k = np.asarray(keys[start : start + step])
        mask = shard_of(k, num_shards) == shard_id
        yield start, k, mask, np.asarray(values[start : start + step][mask])


def verify_save(path: str | os.PathLike[str]) -> tuple[int, str]:
    """(M, mode) of the save at ``path`` after checking it whole: every part's manifest,
    sizes and sha256, one mode and one set of tables (nothing is loaded)."""
    parts = saved_parts(path)
    manifests = [read_manifest(part) for part in parts]
    check_one_save(parts, manifests)
    return len(parts), str(manifests[0]["mode"])


def load_resharded(
    store: TablesOnTiers,
    path: str | os.PathLike[str],
    shard_id: int,
    num_shards: int,
    converter: Converter | None = None,
) -> dict[str, Any]:
    """Loads the keys of shard ``shard_id`` of ``num_shards`` from every part of the save at
    ``path`` into ``store`` (see the module doc).

    Returns:
        The first part's manifest with ``shards`` (M, the parts), ``resharded``: "M -> N",
        ``rows``: rows loaded per table, ``seconds`` and ``bytes_read`` (of the parts' files).

    Raises:
        CheckpointError: a save that is not whole, not one save, does not fit the store,
            holds a key outside its shard's part, NaN/Inf, or more rows than the capacity.
        InvalidInput: a bad shard, or a converter other than the parts' files.
    """
    if not (0 <= shard_id < num_shards):
        raise InvalidInput(f"shard must be (K, N) with 0 <= K < N, got ({shard_id}, {num_shards})")
    if converter is not None and not isinstance(converter, FileConverter):
        raise InvalidInput(
            f"converter: a save loaded into another shard count is read from its parts' "
            f"files, got {converter.describe()} (a serving Redis's rows load only into the "
            f"shards that saved them)"
        )
    started = time.perf_counter()
    parts = saved_parts(path)
    manifests = [read_manifest(part) for part in parts]
    check_one_save(parts, manifests)
    mode, saved = manifests[0]["mode"], len(parts)
    full = mode in FULL_MODES
    check_applies(path, SaveVersion.of_manifest(manifests[0]), store.model_version)
    kept, read = _check_parts(store, parts, manifests, shard_id, num_shards)
    for name, rows in kept.items():
        deleted = np.concatenate([_deleted(part, name, mode) for part in parts])
        deleted_t = torch.from_numpy(deleted[shard_of(deleted, num_shards) == shard_id])
        with store.exclusive(name) as tier:
            if full:
                tier.reset()
                store.deleted_keys(name).replace(deleted_t)
            elif deleted_t.numel():
                gone = tier.erase(torch.unique(deleted_t))
                store.count_deleted(name, DeleteReason.DELTA_LOAD, int(gone.numel()))
            for part, manifest in zip(parts, manifests, strict=True):
                meta = manifest["tables"][name]
                if full:
                    log_conversion(part, name, meta, tier)
                keys, values = (_mapped(f) for f in _files(part, name, mode))
                for _start, k, mask, v in _chunks(keys, values, shard_id, num_shards):
                    if not mask.any():
                        continue
                    k_t, v_t = torch.from_numpy(k[mask]), torch.from_numpy(v)
                    if full:
                        v_t = rows_for_tier(part, name, meta, tier, v_t)
                    (tier.import_rows if full else tier.import_weights)(k_t, v_t)
                del keys, values
            if full and tier.size() != rows:
                raise CheckpointError(
                    f"{str(path)!r}: table {name!r} repeats keys: {rows} rows kept for shard "
                    f"{shard_id} of {num_shards}, {tier.size()} distinct"
                )
    if full:
        store.day = max(int(m.get("day", 0)) for m in manifests)
    held = held_version(manifests)
    if held is not None:
        store.model_version = held
    seconds = time.perf_counter() - started
    log.info(
        "loaded %s save %s of %d shard(s) into shard %d of %d (resharded %d -> %d): %s rows "
        "in %.2f s",
        mode,
        path,
        saved,
        shard_id,
        num_shards,
        saved,
        num_shards,
        sum(kept.values()),
        seconds,
    )
    return {
        **manifests[0],
        "shards": saved,
        "resharded": f"{saved} -> {num_shards}",
        "rows": kept,
        "seconds": seconds,
        "bytes_read": read,
    }


def _check_parts(
    store: TablesOnTiers,
    parts: list[Path],
    manifests: list[dict[str, Any]],
    shard_id: int,
    num_shards: int,
) -> tuple[dict[str, int], int]:
    """The first pass (nothing changes): rows kept per table, bytes of the files read."""
    mode = manifests[0]["mode"]
    full = mode in FULL_MODES
    kept: dict[str, int] = {}
    read = 0
    for j, (part, manifest) in enumerate(zip(parts, manifests, strict=True)):
        for name, meta in manifest["tables"].items():
            tier = check_table(store, part, name, meta, full)
            width = row_codec.row_width(saved_dtype(part, name, meta), tier.payload)
            width = width if full else tier.dim
            keys, values = (_mapped(f) for f in _files(part, name, mode))
            if (
                keys.dtype != np.int64
                or keys.ndim != 1
                or values.dtype != np.float32
                or values.shape != (keys.shape[0], width)
                or keys.shape[0] != meta.get("rows")
            ):
                raise CheckpointError(
                    f"{str(part)!r}: table {name!r}: keys {keys.dtype} {keys.shape} and values "
                    f"{values.dtype} {values.shape} do not match the manifest "
                    f"({meta.get('rows')} rows of width {width})"
                )
            count = 0
            for start, k, mask, v in _chunks(keys, values, shard_id, num_shards):
                if len(parts) > 1 and not (shard_of(k, len(parts)) == j).all():
                    bad = int(np.flatnonzero(shard_of(k, len(parts)) != j)[0])
                    raise CheckpointError(
                        f"{str(part)!r}: table {name!r}: key {int(k[bad])} (row {start + bad}) "
                        f"belongs to shard {int(shard_of(k[bad : bad + 1], len(parts))[0])} of "
                        f"{len(parts)}, not to this part"
                    )
                if full:  # rows as saved: a compact row's values decoded first
                    check_rows_finite(part, name, meta, tier, torch.from_numpy(v))
                elif not np.isfinite(v).all():
                    raise CheckpointError(f"{str(part)!r}: table {name!r} holds NaN or Inf")
                count += int(mask.sum())
            deleted = _deleted(part, name, mode)
            check_deleted_count(part, name, meta, deleted)
            read += keys.nbytes + values.nbytes + deleted.nbytes
            kept[name] = kept.get(name, 0) + count
            del keys, values
    for name, rows in kept.items():
        cap = store.tier(name).capacity
        if full and cap is not None and rows > cap:
            raise CheckpointError(
                f"{str(parts[0].parent if len(parts) > 1 else parts[0])!r}: table {name!r} has "
                f"{rows} rows for shard {shard_id} of {num_shards}, capacity is {cap}"
            )
    return kept, read
