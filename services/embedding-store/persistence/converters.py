"""Converters: where base/delta rows go for online serving (PaddleRec's converter/deconverter).

A :class:`Converter` receives the rows a base or delta save selects, as keys and weights, and
gives them back (``read_rows``, the deconverter). :class:`FileConverter` writes the project's
file format; ``redis_converter.RedisConverter`` writes to Redis.

File format (one pair per table and tag, numpy ``.npy`` v1, read with
``allow_pickle=False``)::

    <root>/<table>.<tag>.keys.npy     (n,) int64      feature ids (uint64 bit pattern kept)
    <root>/<table>.<tag>.values.npy   (n, dim) float32 weights: column 0 embed, 1.. embedx
    <root>/<table>.<tag>.deleted.npy  (d,) int64      a delta's: keys deleted since the
                                                      previous base or delta (deletes.py)

A delta's rows are set and its deleted keys removed; the two sets are disjoint (a key
deleted and made again since is written, not deleted).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np
from streamrec.embedding_store.disk import pread_into
from streamrec.embedding_store.errors import CheckpointError, InvalidInput
from streamrec.embedding_store.persistence.versions import SaveVersion
from streamrec.save_modes import SaveMode

_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


class Converter(ABC):
    """Writes and reads back the rows of base/delta saves."""

    @abstractmethod
    def write_rows(
        self,
        table: str,
        keys: np.ndarray,
        values: np.ndarray,
        mode: SaveMode,
        tag: str,
        deleted: np.ndarray | None = None,
        version: SaveVersion | None = None,
    ) -> None:
        """Stores rows.

        Args:
            table: table name.
            keys: (n,) int64.
            values: (n, dim) float32 weights.
            mode: base or delta (a base replaces what the table had under earlier tags;
                a delta adds to it).
            tag: names this save (e.g. "base", "delta_3").
            deleted: a delta's: (d,) int64 keys deleted since the previous base or delta,
                none of them in ``keys`` (None: none); a base carries none.
            version: the save's version (None: unversioned, nothing checked).
        """

    @abstractmethod
    def read_rows(self, table: str, tag: str) -> tuple[np.ndarray, np.ndarray]:
        """The rows written under ``tag``: keys (n,) int64 and values (n, dim) float32."""

    def read_deleted(self, table: str, tag: str) -> np.ndarray:
        """The keys (d,) int64 a delta written under ``tag`` deleted; none by default (a
        converter that keeps only the current state has applied them already)."""
        return np.zeros(0, dtype=np.int64)

    def describe(self) -> str:
        """One line for the manifest."""
        return type(self).__name__


def check_deleted(
    table: str, mode: SaveMode, deleted: np.ndarray | None, keys: np.ndarray
) -> np.ndarray:
    """``deleted`` as (d,) int64 (None: none). Raises InvalidInput unless it is (d,) int64,
    empty for a base, and disjoint from the rows' ``keys`` (n,) int64."""
    if deleted is None:
        return np.zeros(0, dtype=np.int64)
    if not isinstance(deleted, np.ndarray) or deleted.dtype != np.int64 or deleted.ndim != 1:
        got = f"{deleted.dtype} {deleted.shape}" if isinstance(deleted, np.ndarray) else deleted
        raise InvalidInput(f"table {table!r}: deleted must be (d,) int64 keys, got {got}")
    if deleted.size and mode != SaveMode.DELTA:
        raise InvalidInput(
            f"table {table!r}: a {mode} save carries no deleted keys (got {deleted.size}): a "
            f"base replaces what serving holds, only a delta deletes"
        )
    if deleted.size and np.isin(deleted, keys).any():
        raise InvalidInput(f"table {table!r}: keys both written and deleted by one delta")
    return deleted


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


def load_deleted(path: Path) -> np.ndarray:
    """Deleted keys (d,) int64 saved by :func:`save_npy` at ``path``; none when there is no
    such file (saves made before deletes were recorded)."""
    if not path.exists():
        return np.zeros(0, dtype=np.int64)
    keys = load_npy(path)
    if keys.dtype != np.int64 or keys.ndim != 1:
        raise CheckpointError(
            f"{path}: deleted keys must be (d,) int64, got {keys.dtype} {keys.shape}"
        )
    return keys


class NpyWriter:
    """An .npy file (as :func:`save_npy` writes it) written a block of rows at a time, its
    sha256 taken as it is written (no second read); ``shape`` is known before the rows.

    Args:
        path: the file (created).
        dtype: the array's.
        shape: the array's; the rows written must add up to ``shape[0]``.
    """

    def __init__(self, path: Path, dtype: Any, shape: tuple[int, ...]) -> None:
        self.path, self.shape, self.rows, self.bytes = path, shape, 0, 0
        self._hash = hashlib.sha256()
        self._file = open(path, "wb")  # noqa: SIM115 (closed by close)
        header = io.BytesIO()
        descr = np.lib.format.dtype_to_descr(np.dtype(dtype))
        np.lib.format.write_array_header_1_0(
            header, {"descr": descr, "fortran_order": False, "shape": shape}
        )
        self._write(header.getvalue())

    def _write(self, data: Any) -> None:
        self._file.write(data)
        self._hash.update(data)
        self.bytes += len(data)

    def write(self, block: np.ndarray) -> None:
        """Appends rows (b, ...) of the array's dtype and row shape."""
        if block.shape[1:] != self.shape[1:] or self.rows + block.shape[0] > self.shape[0]:
            raise InvalidInput(
                f"{self.path}: rows {block.shape} do not fit an array {self.shape} "
                f"holding {self.rows} rows"
            )
        if block.size:
            self._write(np.ascontiguousarray(block).data.cast("B"))
        self.rows += block.shape[0]

    def close(self) -> str:
        """Flushes, fsyncs and closes the file; its sha256 hex digest. Raises unless every
        row was written."""
        try:
            if self.rows != self.shape[0]:
                raise CheckpointError(
                    f"{self.path}: {self.rows} rows written of {self.shape[0]} (the table "
                    f"changed during the save?)"
                )
            self._file.flush()
            os.fsync(self._file.fileno())
        finally:
            self._file.close()
        return self._hash.hexdigest()


class NpyReader:
    """An .npy file read a block of rows at a time by ``pread`` (nothing mapped, so no file
    page stays resident in this process); never unpickles. ``dtype``, ``shape``, ``ndim``,
    ``nbytes`` as an array's; ``reader[a:b]`` reads rows [a, b) into a new array."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)
                read_header = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, fortran, dtype = read_header(f)
                self._offset = f.tell()
        except FileNotFoundError as exc:
            raise CheckpointError(f"missing file {path}") from exc
        except (ValueError, OSError, EOFError) as exc:
            raise CheckpointError(f"{path}: not a readable .npy file: {exc}") from exc
        if fortran or dtype.hasobject:
            raise CheckpointError(f"{path}: a Fortran-ordered or object array is not read")
        self.shape, self.dtype, self.ndim = tuple(shape), dtype, len(shape)
        self._row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        self.nbytes = (shape[0] if shape else 1) * self._row_bytes
        if os.path.getsize(path) < self._offset + self.nbytes:
            raise CheckpointError(f"{path}: shorter than its header's {self.shape} {dtype}")

    def __getitem__(self, rows: slice) -> np.ndarray:
        a, b, _ = rows.indices(self.shape[0])
        out = np.empty((max(b - a, 0), *self.shape[1:]), dtype=self.dtype)
        if out.size == 0:
            return out
        view = out.data.cast("B")
        fd = os.open(self.path, os.O_RDONLY)
        try:
            if pread_into(fd, view, self._offset + a * self._row_bytes) < len(view):
                raise CheckpointError(f"{self.path}: ends before row {b}")
        finally:
            os.close(fd)
        return out


class FileConverter(Converter):
    """The project's file format under ``root`` (see the module doc)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def paths(self, table: str, tag: str) -> tuple[Path, Path]:
        """The (keys, values) .npy files of ``table``'s rows saved as ``tag``."""
        if not _TAG.match(tag):
            raise InvalidInput(f"tag must match {_TAG.pattern}, got {tag!r}")
        return self.root / f"{table}.{tag}.keys.npy", self.root / f"{table}.{tag}.values.npy"

    def deleted_path(self, table: str, tag: str) -> Path:
        """The .npy file of the keys a delta of ``table`` saved as ``tag`` deleted."""
        return self.paths(table, tag)[0].with_name(f"{table}.{tag}.deleted.npy")

    def write_rows(
        self,
        table: str,
        keys: np.ndarray,
        values: np.ndarray,
        mode: SaveMode,
        tag: str,
        deleted: np.ndarray | None = None,
        version: SaveVersion | None = None,
    ) -> None:
        check_rows(table, keys, values)
        deleted = check_deleted(table, mode, deleted, keys)
        kp, vp = self.paths(table, tag)
        self.root.mkdir(parents=True, exist_ok=True)
        save_npy(kp, keys)
        save_npy(vp, values)
        if mode == SaveMode.DELTA:  # the version is the manifest's (save_load.py)
            save_npy(self.deleted_path(table, tag), deleted)

    def read_deleted(self, table: str, tag: str) -> np.ndarray:
        """The keys a delta deleted; none for a save without the file (a base, or a delta
        saved before deletes were carried)."""
        return load_deleted(self.deleted_path(table, tag))

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
