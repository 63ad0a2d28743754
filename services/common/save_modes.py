"""The four ways a model is saved (PaddleRec's), shared by every service that names one.

``checkpoint``: every row with its optimizer state and statistics, for warm start.
``batch``: the same after the daily shrink. ``base``: weights of the rows worth serving
(a day's full serving model). ``delta``: weights of the rows changed since the last save.
The store writes them, the trainer asks for them, the API triggers them.
"""

from __future__ import annotations

from enum import StrEnum


class SaveMode(StrEnum):
    CHECKPOINT = "checkpoint"
    BASE = "base"
    DELTA = "delta"
    BATCH = "batch"


#: Every mode, in the order above (for messages and Literal-like checks).
SAVE_MODES: tuple[str, ...] = tuple(m.value for m in SaveMode)
#: Modes that keep optimizer state and statistics (a model that can be trained on).
FULL_MODES: frozenset[str] = frozenset({SaveMode.CHECKPOINT, SaveMode.BATCH})
