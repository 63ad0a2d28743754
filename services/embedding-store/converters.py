"""Converters: where base/delta rows go for online serving (PaddleRec's converter/deconverter).

A :class:`Converter` receives the rows a base or delta save selects, as keys and weights, and
gives them back (``read_rows``, the deconverter). :class:`FileConverter` writes the project's
file format; ``redis_converter.RedisConverter`` writes to Redis.

File format (one pair per table and tag, numpy ``.npy`` v1, read with
``allow_pickle=False``)::

    <root>/<table>.<tag>.keys.npy     (n,) int64      feature ids (uint64 bit pattern kept)
    <root>/<table>.<tag>.values.npy   (n, dim) float32 weights: column 0 embed, 1.. embedx
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np
from streamrec.embedding_store.errors import CheckpointError, InvalidInput
from streamrec.save_modes import SaveMode

_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


class Converter(ABC):
    """Writes and reads back the rows of base/delta saves."""

    @abstractmethod
    def write_rows(
        self, table: str, keys: np.ndarray, values: np.ndarray, mode: SaveMode, tag: str
    ) -> None:
        """Stores rows.

        Args:
            table: table name.
            keys: (n,) int64.
            values: (n, dim) float32 weights.
            mode: base or delta (a base replaces what the table had under earlier tags;
                a delta adds to it).
            tag: names this save (e.g. "base", "delta_3").
        """

    @abstractmethod
    def read_rows(self, table: str, tag: str) -> tuple[np.ndarray, np.ndarray]:
        """The rows written under ``tag``: keys (n,) int64 and values (n, dim) float32."""

    def describe(self) -> str:
        """One line for the manifest."""
        return type(self).__name__


def check_rows(table: str, keys: np.ndarray, values: np.ndarray) -> None:
    """Raises InvalidInput unless keys (n,) int64 and values (n, dim) float32 match."""
    if keys.dtype != np.int64 or keys.ndim != 1:
        raise InvalidInput(
            f"table {table!r}: keys must be (n,) int64, got {keys.dtype} {keys.shape}"
        )
    if values.dtype != np.float32 or values.ndim != 2 or values.shape[0] != keys.shape[0]:
        raise InvalidInput(
            f"table {table!r}: values must be ({keys.shape[0]}, dim) float32, "
            f"got {values.dtype} {values.shape}"
        )


def save_npy(path: Path, array: np.ndarray) -> None:
    """Writes an .npy file and fsyncs it."""
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(array), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def load_npy(path: Path) -> np.ndarray:
    """Reads an .npy file written by :func:`save_npy`; never unpickles."""
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError as exc:
        raise CheckpointError(f"missing file {path}") from exc
    except (ValueError, OSError, EOFError) as exc:
        raise CheckpointError(f"{path}: not a readable .npy file: {exc}") from exc


class FileConverter(Converter):
    """The project's file format under ``root`` (see the module doc)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def paths(self, table: str, tag: str) -> tuple[Path, Path]:
        """The (keys, values) .npy files of ``table``'s rows saved as ``tag``."""
        if not _TAG.match(tag):
            raise InvalidInput(f"tag must match {_TAG.pattern}, got {tag!r}")
        return self.root / f"{table}.{tag}.keys.npy", self.root / f"{table}.{tag}.values.npy"

    def write_rows(
        self, table: str, keys: np.ndarray, values: np.ndarray, mode: SaveMode, tag: str
    ) -> None:
        check_rows(table, keys, values)
        kp, vp = self.paths(table, tag)
        self.root.mkdir(parents=True, exist_ok=True)
        save_npy(kp, keys)
        save_npy(vp, values)

    def read_rows(self, table: str, tag: str) -> tuple[np.ndarray, np.ndarray]:
        kp, vp = self.paths(table, tag)
        keys, values = load_npy(kp), load_npy(vp)
        try:
            check_rows(table, keys, values)
        except InvalidInput as exc:
            raise CheckpointError(f"{self.root}: {exc}") from exc
        return keys, values

    def describe(self) -> str:
        return f"FileConverter({self.root})"
