"""PaddleRec slot text written from Arrow columns, vectorised (no loop over rows).

One sample a line, space-separated ``name:value`` tokens, a multi-valued feature repeating
its name::

    click:1 age:0.31 user_id:17 genres:5 genres:9

Strings are kept as they are (the trainer hashes them); a null or an empty string writes no
token, a null or NaN float ``name:nan`` (a missing dense value, kept by the reader as NaN);
booleans write 1/0, times ISO ``YYYY-MM-DDTHH:MM:SS``. A string holding whitespace would cut
the line's tokens: it is refused naming the column and the value.

Floats are written as the shortest decimal that reads back to the same value, without an
exponent (``0.00000015``, not ``1.5e-7``) where that takes at most :data:`MAX_NUMBER_BYTES`
after the sign (plain decimals any PaddleRec-style reader takes; ours also reads exponents
and up to 128 bytes, ``parse_slot.cpp``): a float64 the
shortest that reads back to the same float64 if it fits, else (inside float32's range) to
the same float32, what the trainer keeps of a dense value; a float32 to the same float32.
Beyond (``1e-30``, ``1e+20``) the shortest form with an exponent.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: The longest plain decimal written, in bytes after its sign: a float is written without
#: an exponent when it fits in this (17 significant digits and a point, or leading zeros).
MAX_NUMBER_BYTES = 19
#: Arrow's shortest form of a float with an exponent: ``-1.5e-7``, ``1e+20``.
_SCIENTIFIC = r"^(?P<sign>-?)(?P<lead>\d)(?:\.(?P<frac>\d+))?e(?P<down>[+-])(?P<exp>\d+)$"


def _positional(text: pa.Array) -> pa.Array:
    """Arrow's shortest texts with an exponent (``1.5e-7``) without it (``0.00000015``)
    where that fits in MAX_NUMBER_BYTES after the sign; the others as they are."""
    parts = pc.extract_regex(text, _SCIENTIFIC)  # null: inf
    sign, lead, frac = (pc.struct_field(parts, k) for k in ("sign", "lead", "frac"))
    exp = pc.cast(pc.struct_field(parts, "exp"), pa.int32())
    small = pc.equal(pc.struct_field(parts, "down"), "-")
    # zeros between the point and the digits (1.5e-7: 6), or after the digits (1e+20: 20)
    zeros = pc.if_else(small, pc.subtract(exp, 1), pc.subtract(exp, pc.utf8_length(frac)))
    pad = pc.binary_repeat("0", pc.max_element_wise(zeros, 0))
    positional = pc.if_else(
        small,
        pc.binary_join_element_wise(sign, "0.", pad, lead, frac, ""),
        pc.binary_join_element_wise(sign, lead, frac, pad, ""),
    )
    # 1.2345678901234567e+15 would need a point among its digits: it keeps its exponent
    size = pc.subtract(pc.utf8_length(positional), pc.utf8_length(sign))
    use = pc.and_(pc.greater_equal(zeros, 0), pc.less_equal(size, MAX_NUMBER_BYTES))
    return pc.if_else(pc.fill_null(use, False), positional, text)


def _shortest(values: pa.Array) -> tuple[pa.Array, pa.Array]:
    """(text, fits) of floats (no NaN): the shortest decimal that reads back to the same
    value of ``values``' type (Arrow's), without an exponent where that fits in
    MAX_NUMBER_BYTES after the sign; ``fits``: (n,) bool, the text is one without."""
    text = pc.cast(values, pa.string())
    sci = pc.fill_null(pc.match_substring(text, "e"), False)
    if pc.any(sci).as_py():  # the rare ones only: below 1e-6, from 1e15 (float32: 1e10)
        text = pc.replace_with_mask(text, sci, _positional(pc.filter(text, sci)))
    plain = pc.invert(pc.match_substring(text, "e"))
    digits = pc.subtract(pc.utf8_length(text), pc.cast(pc.starts_with(text, "-"), pa.int32()))
    fits = pc.fill_null(pc.and_(plain, pc.less_equal(digits, MAX_NUMBER_BYTES)), False)
    return text, fits


def _float_text(values: pa.Array) -> pa.Array:
    """Floats as slot values (NaN: null, no token); see the module's docstring."""
    values = pc.if_else(pc.is_nan(values), None, values)
    text, fits = _shortest(values)
    redo = pc.and_(pc.invert(fits), pc.is_valid(values))
    if values.type == pa.float64() and pc.any(redo).as_py():
        # the trainer keeps float32: its shortest decimal takes at most 9 digits (a float64
        # beyond float32's range keeps its own text, not inf or 0)
        single = pc.cast(pc.filter(values, redo), pa.float32())
        single_text, single_fits = _shortest(single)
        in_range = pc.and_(pc.is_finite(single), pc.not_equal(single, 0))
        better = pc.and_(single_fits, in_range)
        text = pc.replace_with_mask(
            text, redo, pc.if_else(better, single_text, pc.filter(text, redo))
        )
    return text


def _text_tokens(name: str, values: pa.Array) -> pa.Array:
    """``name:value`` for every value (null where no token is written)."""
    t = values.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        text = pc.if_else(pc.equal(values, ""), None, values)
        spaced = np.asarray(pc.fill_null(pc.match_substring_regex(text, r"\s"), False))
        if spaced.any():
            v = values[int(np.flatnonzero(spaced)[0])].as_py()
            raise ValueError(
                f"column {name!r}: the value {v!r} holds whitespace, which would cut a slot "
                "line's tokens; lay this log out with --format parquet"
            )
    elif pa.types.is_boolean(t):
        text = pc.cast(pc.cast(values, pa.int8()), pa.string())
    elif pa.types.is_integer(t):
        text = pc.cast(values, pa.string())
    elif pa.types.is_floating(t):
        text = _float_text(values)
    elif pa.types.is_timestamp(t) or pa.types.is_date(t):
        text = pc.strftime(pc.cast(values, pa.timestamp("s")), format="%Y-%m-%dT%H:%M:%S")
    elif pa.types.is_null(t):
        return pa.nulls(len(values), pa.string())
    else:
        raise ValueError(
            f"column {name!r}: type {t} has no slot text form (numbers, strings, booleans, "
            "times and lists of them); lay this log out with --format parquet"
        )
    return pc.binary_join_element_wise(f"{name}:", text, "")


def slot_text(table: pa.Table) -> bytes:
    """Rows -> PaddleRec slot lines: ``name:value`` tokens, a list repeating its name."""
    pieces = []
    for name in table.column_names:
        if any(c.isspace() for c in name) or ":" in name:
            raise ValueError(f"column {name!r}: a slot feature name holds no whitespace or ':'")
        col = table.column(name).combine_chunks()
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            tokens = _text_tokens(name, col.values)
            tokens = pc.if_else(pc.is_null(tokens), "", tokens)
            listed = type(col).from_arrays(col.offsets, tokens)
            joined = pc.binary_join(listed, " ")
            # empty lists (and tokens dropped inside them) leave no stray space
            joined = pc.utf8_trim_whitespace(pc.replace_substring_regex(joined, r"  +", " "))
            pieces.append(pc.if_else(pc.equal(joined, ""), None, joined))
        elif pa.types.is_floating(col.type):
            # a missing float (null, NaN) is a missing dense value: ``name:nan``, which the
            # reader keeps as NaN; no token would make the line lack a dense feature
            pieces.append(pc.fill_null(_text_tokens(name, col), f"{name}:nan"))
        else:
            pieces.append(_text_tokens(name, col))
    lines = pc.binary_join_element_wise(*pieces, " ", null_handling="skip")
    ended = pc.cast(pc.binary_join_element_wise(lines, "", "\n"), pa.large_string())
    # the lines are consecutive in the array's data buffer: its bytes are the text
    offsets = np.frombuffer(ended.buffers()[1], dtype=np.int64)
    data = ended.buffers()[2]
    if data is None:
        return b""
    start, end = int(offsets[ended.offset]), int(offsets[ended.offset + len(ended)])
    return data.slice(start, end - start).to_pybytes()
