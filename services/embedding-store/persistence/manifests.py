"""The manifests of a store's saves: what a save directory holds and the checks before a load.

A save directory (:mod:`~streamrec.embedding_store.persistence.save_load` writes it) ends with
``MANIFEST.json``: format, version, mode, day, ``model_version`` and ``applies_on``
(:mod:`~streamrec.embedding_store.persistence.versions`), tables (options, rows, dim, width,
deleted), files (sha256, bytes), converter, extra. A shard service's save is one such
directory per shard, ``<path>/shard-K-of-N/``. Both the full load (checkpoint) and the
resharding one (reshard) read a save through these: :func:`saved_parts` (the directories of
one save), :func:`read_manifest` (one directory's manifest, every file's size and sha256
checked), :func:`check_one_save` (the parts are one save) and :func:`check_table` (a saved
table fits the store's). None of them changes a store.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamrec.embedding_store.errors import CheckpointError, InvalidInput
from streamrec.embedding_store.persistence.versions import check_parts_agree, check_version_fields
from streamrec.embedding_store.tiers import row_codec
from streamrec.save_modes import FULL_MODES, parse_save_mode
from streamrec.store_schema import ROW_DTYPES

if TYPE_CHECKING:
    import torch
    from streamrec.embedding_store.persistence.tables import TablesOnTiers
    from streamrec.embedding_store.tiers.table_tier import TableTier

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
FORMAT = "streamrec-embedding-store"
VERSION = 1


def deleted_file(table: str) -> str:
    """The file of a checkpoint or batch save that holds ``table``'s keys deleted since the
    store's last base or delta (:mod:`~streamrec.embedding_store.deletes`): loaded back, the
    store's next delta still carries them."""
    return f"{table}.deleted.npy"


def shard_dir_name(shard_id: int, num_shards: int) -> str:
    """The per-shard directory under a save path or ``persistent_path``: ``shard-K-of-N``
    (read back by :func:`parse_shard_dir_name`)."""
    return f"shard-{shard_id}-of-{num_shards}"


_SHARD_DIR = re.compile(r"^shard-(\d+)-of-(\d+)$")


def parse_shard_dir_name(name: str) -> tuple[int, int] | None:
    """(K, N) of a :func:`shard_dir_name` ``shard-K-of-N``; None for any other name."""
    m = _SHARD_DIR.match(name)
    return None if m is None else (int(m.group(1)), int(m.group(2)))


def file_sha256(path: Path) -> str:
    """The sha256 hex digest of the file at ``path``, read a MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path; InvalidInput unless it names a directory (not empty, not ".")."""
    if not isinstance(path, (str, os.PathLike)) or str(path).strip() in ("", "."):
        raise InvalidInput(f"path must name a directory, got {path!r}")
    return Path(path)


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a saved directory after checking every file it lists.

    Raises:
        CheckpointError: no directory, no or unreadable manifest, a missing file, a size or
            checksum that differs.
    """
    path = check_path(path)
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint directory at {str(path)!r}")
    mpath = path / MANIFEST
    try:
        manifest = json.loads(mpath.read_text())
    except FileNotFoundError as exc:
        raise CheckpointError(
            f"{str(path)!r} has no {MANIFEST} (an incomplete or foreign directory)"
        ) from exc
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{mpath}: unreadable manifest: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{mpath}: not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise CheckpointError(f"{mpath}: version {manifest.get('version')!r}, expected {VERSION}")
    manifest["mode"] = parse_save_mode(manifest.get("mode"), f"mode in {mpath}", CheckpointError)
    files = manifest.get("files")
    tables = manifest.get("tables")
    if not isinstance(files, dict) or not isinstance(tables, dict):
        raise CheckpointError(f"{mpath}: files and tables must be mappings")
    check_version_fields(path, manifest)
    for name, meta in files.items():
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise CheckpointError(f"{mpath}: file name {name!r} is not a plain file name")
        fp = path / name
        if not fp.is_file():
            raise CheckpointError(f"{str(path)!r}: missing file {name!r} listed in {MANIFEST}")
        if not isinstance(meta, dict) or fp.stat().st_size != meta.get("bytes"):
            raise CheckpointError(
                f"{str(path)!r}: file {name!r} has {fp.stat().st_size} bytes, manifest says "
                f"{meta.get('bytes') if isinstance(meta, dict) else meta!r}"
            )
        if file_sha256(fp) != meta.get("sha256"):
            raise CheckpointError(f"{str(path)!r}: file {name!r} fails its sha256 checksum")
    return manifest


def saved_parts(path: str | os.PathLike[str]) -> list[Path]:
    """The directories a save at ``path`` is made of: ``[path]`` for one store's save (its
    MANIFEST.json on top), else its ``shard-K-of-N/`` directories in shard order (the shard
    service's save: each shard its own directory and manifest).

    Raises:
        CheckpointError: shard directories of several shard counts, one missing, or one
            numbered past its count.
    """
    path = check_path(path)
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint directory at {str(path)!r}")
    if (path / MANIFEST).exists():
        return [path]
    found = {
        p.name: kn
        for p in path.iterdir()
        if p.is_dir() and (kn := parse_shard_dir_name(p.name)) is not None
    }
    if not found:
        return [path]  # read_manifest names the missing manifest
    counts = sorted({n for _k, n in found.values()})
    if len(counts) > 1:
        raise CheckpointError(
            f"{str(path)!r} mixes saves of {' and '.join(map(str, counts))} shards "
            f"({', '.join(sorted(found))}): one save per directory"
        )
    expected = [shard_dir_name(k, counts[0]) for k in range(counts[0])]
    if set(found) != set(expected):
        raise CheckpointError(
            f"{str(path)!r} is not a whole save of {counts[0]} shard(s): it holds "
            f"{', '.join(sorted(found))}, a save of {counts[0]} holds {', '.join(expected)}"
        )
    return [path / name for name in expected]


def check_one_save(parts: list[Path], manifests: list[dict[str, Any]]) -> None:
    """Raises CheckpointError unless the verified ``parts`` of a save (their ``manifests``)
    are one save: one mode, one set of tables, and for a base or delta one version
    (:class:`~streamrec.embedding_store.errors.VersionConflict` otherwise)."""
    manifest = manifests[0]
    for part, other in zip(parts[1:], manifests[1:], strict=True):
        if other["mode"] != manifest["mode"] or set(other["tables"]) != set(manifest["tables"]):
            raise CheckpointError(
                f"{str(part)!r} holds a {other['mode']} save of tables {sorted(other['tables'])}, "
                f"{str(parts[0])!r} a {manifest['mode']} save of {sorted(manifest['tables'])}: "
                f"not one save"
            )
    if manifest["mode"] not in FULL_MODES:
        check_parts_agree(parts, manifests)


def check_table(store: TablesOnTiers, path: Path, name: str, meta: Any, full: bool) -> TableTier:
    """``store``'s tier of table ``name`` after checking that the save at ``path`` (its
    manifest entry ``meta``) fits it: a table of the store, the same dim, and for a full save
    the same optimizers and row width. Raises CheckpointError naming what differs."""
    if name not in store.tables:
        raise CheckpointError(
            f"{str(path)!r}: table {name!r} is not in this store ({list(store.tables)})"
        )
    tier = store.tier(name)
    if not isinstance(meta, dict):
        raise CheckpointError(f"{str(path)!r}: table {name!r}: {meta!r} is not a mapping")
    if meta.get("dim") != tier.dim:
        raise CheckpointError(
            f"{str(path)!r}: table {name!r} has dim {meta.get('dim')!r} in the checkpoint, "
            f"{tier.dim} in this store"
        )
    if full:
        width = row_codec.row_width(saved_dtype(path, name, meta), tier.payload)
        _check_same_layout(path, name, meta, tier.options.model_dump(mode="json"), width)
    return tier


def saved_dtype(path: Path, name: str, meta: dict[str, Any]) -> str:
    """The row dtype (``TableOptions.dtype``) table ``name`` of the save at ``path`` was saved
    with (its manifest entry ``meta``; saves made before compact rows name none: fp32)."""
    options = meta.get("options")
    dtype = (options if isinstance(options, dict) else {}).get("dtype", "fp32")
    if dtype not in ROW_DTYPES:
        raise CheckpointError(
            f"{str(path)!r}: table {name!r} was saved with dtype {dtype!r}, not one of "
            f"{', '.join(ROW_DTYPES)}"
        )
    return dtype


def check_rows_finite(
    path: Path, name: str, meta: dict[str, Any], tier: TableTier, rows: torch.Tensor
) -> None:
    """Raises CheckpointError when full rows (m, saved width) float32 of table ``name`` hold
    NaN or Inf: the header and the payload decoded from the dtype they were saved in."""
    if not row_codec.finite(rows, saved_dtype(path, name, meta), tier.payload):
        raise CheckpointError(f"{str(path)!r}: table {name!r} holds NaN or Inf")


def rows_for_tier(
    path: Path, name: str, meta: dict[str, Any], tier: TableTier, rows: torch.Tensor
) -> torch.Tensor:
    """Full rows (m, saved width) float32 of table ``name`` as rows of ``tier``'s dtype
    (m, tier.width): as they are, or decoded and encoded to nearest where the save's dtype
    differs (:func:`log_conversion` says so)."""
    src = saved_dtype(path, name, meta)
    if src == tier.options.dtype:
        return rows
    return row_codec.convert(rows, src, tier.options.dtype, tier.payload)


def log_conversion(path: Path, name: str, meta: dict[str, Any], tier: TableTier) -> None:
    """One log line when table ``name`` of the save at ``path`` loads into a table of
    another dtype (its rows converted)."""
    src = saved_dtype(path, name, meta)
    if src != tier.options.dtype:
        log.info(
            "table %r: loading rows saved as %s into a table of dtype %s (converted) from %s",
            name,
            src,
            tier.options.dtype,
            path,
        )


def _check_same_layout(
    path: Path, name: str, meta: dict[str, Any], now: dict[str, Any], width: int
) -> None:
    options = meta.get("options")
    saved = options if isinstance(options, dict) else {}
    for part in ("embed_sgd_param", "embedx_sgd_param"):
        a = (saved.get(part) or {}).get("name")
        b = now[part]["name"]
        if a != b:
            raise CheckpointError(
                f"{str(path)!r}: table {name!r} was saved with {part}.name={a!r}, this store "
                f"uses {b!r} (the optimizer state would not fit)"
            )
    if meta.get("width") != width:
        raise CheckpointError(
            f"{str(path)!r}: table {name!r} rows have width {meta.get('width')!r}, expected {width}"
        )


def check_deleted_count(path: Path, name: str, meta: dict[str, Any], deleted: Any) -> None:
    """Raises CheckpointError unless table ``name``'s deleted keys (d,) read from the save at
    ``path`` are as many as its manifest entry ``meta`` says (saves made before deletes were
    recorded say nothing: not checked)."""
    want = meta.get("deleted")
    if want is not None and want != deleted.shape[0]:
        raise CheckpointError(
            f"{str(path)!r}: table {name!r} has {deleted.shape[0]} deleted keys, the manifest "
            f"says {want!r}"
        )
