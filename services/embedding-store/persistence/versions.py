"""Versions of a store's serving models: each base and delta save numbered, deltas in order.

A store counts the base and delta saves it writes: ``model_version`` is the number of the last
one it saved or loaded (0: none yet). A save numbers itself one more; a delta also names the
version it ``applies_on``, the store's before the save (the previous base or delta)::

    base     model_version 1   applies_on None      replaces what serving holds
    delta    model_version 2   applies_on 1
    delta    model_version 3   applies_on 2
    base     model_version 4   applies_on None

Both fields are in every manifest (checkpoint and batch saves record the store's
``model_version`` and number nothing), so the counter survives a restart from a checkpoint.
Loading a base sets the store's version to the base's; loading a delta whose ``applies_on``
is not the store's version is refused (:class:`~streamrec.embedding_store.errors.
VersionConflict`, naming both): a delta applied twice, skipped or out of order would serve
rows that the store that saved it does not hold. The serving Redis keeps the version of
each partition beside its rows and refuses a delta the same way
(:mod:`~streamrec.embedding_store.persistence.redis_converter`).

Each store counts its own: a shard service's shards each number their own saves (each
``shard-K-of-N/`` manifest its own fields); the parts of one save agree unless a shard was
restarted from an older checkpoint, and a delta whose parts disagree is refused as a whole
when loaded into one store. Manifests written before versions existed carry neither field:
they load unchecked and leave the store's version as it is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrec.embedding_store.errors import CheckpointError, VersionConflict
from streamrec.save_modes import FULL_MODES, SaveMode

#: manifest field: the save's version (base/delta) or the store's (checkpoint/batch)
MODEL_VERSION = "model_version"
#: manifest field: the version a delta applies on (None for every other mode)
APPLIES_ON = "applies_on"


@dataclass(frozen=True)
class SaveVersion:
    """The version of one base or delta save.

    Args:
        number: the save's ``model_version`` (>= 1).
        applies_on: a delta's: the version it applies on; None for a base.
    """

    number: int
    applies_on: int | None = None

    @classmethod
    def next(cls, held: int, mode: SaveMode) -> SaveVersion:
        """The version of a ``mode`` save (base or delta) by a store holding ``held``."""
        return cls(held + 1, held if mode == SaveMode.DELTA else None)

    @classmethod
    def of_manifest(cls, manifest: dict[str, Any]) -> SaveVersion | None:
        """The version of a base or delta save's manifest; None for a checkpoint or batch
        save, or a manifest written before versions."""
        if manifest.get("mode") in FULL_MODES or manifest.get(MODEL_VERSION) is None:
            return None
        return cls(int(manifest[MODEL_VERSION]), _int_or_none(manifest.get(APPLIES_ON)))

    def fields(self) -> dict[str, int | None]:
        """The manifest's fields."""
        return {MODEL_VERSION: self.number, APPLIES_ON: self.applies_on}


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def check_version_fields(path: Path, manifest: dict[str, Any]) -> None:
    """Raises CheckpointError unless ``manifest``'s version fields (absent in saves made
    before versions) are well formed: ``model_version`` an int >= 0, ``applies_on`` an int
    below it for a delta and None otherwise."""
    if MODEL_VERSION not in manifest:
        return
    number, on = manifest.get(MODEL_VERSION), manifest.get(APPLIES_ON)
    if manifest.get("mode") != SaveMode.DELTA:
        ok = _is_count(number) and on is None
    else:  # a delta applies on an earlier version
        ok = isinstance(number, int) and isinstance(on, int) and _is_count(on) and on < number
    if not ok:
        raise CheckpointError(
            f"{str(path)!r}: a {manifest.get('mode')} save with {MODEL_VERSION}={number!r} and "
            f"{APPLIES_ON}={on!r} (a delta applies on an earlier version, nothing else does)"
        )


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_parts_agree(parts: list[Path], manifests: list[dict[str, Any]]) -> None:
    """Raises VersionConflict unless the parts of one base or delta save carry one version
    (their shards saved in step; a shard restarted from an older checkpoint does not)."""
    first = SaveVersion.of_manifest(manifests[0])
    for part, manifest in zip(parts[1:], manifests[1:], strict=True):
        other = SaveVersion.of_manifest(manifest)
        if other != first:
            raise VersionConflict(
                f"{str(part)!r} is {_describe(other)}, {str(parts[0])!r} {_describe(first)}: "
                f"the shards of this {manifests[0]['mode']} save are not in step (one was "
                f"restarted from an older checkpoint?); load a later base"
            )


def _describe(v: SaveVersion | None) -> str:
    if v is None:
        return "unversioned"
    return f"{MODEL_VERSION}={v.number} {APPLIES_ON}={v.applies_on}"


def check_applies(path: str | os.PathLike[str], version: SaveVersion | None, held: int) -> None:
    """Raises VersionConflict unless the delta ``version`` applies on a store holding
    version ``held`` (a base, or an unversioned save, always does)."""
    if version is None or version.applies_on is None or version.applies_on == held:
        return
    why = "already applied" if version.number <= held else "out of order (a save is missing)"
    raise VersionConflict(
        f"{str(path)!r}: delta {MODEL_VERSION}={version.number} has {APPLIES_ON}="
        f"{version.applies_on}, this store holds {MODEL_VERSION}={held}: {why}; load the base "
        f"and then every delta after it, in order"
    )


def held_version(manifests: list[dict[str, Any]]) -> int | None:
    """The ``model_version`` a store holds once these parts of one save are loaded: a
    checkpoint's (the latest of its parts: shards restarted from an older checkpoint lag),
    a base's or a delta's; None for saves made before versions."""
    seen = [int(m[MODEL_VERSION]) for m in manifests if m.get(MODEL_VERSION) is not None]
    return max(seen) if seen else None
