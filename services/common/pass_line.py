"""The one-line view of a finished pass, the same wherever a person watches a job train
(``streamrec up``'s live rows, ``streamrec-trainer``'s progress): day, pass, samples,
predict/train/best AUC, logloss, seconds; a value not reported shows as ``-``.

A pass is a pass record (``passes.jsonl``, ``GET /v1/jobs/{id}/passes``).
"""

from __future__ import annotations

from typing import Any

PASS_HEADER = (
    f"{'day':>8} {'pass':>4} {'samples':>8} {'predictAUC':>10} {'trainAUC':>9} "
    f"{'bestAUC':>8} {'logloss':>8} {'seconds':>7}"
)


def cell(v: Any, width: int, digits: int = 4) -> str:
    """``v`` right-aligned in ``width`` with ``digits`` decimals; ``-`` when not a number."""
    return f"{v:>{width}.{digits}f}" if isinstance(v, int | float) else f"{'-':>{width}}"


def pass_row(p: dict[str, Any]) -> str:
    """The row of a finished pass, under :data:`PASS_HEADER`."""
    return (
        f"{p['day']:>8} {p['pass_id']:>4} {p.get('samples') or 0:>8} "
        f"{cell(p.get('predict_auc'), 10)} {cell(p.get('train_auc'), 9)} "
        f"{cell(p.get('best_auc'), 8)} {cell(p.get('logloss'), 8)} "
        f"{cell(p.get('seconds'), 7, 1)}"
    )
