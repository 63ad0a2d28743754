"""The AUC picture of ``streamrec up``: a real PNG of the right size, every series drawn in its
colour, a missing value left out (not drawn as 0), and clear errors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from streamrec.launcher.plot import (
    BEST_COLOR,
    DPI,
    HEIGHT_IN,
    PREDICT_COLOR,
    TRAIN_COLOR,
    WIDTH_IN,
    write_auc_png,
)

mpimg = pytest.importorskip("matplotlib.image")
mcolors = pytest.importorskip("matplotlib.colors")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def demo_passes() -> list[dict[str, Any]]:
    """Two days of six passes as the api reports them: AUC rising towards the best, one pass
    without a predict AUC and one without a best AUC."""
    passes = []
    for d, day in enumerate(["20190720", "20190721"]):
        for k in range(1, 7):
            i = 6 * d + k
            passes.append(
                {
                    "day": day,
                    "pass_id": k,
                    "state": "done",
                    "samples": 10000,
                    "predict_auc": 0.5 + 0.3 * (1 - 0.7**i),
                    "train_auc": 0.6 + 0.22 * (1 - 0.7**i),
                    "best_auc": 0.9 + 0.004 * (i % 3),
                    "logloss": 0.6 - 0.01 * i,
                }
            )
    passes[3]["predict_auc"] = None
    passes[8]["best_auc"] = None
    return passes


def read_rgb(path: Path) -> np.ndarray:
    """``(height, width, 3)`` float in [0, 1]."""
    return mpimg.imread(path)[..., :3]


def pixels_of(img: np.ndarray, color: str, tol: float = 0.03) -> int:
    """How many pixels of ``img`` have ``color`` (within ``tol`` per channel)."""
    rgb = np.array(mcolors.to_rgb(color))
    return int((np.abs(img - rgb) <= tol).all(axis=-1).sum())


def test_writes_a_png_of_the_set_size_with_every_series(tmp_path: Path) -> None:
    out = write_auc_png(demo_passes(), tmp_path / "sub" / "auc.png")
    assert out == tmp_path / "sub" / "auc.png"
    assert out.read_bytes()[:8] == PNG_MAGIC
    img = read_rgb(out)
    assert img.shape == (round(HEIGHT_IN * DPI), round(WIDTH_IN * DPI), 3)
    assert out.stat().st_size < 80_000
    # Each series shows in its own colour, as lines rather than a stray pixel or two.
    for color in (PREDICT_COLOR, TRAIN_COLOR, BEST_COLOR):
        assert pixels_of(img, color) > 200, color


def test_the_picture_follows_the_data(tmp_path: Path) -> None:
    passes = demo_passes()
    lower = [{**p, "train_auc": p["train_auc"] - 0.05} for p in passes]
    a = read_rgb(write_auc_png(passes, tmp_path / "a.png"))
    b = read_rgb(write_auc_png(lower, tmp_path / "b.png"))
    again = read_rgb(write_auc_png(passes, tmp_path / "again.png"))
    assert np.array_equal(a, again)
    assert not np.array_equal(a, b)


def test_a_missing_value_is_left_out_not_drawn_as_zero(tmp_path: Path) -> None:
    passes = demo_passes()
    zero = [dict(p) for p in passes]
    zero[3]["predict_auc"] = 0.0
    skipped = read_rgb(write_auc_png(passes, tmp_path / "none.png"))
    as_zero = read_rgb(write_auc_png(zero, tmp_path / "zero.png"))
    assert not np.array_equal(skipped, as_zero)


def test_a_series_nobody_reports_is_not_drawn(tmp_path: Path) -> None:
    passes = [{**p, "train_auc": None, "best_auc": None} for p in demo_passes()]
    img = read_rgb(write_auc_png(passes, tmp_path / "predict-only.png"))
    assert pixels_of(img, PREDICT_COLOR) > 200
    assert pixels_of(img, TRAIN_COLOR) == 0
    assert pixels_of(img, BEST_COLOR) == 0


@pytest.mark.parametrize(
    "passes",
    [
        [],
        [
            {"day": "20190720", "pass_id": 1, "predict_auc": None, "train_auc": None},
            {"day": "20190720", "pass_id": 2, "best_auc": 0.9},
        ],
    ],
    ids=["no passes", "no AUC"],
)
def test_passes_without_an_auc_are_refused(tmp_path: Path, passes: list[dict[str, Any]]) -> None:
    with pytest.raises(ValueError, match="no AUC to draw"):
        write_auc_png(passes, tmp_path / "auc.png")
    assert not (tmp_path / "auc.png").exists()


def test_without_matplotlib_it_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A None entry in sys.modules makes the import raise ImportError, as if not installed.
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(RuntimeError, match="pip install matplotlib"):
        write_auc_png(demo_passes(), tmp_path / "auc.png")
