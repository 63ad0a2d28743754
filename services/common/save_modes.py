"""The four ways a model is saved (PaddleRec's), shared by every service that names one.

``checkpoint``: every row with its optimizer state and statistics, for warm start.
``batch``: the same after the daily shrink. ``base``: weights of the rows worth serving
(a day's full serving model). ``delta``: weights of the rows changed since the last save.
The store writes them, the trainer asks for them, the API triggers them.
"""

from __future__ import annotations

from enum import StrEnum

from streamrec.errors import quote


class SaveMode(StrEnum):
    CHECKPOINT = "checkpoint"
    BASE = "base"
    DELTA = "delta"
    BATCH = "batch"


#: Every mode's value, in the order above (for messages and Literal-like checks).
SAVE_MODES: tuple[str, ...] = tuple(m.value for m in SaveMode)
#: Modes that keep optimizer state and statistics (a model that can be trained on).
FULL_MODES: frozenset[SaveMode] = frozenset({SaveMode.CHECKPOINT, SaveMode.BATCH})
#: Modes that write weights only, for serving (what a serving converter takes), in order.
SERVING_MODES: tuple[str, ...] = tuple(m.value for m in SaveMode if m not in FULL_MODES)


def parse_save_mode(
    value: object, field: str = "mode", error: type[Exception] = ValueError
) -> SaveMode:
    """The :class:`SaveMode` that ``value`` (from the wire, a file, a caller) names.

    Raises ``error`` naming ``field`` and the value when it names none (a non-string too),
    so each service refuses with its own error class (``BadRequest``, ``CheckpointError``).

    Example:
        >>> parse_save_mode("base") is SaveMode.BASE
        True
    """
    if isinstance(value, str):
        try:
            return SaveMode(value)
        except ValueError:
            pass
    raise error(f"field {field!r}: save mode must be one of {list(SAVE_MODES)}, got {quote(value)}")
