"""Directories a save creates on its way, and their removal when the save fails (a failed
save leaves no empty day or shard directory behind), and the free bytes a full disk's error
names: the store's saves and the trainer's model writes both."""

from __future__ import annotations

import os
from pathlib import Path


def make_parents(path: Path) -> list[Path]:
    """Creates the missing parents of ``path``; returns those created (deepest last), so a
    failed save can remove them again (:func:`remove_created`)."""
    missing = [p for p in reversed(path.parents) if not p.exists()]
    created: list[Path] = []
    try:
        for p in missing:
            try:
                p.mkdir()
            except FileExistsError:
                if not p.is_dir():
                    raise
                continue
            created.append(p)
    except BaseException:
        remove_created(created)
        raise
    return created


def remove_created(created: list[Path]) -> None:
    """Removes directories :func:`make_parents` created, deepest first, if still empty."""
    for p in reversed(created):
        try:
            p.rmdir()
        except OSError:
            return  # not empty (another save put something there) or gone: leave the rest


def free_bytes(path: Path) -> int | None:
    """Bytes free to this process on the filesystem of ``path`` (its nearest existing
    ancestor: os.statvfs), or None when that cannot be told."""
    for p in (path, *path.parents):
        try:
            st = os.statvfs(p)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return None
