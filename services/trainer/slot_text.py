"""PaddleRec slot text written from Arrow columns, vectorised (no loop over rows).

One sample a line, space-separated ``name:value`` tokens, a multi-valued feature repeating
its name::

    click:1 age:0.31 user_id:17 genres:5 genres:9

Strings are kept as they are (the trainer hashes them); a null or an empty string writes no
token; booleans write 1/0, times ISO ``YYYY-MM-DDTHH:MM:SS``. A string holding whitespace
would cut the line's tokens: it is refused naming the column and the value.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


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
        text = pc.cast(pc.if_else(pc.is_nan(values), None, values), pa.string())
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
