"""The AUC picture at the end of ``streamrec up``: predict and train AUC per pass against the
best AUC the planted truth allows, because a curve is read faster than the summary table.

A pass is the api's pass record (see :mod:`streamrec.launcher.report`); only ``day``,
``pass_id``, ``predict_auc``, ``train_auc`` and ``best_auc`` are drawn, and a value that is
``None`` is left out rather than drawn as 0. matplotlib is imported only when a picture is
drawn, so the launcher runs without it otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

WIDTH_IN, HEIGHT_IN, DPI = 8.0, 4.5, 120
PREDICT_COLOR, TRAIN_COLOR, BEST_COLOR, DAY_COLOR = "#1f77b4", "#ff7f0e", "#2ca02c", "#888888"


def _known(passes: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """The pass indices and values of ``key`` where it is reported."""
    xs = [i for i, p in enumerate(passes) if p.get(key) is not None]
    return xs, [float(passes[i][key]) for i in xs]


def _y_range(values: list[float]) -> tuple[float, float]:
    """A y-range around ``values`` with a margin, kept inside the AUC's [0, 1]."""
    lo, hi = min(values), max(values)
    margin = max(0.01, 0.08 * (hi - lo))
    return max(0.0, lo - margin), min(1.0 + margin / 2, hi + margin)


def _day_spans(passes: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    """``(day, first index, last index)`` for each run of passes of the same day."""
    spans: list[tuple[str, int, int]] = []
    for i, p in enumerate(passes):
        day = str(p["day"])
        if spans and spans[-1][0] == day:
            spans[-1] = (day, spans[-1][1], i)
        else:
            spans.append((day, i, i))
    return spans


def write_auc_png(passes: list[dict[str, Any]], path: Path) -> Path:
    """Draws predict and train AUC per pass against the best possible AUC into a PNG.

    Args:
        passes: pass records (``day`` YYYYMMDD, ``pass_id``, ``predict_auc``, ``train_auc``,
            ``best_auc``); drawn in (day, pass_id) order, a day's start marked on the x axis.
        path: the PNG to write (its folder is created).

    Returns ``path``. Raises ``ValueError`` when no pass reports a predict or train AUC, and
    ``RuntimeError`` when matplotlib is not installed.
    """
    passes = sorted(passes, key=lambda p: (str(p["day"]), int(p["pass_id"])))
    predict = _known(passes, "predict_auc")
    train = _known(passes, "train_auc")
    best = _known(passes, "best_auc")
    if not predict[0] and not train[0]:
        raise ValueError(
            f"no AUC to draw: none of the {len(passes)} passes reports a predict_auc or train_auc"
        )
    try:
        # The Agg canvas named outright, without pyplot: no global backend switch, no
        # figure registry, safe in any process.
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise RuntimeError(
            "drawing the AUC picture needs matplotlib: `pip install matplotlib`"
        ) from exc

    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()

    if predict[0]:
        ax.plot(
            *predict,
            color=PREDICT_COLOR,
            marker="o",
            markersize=4,
            lw=1.8,
            zorder=3,
            label="predict AUC",
        )
    if train[0]:
        ax.plot(*train, color=TRAIN_COLOR, marker="s", markersize=3.5, lw=1.4, label="train AUC")
    if best[0]:
        ax.hlines(
            best[1],
            [x - 0.45 for x in best[0]],
            [x + 0.45 for x in best[0]],
            colors=BEST_COLOR,
            linestyles="dashed",
            linewidth=1.6,
            label="best possible AUC",
        )

    spans = _day_spans(passes)
    for _, first, _ in spans[1:]:
        ax.axvline(first - 0.5, color=DAY_COLOR, linestyle=":", linewidth=1)
    # Pass ids as minor ticks next to the axis, each day's label under its passes.
    ax.set_xticks(range(len(passes)), [str(p["pass_id"]) for p in passes], minor=True)
    ax.set_xticks([(first + last) / 2 for _, first, last in spans], [d for d, _, _ in spans])
    ax.tick_params(axis="x", which="minor", labelsize=7, length=3)
    ax.tick_params(axis="x", which="major", length=0, pad=14)
    ax.set_xlim(-0.6, len(passes) - 0.4)
    ax.set_ylim(*_y_range(predict[1] + train[1] + best[1]))
    ax.grid(axis="y", alpha=0.3)

    title = "AUC per pass against the best AUC the planted truth allows"
    if predict[1] and best[1]:
        mean_pred, mean_best = sum(predict[1]) / len(predict[1]), sum(best[1]) / len(best[1])
        title += f"\nmean predict AUC {mean_pred:.4f} = {mean_pred / mean_best:.3f} of the best"
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("pass (by day, YYYYMMDD)")
    ax.set_ylabel("AUC")
    ax.legend(loc="lower right", fontsize=8, framealpha=0.9)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=DPI)
    return path
