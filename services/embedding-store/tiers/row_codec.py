"""A table's full rows decoded to float32 and encoded back (``TableOptions.dtype``).

Full rows are (m, width) float32 words in the layout of ``csrc/shared/row_layout.h``: the
four header words are float32; the payload after them (the dim weights, then the optimizer
state) is float32 words (``fp32``) or 16-bit values (``fp16``, ``bf16``) two per word, payload
value e in the low half of word ``EMBED_W + e // 2`` when e is even::

    fp32  [show, click, unseen, flags | w0      | w1      | ... | state ...         ]
    fp16  [show, click, unseen, flags | w1 : w0 | w3 : w2 | ... | ... : state0 | pad ]

Decoding is exact; encoding here rounds to nearest, ties to even, as the C++ core does for
new rows and imported weights (fp16 saturates at +-65504, as there). Pushes round
stochastically, in C++ only.
"""

from __future__ import annotations

import streamrec.embedding_store._C as _C
import torch
from streamrec.store_schema import ROW_DTYPES

#: the torch dtype of a compact row's payload values
_HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
#: the largest finite fp16: encoding saturates there (no Inf)
FP16_MAX = 65504.0


def row_width(dtype: str, payload: int) -> int:
    """Words of a row whose payload is ``payload`` values of ``dtype``."""
    if dtype == "fp32":
        return _C.EMBED_W + payload
    if dtype in _HALF:
        return _C.EMBED_W + (payload + 1) // 2
    raise ValueError(f"unknown row dtype {dtype!r}; expected one of {', '.join(ROW_DTYPES)}")


def decode(rows: torch.Tensor, dtype: str, col: int, n: int) -> torch.Tensor:
    """Payload columns ``[col, col + n)`` (fp32 numbering: ``EMBED_W`` is the first weight)
    of full rows (m, width) float32 as (m, n) float32 (a new tensor)."""
    if dtype == "fp32":
        return rows[:, col : col + n].clone()
    e = col - _C.EMBED_W
    return _half_view(rows, dtype)[:, e : e + n].to(torch.float32)


def encode_(rows: torch.Tensor, dtype: str, col: int, values: torch.Tensor) -> None:
    """Writes ``values`` (m, n) float32 into payload columns ``[col, col + n)`` of full rows
    (m, width) float32 (contiguous, updated in place), rounded to nearest."""
    n = values.shape[1]
    if dtype == "fp32":
        rows[:, col : col + n] = values
        return
    if dtype == "fp16":
        values = values.clamp(-FP16_MAX, FP16_MAX)  # NaN stays NaN
    e = col - _C.EMBED_W
    _half_view(rows, dtype)[:, e : e + n] = values.to(_HALF[dtype])


def weights(rows: torch.Tensor, dtype: str, dim: int) -> torch.Tensor:
    """The weights (m, dim) float32 of full rows (m, width) float32."""
    return decode(rows, dtype, _C.EMBED_W, dim)


def convert(rows: torch.Tensor, src: str, dst: str, payload: int) -> torch.Tensor:
    """Full rows (m, width of src) as rows of dtype ``dst`` (m, width of dst): the header
    as it is, the ``payload`` values decoded and encoded to nearest (a new tensor)."""
    out = torch.zeros((rows.shape[0], row_width(dst, payload)), dtype=torch.float32)
    out[:, : _C.EMBED_W] = rows[:, : _C.EMBED_W]
    encode_(out, dst, _C.EMBED_W, decode(rows, src, _C.EMBED_W, payload))
    return out


def finite(rows: torch.Tensor, dtype: str, payload: int) -> bool:
    """Whether full rows (m, width) float32 hold no NaN or Inf: the header words and the
    ``payload`` values decoded (a compact row's raw words are not float32 values)."""
    header = rows[:, : _C.EMBED_W]
    return bool(torch.isfinite(header).all()) and bool(
        torch.isfinite(decode(rows, dtype, _C.EMBED_W, payload)).all()
    )


def _half_view(rows: torch.Tensor, dtype: str) -> torch.Tensor:
    """The payload words of full rows (m, width) float32 as (m, 2 (width - EMBED_W)) 16-bit
    values of dtype (a view: little-endian, value 2j is the low half of word j)."""
    if dtype not in _HALF:
        raise ValueError(f"unknown row dtype {dtype!r}; expected one of {', '.join(ROW_DTYPES)}")
    return rows[:, _C.EMBED_W :].view(_HALF[dtype])
