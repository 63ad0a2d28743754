"""Confining file paths a peer names to the roots a service was configured with.

A store shard saves and loads checkpoints at the path a request names; the path must lie
under one of the shard's ``--model-root`` directories. ``..`` and symlinks are resolved
before the check, so ``/models/../etc`` and a link under ``/models`` that points out are
refused; so is a relative path (it would name the server's working directory, which the
peer does not know) and every path when no root is configured. The check is made when the
request arrives: a link swapped in by someone who can already write under the root is not
defended against.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from streamrec.errors import BadRequest, PathRefused, quote


def resolve_roots(roots: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The roots as absolute paths with links resolved (what :func:`confine` compares to)."""
    return [Path(r).expanduser().resolve() for r in roots]


def confine(field: str, value: object, roots: Sequence[Path], flag: str = "--model-root") -> Path:
    """``value`` resolved, provided it lies under one of ``roots`` (from :func:`resolve_roots`).

    Args:
        field: the request field that named the path (for the error).
        value: the path as the peer sent it.
        roots: the allowed roots; empty refuses every path.
        flag: the server flag that sets the roots (for the error).

    Raises:
        BadRequest: ``value`` is not a non-empty string without NUL bytes.
        PathRefused: ``value`` is relative or resolves outside every root.
    """
    if not isinstance(value, str) or not value or "\0" in value:
        raise BadRequest(
            f"field {field!r} must be a non-empty path without NUL bytes, got {quote(value)}"
        )
    if not roots:
        raise PathRefused(
            f"field {field!r}: {quote(value)} refused: this server has no {flag}, so it "
            f"reads and writes no files"
        )
    if not os.path.isabs(value):
        raise PathRefused(f"field {field!r}: {quote(value)} must be an absolute path")
    path = Path(value).resolve()
    for root in roots:
        if path == root or path.is_relative_to(root):
            return path
    raise PathRefused(
        f"field {field!r}: {quote(value)} lies outside the allowed roots "
        f"{[str(r) for r in roots]} ({flag}; '..' and symlinks resolved)"
    )
