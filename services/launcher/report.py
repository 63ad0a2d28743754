"""What ``streamrec up`` prints about the job: a row per finished pass while it follows the
job over REST (:func:`follow_job`), then a summary of the AUC reached against the best AUC
the planted truth allows, with a picture of it (:func:`say_summary`).

A pass is the api's pass record (``GET /v1/jobs/{id}/passes``): ``day``, ``pass_id``,
``samples``, ``predict_auc`` (before training on the pass), ``train_auc``, ``best_auc``,
``logloss``, ``seconds``; a value not reported shows as ``-``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamrec.api.client import ApiClient
from streamrec.control.states import TERMINAL_STATES
from streamrec.errors import RemoteError, ServiceUnavailable
from streamrec.launcher.plot import write_auc_png
from streamrec.pass_line import PASS_HEADER, cell, pass_row

SUMMARY_HEADER = (
    f"{'day':>8} {'pass':>4} {'predictAUC':>10} {'trainAUC':>9} {'bestAUC':>8} {'pred/best':>9}"
)


def new_pass_rows(
    passes: list[dict[str, Any]], shown: set[tuple[str, int]], total: int
) -> list[str]:
    """A row for each pass done and not shown yet (added to ``shown``), ending in
    ``[k/total]``, k the passes shown so far: one more per row, so the counter never repeats
    or skips a value, and a pass rolled back and trained again (done a second time) is
    neither shown again nor counted twice. The job's ``passes_done`` is not used: read apart
    from the passes, it may already count a pass the list does not show done yet, and it
    goes down when passes are rolled back."""
    rows = []
    for p in passes:
        key = (p["day"], p["pass_id"])
        if p["state"] == "done" and key not in shown:
            shown.add(key)
            rows.append(pass_row(p) + f"   [{len(shown)}/{total}]")
    return rows


def summary_row(p: dict[str, Any]) -> str:
    """A pass's row in the summary, under :data:`SUMMARY_HEADER`: its AUCs and predict/best."""
    ratio = None
    if p.get("predict_auc") is not None and p.get("best_auc"):
        ratio = p["predict_auc"] / p["best_auc"]
    return (
        f"{p['day']:>8} {p['pass_id']:>4} {cell(p.get('predict_auc'), 10)} "
        f"{cell(p.get('train_auc'), 9)} {cell(p.get('best_auc'), 8)} {cell(ratio, 9, 3)}"
    )


def summary_lines(passes: list[dict[str, Any]]) -> list[str]:
    """The summary of the finished ``passes``: a row each, the mean predict AUC against the
    mean best, and the first pass's predict AUC against the last's."""
    lines = ["summary: AUC per pass against the best AUC the planted truth allows"]
    lines.append(SUMMARY_HEADER)
    lines.extend(summary_row(p) for p in passes)
    pred = [p["predict_auc"] for p in passes if p.get("predict_auc") is not None]
    best = [p["best_auc"] for p in passes if p.get("best_auc") is not None]
    if pred and best:
        mp, mb = sum(pred) / len(pred), sum(best) / len(best)
        lines.append(
            f"mean predict AUC {mp:.4f} vs best {mb:.4f}: {mp / mb:.3f} of the best "
            f"possible over {len(pred)} passes"
        )
    if len(pred) >= 2:
        lines.append(f"first pass predict AUC {pred[0]:.4f} -> last {pred[-1]:.4f}")
    return lines


def follow_job(
    api: ApiClient,
    job_id: str,
    timeout_s: float,
    say: Callable[[str], None],
    check: Callable[[], None],
    stopping: Callable[[], bool],
) -> int:
    """Says a row per finished pass until the job ends, calling ``check`` (the children's
    supervision) between two looks. Returns 0 when the job succeeded, 1 when it did not (or
    was deleted), 3 after ``timeout_s``, 130 once ``stopping()``."""
    say("")
    say(PASS_HEADER)
    shown: set[tuple[str, int]] = set()
    deadline = time.monotonic() + timeout_s
    last_error = ""
    while not stopping():
        check()
        try:
            job = api.job(job_id)
            passes = api.passes(job_id)
        except (ServiceUnavailable, RemoteError) as exc:
            if isinstance(exc, RemoteError) and exc.code == "404":
                say(f"job {job_id} deleted")  # over REST: nothing to follow
                return 1
            if str(exc) != last_error:
                say(f"  (api: {exc})")
                last_error = str(exc)
            time.sleep(1)
            continue
        for row in new_pass_rows(passes, shown, job["passes_total"]):
            say(row)
        if job["state"] in TERMINAL_STATES:
            say(f"job {job_id} {job['state']}" + (f": {job['error']}" if job.get("error") else ""))
            return 0 if job["state"] == "succeeded" else 1
        if time.monotonic() > deadline:
            say(
                f"! timeout: job still {job['state']} after {timeout_s:.0f}s "
                f"({job['passes_done']}/{job['passes_total']} passes)"
            )
            return 3
        time.sleep(0.5)
    return 130


def say_summary(
    api: ApiClient, job_id: str, run: Path, logs: Path, say: Callable[[str], None]
) -> None:
    """Says the summary of the job's finished passes, writes their AUC picture
    (``run/auc.png``) and says where the models and logs are."""
    try:
        passes = [p for p in api.passes(job_id) if p["state"] == "done"]
    except (ServiceUnavailable, RemoteError) as exc:
        say(f"no summary: {exc}")
        return
    say("")
    for line in summary_lines(passes):
        say(line)
    try:
        say(f"AUC picture: {write_auc_png(passes, run / 'auc.png')}")
    except (ValueError, RuntimeError) as exc:  # no AUC yet, or no matplotlib
        say(f"no AUC picture: {exc}")
    say(f"models under {run / 'models'}, logs under {logs}")
