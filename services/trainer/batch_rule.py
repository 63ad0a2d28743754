"""The training batch a pass gets when the job leaves it to the stream
(``runner.train_batch_size: auto``, the default).

A step is what learns: a pass of a few hundred rows at a fixed batch of 256 is a step or
two a rank, and a model that sees a handful of steps a day learns nothing for weeks (the
issue's free-text stream: 0.838 against 0.91 tuned). A pass of millions of rows wants the
opposite, few full steps (samples a second). So the batch follows the rows this rank has in
the pass: about :data:`TARGET_STEPS` steps, rounded down to a power of two, between
:data:`MIN_BATCH` and :data:`MAX_BATCH`. The rows are the pass's own, counted by its predict
phase (every row is scored before it is trained on); without one (``predict_before_train:
false``) the previous pass's, and :data:`FIRST_BATCH` for a run's first pass. The pass
record says which batch ran (``batch_size``). Measured: BENCHMARKS.md, "Quality on real data
sets"; the trainer README's defaults.
"""

from __future__ import annotations

#: Steps a rank should get from one pass.
TARGET_STEPS = 64
#: The smallest batch the rule picks (a smaller one costs more in step overhead than it
#: gives in updates).
MIN_BATCH = 32
#: The largest batch the rule picks (a large pass: full steps, setup b's size).
MAX_BATCH = 2048
#: A run's first pass when nothing has counted its rows.
FIRST_BATCH = 256


def auto_batch_size(rows: int | None) -> int:
    """The batch for a pass of ``rows`` rows on this rank (None: not known)."""
    if not rows or rows <= 0:
        return FIRST_BATCH
    per_step = max(rows // TARGET_STEPS, 1)
    return min(max(1 << (per_step.bit_length() - 1), MIN_BATCH), MAX_BATCH)
