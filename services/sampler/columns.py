"""Table columns: what users hand to ``reload`` turned into plain arrays, and back.

A negative table is a set of named columns with the same number of rows ``n``. Each column
is one of three kinds, all held as plain numpy arrays so they can cross the wire as raw
buffers (never pickled)::

    dense    values (n,) numeric or bool             weight [0.5, 2.0, 1.0]
    ragged   values (nnz,) numeric or bool           tags [[7], [], [8, 9]]:
             offsets (n + 1,) int64                    values [7, 8, 9], offsets [0, 1, 1, 3]
    str      values (nbytes,) uint8 UTF-8 bytes,     skey ["", "ab"]:
             offsets (n + 1,) int64                    values b"ab", offsets [0, 0, 2]

Accepted user input (:func:`to_columns`): a dict of column name -> 1-D ``torch.Tensor`` /
``np.ndarray`` / :class:`~streamrec.ragged.RaggedTensor` / list (of numbers or of str); a
list of such dicts (concatenated); or a path to a Parquet file (read here, in the client
process, with pyarrow: ints/floats -> dense, lists -> ragged, strings -> str).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from streamrec import wire
from streamrec.ragged import RaggedTensor
from streamrec.sampler.errors import BadTable

KINDS = ("dense", "ragged", "str")


@dataclass(frozen=True)
class Column:
    """One column of ``n`` rows.

    Args:
        kind: ``"dense"``, ``"ragged"`` or ``"str"``.
        values: dense: (n,); ragged: (nnz,); str: (nbytes,) uint8 UTF-8.
        offsets: (n + 1,) int64 for ragged and str, ``None`` for dense.
    """

    kind: str
    values: np.ndarray
    offsets: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        return len(self.values) if self.offsets is None else len(self.offsets) - 1

    def take(self, rows: np.ndarray) -> Column:
        """The rows at ``rows`` ((k,) int64; ``-1`` gives a zero / empty row), vectorised."""
        rows = np.asarray(rows, dtype=np.int64)
        missing = rows < 0
        safe = np.where(missing, 0, rows) if self.num_rows else np.zeros_like(rows)
        if self.offsets is None:
            if not self.num_rows:
                return Column(self.kind, np.zeros(len(rows), self.values.dtype))
            out = self.values.take(safe)
            out[missing] = 0
            return Column(self.kind, out)
        starts = self.offsets.take(safe) if self.num_rows else np.zeros_like(rows)
        lens = self.offsets.take(safe + 1) - starts if self.num_rows else np.zeros_like(rows)
        lens[missing] = 0
        values, offsets = ragged_gather(self.values, starts, lens)
        return Column(self.kind, values, offsets)

    def to_user(self) -> torch.Tensor | RaggedTensor:
        """dense -> (n,) tensor; ragged -> RaggedTensor; str -> RaggedTensor of uint8 UTF-8."""
        if self.offsets is None:
            return torch.from_numpy(np.array(self.values))
        return RaggedTensor(
            torch.from_numpy(np.array(self.values)), torch.from_numpy(np.array(self.offsets))
        )


def ragged_gather(
    values: np.ndarray, starts: np.ndarray, lens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Concatenates ``values[starts[i] : starts[i] + lens[i]]`` for every i, vectorised.

    Args:
        values: (nnz,) any dtype.
        starts: (k,) int64 and lens: (k,) int64, the slices to take.

    Returns:
        ``(out_values (sum(lens),), out_offsets (k + 1,) int64)``.
    """
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    # Position p of the output comes from values[starts[row] + p - offsets[row]].
    shift = np.repeat(starts - offsets[:-1], lens)
    index = np.arange(total, dtype=np.int64)
    index += shift
    return values.take(index), offsets


def ragged_arange(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """``concat(arange(starts[i], starts[i] + lens[i]))``: (sum(lens),) int64."""
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    index = np.arange(int(offsets[-1]), dtype=np.int64)
    index += np.repeat(starts - offsets[:-1], lens)
    return index


# ---------------------------------------------------------------------------------------------
# user input -> columns


def to_columns(table: Any) -> dict[str, Column]:
    """Converts what ``reload`` accepts into columns (see the module docstring).

    Raises:
        BadTable: naming the column and what is wrong with it.
    """
    if isinstance(table, str | os.PathLike):
        return read_parquet(table)
    if isinstance(table, Mapping):
        return _dict_to_columns(table)
    if isinstance(table, Sequence) and not isinstance(table, bytes):
        if not table:
            raise BadTable("table: empty list of dicts")
        parts = []
        for i, part in enumerate(table):
            if not isinstance(part, Mapping):
                raise BadTable(f"table[{i}]: expected a dict of columns, got {type(part).__name__}")
            parts.append(_dict_to_columns(part, where=f"table[{i}]"))
        return concat_columns(parts)
    raise BadTable(
        f"table: expected a dict of columns, a list of dicts or a Parquet path, "
        f"got {type(table).__name__}"
    )


def _dict_to_columns(table: Mapping[Any, Any], where: str = "table") -> dict[str, Column]:
    if not table:
        raise BadTable(f"{where}: no columns")
    out = {}
    for name, value in table.items():
        if not isinstance(name, str):
            raise BadTable(f"{where}: column names must be str, got {name!r}")
        out[name] = _to_column(name, value)
    return out


def _to_column(name: str, value: Any) -> Column:
    if isinstance(value, RaggedTensor):
        values = _numeric(name, _tensor_to_numpy(name, value.values()))
        return Column("ragged", values, value.offsets().numpy().astype(np.int64))
    if isinstance(value, torch.Tensor):
        value = _tensor_to_numpy(name, value)
    if isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
        return _strings(name, value)
    arr = np.asarray(value)
    if arr.dtype.kind in "USO":
        if arr.dtype.kind == "O" and not all(isinstance(v, str | bytes) for v in arr.ravel()):
            raise BadTable(f"column {name!r}: object values must all be str")
        return _strings(name, arr.ravel().tolist())
    if arr.ndim != 1:
        raise BadTable(f"column {name!r}: dense columns must be 1-D, got shape {arr.shape}")
    return Column("dense", _numeric(name, arr))


def _tensor_to_numpy(name: str, tensor: torch.Tensor) -> np.ndarray:
    try:
        return tensor.detach().cpu().numpy()
    except TypeError as exc:  # e.g. bfloat16 has no numpy dtype
        raise BadTable(f"column {name!r}: dtype {tensor.dtype} is not supported ({exc})") from exc


def _numeric(name: str, arr: np.ndarray) -> np.ndarray:
    arr = np.asarray(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    if arr.dtype.str not in wire.ALLOWED_DTYPES:
        raise BadTable(
            f"column {name!r}: dtype {arr.dtype} is not supported "
            f"(use an integer, float or bool dtype)"
        )
    return np.ascontiguousarray(arr)


def _strings(name: str, values: Sequence[Any]) -> Column:
    import pyarrow as pa

    try:
        arr = pa.array(values, type=pa.large_string())
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise BadTable(f"column {name!r}: not a list of str: {exc}") from exc
    return _arrow_to_column(name, arr)


def read_parquet(path: str | os.PathLike[str]) -> dict[str, Column]:
    """Reads a Parquet file into columns (in the calling process)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise BadTable(f"table path {os.fspath(path)!r}: cannot read as Parquet: {exc}") from exc
    if table.num_columns == 0:
        raise BadTable(f"table path {os.fspath(path)!r}: no columns")
    return {
        name: _arrow_to_column(name, table.column(name).combine_chunks())
        for name in table.column_names
    }


def _arrow_to_column(name: str, arr: Any) -> Column:
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        raise BadTable(f"column {name!r}: {arr.null_count} null values (nulls are not allowed)")
    t = arr.type
    if (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    ):
        arr = arr.cast(pa.large_binary())
        _, offs, data = arr.buffers()
        offsets = np.frombuffer(offs, np.int64)[arr.offset : arr.offset + len(arr) + 1]
        raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
        values = raw[offsets[0] : offsets[-1]].copy()
        return Column("str", values, (offsets - offsets[0]).astype(np.int64))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        if pa.types.is_list(t):
            arr = arr.cast(pa.large_list(t.value_type))
        offsets = arr.offsets.to_numpy().astype(np.int64)
        flat = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        if flat.null_count:
            raise BadTable(f"column {name!r}: null list elements are not allowed")
        if not (
            pa.types.is_integer(flat.type)
            or pa.types.is_floating(flat.type)
            or pa.types.is_boolean(flat.type)
        ):
            raise BadTable(f"column {name!r}: lists of {flat.type} are not supported")
        values = _numeric(name, flat.to_numpy(zero_copy_only=False))
        return Column("ragged", values, offsets - offsets[0])
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return Column("dense", _numeric(name, arr.to_numpy(zero_copy_only=False)))
    raise BadTable(f"column {name!r}: Parquet type {t} is not supported")


def concat_columns(parts: list[dict[str, Column]]) -> dict[str, Column]:
    """Concatenates row-wise the columns of several dicts with the same names and kinds."""
    names = list(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        if set(part) != set(names):
            raise BadTable(
                f"table[{i}]: columns {sorted(part)} differ from table[0]'s {sorted(names)}"
            )
    out = {}
    for name in names:
        cols = [p[name] for p in parts]
        kinds = {c.kind for c in cols}
        if len(kinds) != 1:
            raise BadTable(f"column {name!r}: mixes kinds {sorted(kinds)} across the list")
        values = np.concatenate([c.values for c in cols])
        if cols[0].offsets is None:
            out[name] = Column(cols[0].kind, values)
            continue
        # one kind: every column has offsets, as cols[0] has
        lens = np.concatenate([np.diff(c.offsets) for c in cols if c.offsets is not None])
        offsets = np.zeros(len(lens) + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        out[name] = Column(cols[0].kind, values, offsets)
    return out


# ---------------------------------------------------------------------------------------------
# columns <-> wire


def encode_columns(columns: Mapping[str, Column]) -> tuple[list[list[str]], dict[str, np.ndarray]]:
    """Columns -> (``[[name, kind], ...]`` for the header meta, arrays ``"<i>.v"``/``"<i>.o"``)."""
    spec = []
    arrays: dict[str, np.ndarray] = {}
    for i, (name, col) in enumerate(columns.items()):
        spec.append([name, col.kind])
        arrays[f"{i}.v"] = col.values
        if col.offsets is not None:
            arrays[f"{i}.o"] = col.offsets
    return spec, arrays


def decode_columns(spec: Any, arrays: Mapping[str, np.ndarray]) -> dict[str, Column]:
    """The inverse of :func:`encode_columns` on untrusted input; checks kinds and offsets."""
    if not isinstance(spec, list) or not spec:
        raise BadTable(
            f"meta field 'columns' must be a non-empty list of [name, kind], got {spec!r:.80}"
        )
    out: dict[str, Column] = {}
    for i, item in enumerate(spec):
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and item[1] in KINDS
        ):
            raise BadTable(
                f"meta field 'columns[{i}]' must be [name, kind] with kind in "
                f"{KINDS}, got {item!r:.80}"
            )
        name, kind = item
        if name in out:
            raise BadTable(f"column {name!r} appears twice")
        values = arrays.get(f"{i}.v")
        if values is None or values.ndim != 1:
            raise BadTable(f"column {name!r}: missing or non-1-D values array '{i}.v'")
        offsets = arrays.get(f"{i}.o")
        if kind == "dense":
            if offsets is not None:
                raise BadTable(f"column {name!r}: dense column has an offsets array")
            out[name] = Column(kind, values)
            continue
        if kind == "str" and values.dtype != np.uint8:
            raise BadTable(f"column {name!r}: str values must be uint8, got {values.dtype}")
        if offsets is None or offsets.dtype != np.int64 or offsets.ndim != 1 or len(offsets) < 1:
            raise BadTable(f"column {name!r}: {kind} column needs (n + 1,) int64 offsets '{i}.o'")
        # compared, not subtracted: np.diff wraps int64 (0, 2**62, 2**63-1, -2**63, ... would
        # pass as rising)
        rising = not bool(np.any(offsets[1:] < offsets[:-1]))
        if offsets[0] != 0 or offsets[-1] != len(values) or not rising:
            raise BadTable(
                f"column {name!r}: offsets must rise from 0 to len(values)="
                f"{len(values)}, got {offsets[0]}..{offsets[-1]}"
            )
        out[name] = Column(kind, values, offsets)
    extra = (
        set(arrays) - {f"{i}.v" for i in range(len(spec))} - {f"{i}.o" for i in range(len(spec))}
    )
    if extra:
        raise BadTable(f"arrays {sorted(extra)} do not belong to any column")
    return out


def single_values(col: Column, name: str, integer: bool) -> np.ndarray:
    """A tag column as (n,) values: dense, or ragged with exactly one value per row."""
    if col.kind == "str":
        raise BadTable(f"column {name!r}: must be numeric, got strings")
    if col.offsets is not None:
        lens = np.diff(col.offsets)
        bad = np.flatnonzero(lens != 1)
        if len(bad):
            raise BadTable(
                f"column {name!r}: must hold exactly one value per row; row "
                f"{int(bad[0])} has {int(lens[bad[0]])}"
            )
    values = col.values
    if integer:
        if values.dtype.kind not in "iu":
            raise BadTable(f"column {name!r}: ids must be integers, got dtype {values.dtype}")
        return values.astype(np.int64)  # uint64 feasigns keep their bit pattern
    if values.dtype.kind not in "iuf":
        raise BadTable(f"column {name!r}: weights must be numeric, got dtype {values.dtype}")
    return values
