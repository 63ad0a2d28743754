"""``tools/chaos.py``'s own logic: the job window of a run over several days, the flags it
refuses (naming flag and value), and how its REST clients count the answers (a 5xx is a
defect, a 503 that says when to ask again is not)."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
from chaos_clients import Answers

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import chaos  # noqa: E402


def test_a_long_run_crosses_day_ends():
    """Two hours of a split every 4 s over 5-minute splits: 1,800 passes, 288 a day."""
    assert chaos.job_end(1800, 5) == (7, "20190726", "0555")
    assert chaos.job_end(288, 5) == (1, "20190720", "2355")
    assert chaos.job_end(60, 1) == (1, "20190720", "0059")


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--split-interval", "7"], "--split-interval must divide 1440, got 7"),
        (["--delta-every", "-1"], "--delta-every must be >= 0, got -1"),
        (["--pollers", "-2"], "--pollers must be >= 0, got -2"),
        (["--export-every", "-5"], "--export-every must be >= 0, got -5.0"),
        (["--kinds", "api,disk"], "--kinds must be some of"),
        (["--trainers", "0"], "--trainers must be >= 1, got 0"),
    ],
)
def test_bad_flags_are_refused_naming_them(flags, names):
    args = chaos.build_parser().parse_args(flags)
    with pytest.raises(ValueError, match=names.replace("-", r"\-").replace(".", r"\.")):
        chaos.check(args)


def test_the_answers_are_counted_by_status_and_only_real_5xx_are_defects():
    answers = Answers()
    ok = httpx.Response(200)
    down = httpx.Response(503, headers={"Retry-After": "2"}, text="state store unavailable")
    crash = httpx.Response(500, text="Internal Server Error")
    unready = httpx.Response(503, text='{"status":"unavailable"}')
    answers.add("GET", "/v1/jobs/j", ok)
    answers.add("GET", "/v1/jobs/j", down)
    answers.add("GET", "/readyz", unready)
    answers.add("GET", "/v1/jobs/j/passes", crash)
    answers.add("GET", "/v1/jobs/j", None)
    assert answers.by_status == {"200": 1, "503": 2, "500": 1, "unreachable": 1}
    assert answers.unavailable == 2 and answers.fives == 1 and answers.total == 5
    assert answers.server_errors[0][1:3] == ("GET /v1/jobs/j/passes", 500)


def test_the_push_order_goes_into_the_job_and_an_unknown_one_is_refused(capsys):
    from chaos_harness import with_push_order

    template = {"name": "demo", "model": {"runner": {"sparse_threads": 2}}}
    spec = with_push_order(template, "rank")
    assert spec["model"]["runner"] == {"sparse_threads": 2, "sparse_push_order": "rank"}
    assert template["model"]["runner"] == {"sparse_threads": 2}  # the template is left alone
    assert with_push_order({"name": "demo"}, "arrival")["model"] == {
        "runner": {"sparse_push_order": "arrival"}
    }
    assert chaos.build_parser().parse_args([]).push_order == "arrival"
    with pytest.raises(SystemExit):
        chaos.build_parser().parse_args(["--push-order", "sorted"])
    assert "invalid choice: 'sorted'" in capsys.readouterr().err
