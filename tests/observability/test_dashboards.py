"""The committed Grafana dashboards: generated from code, well-formed, and querying real metrics.

Every panel's PromQL is parsed by promtool (as a recording rule), and every metric it names
must be declared in some ``services/**/metrics.py``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from streamrec.observability import dashboards
from streamrec.observability.__main__ import main
from streamrec.observability.generated import StaleGeneratedFile

REPO = Path(__file__).resolve().parents[2]
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

#: Panels each dashboard must show (by title); the issue's list of what a dashboard is for.
EXPECTED_PANELS = {
    "streamrec-job": {
        "Passes",
        "AUC per pass",
        "AUC gap to best possible",
        "Logloss per pass",
        "Samples/s",
        "Pass duration",
        "Predicted vs actual CTR per pass",
        "Training against its data",
        "Checkpoints",
        "Last checkpoint age",
        "Pass lag behind the data",
    },
    "streamrec-embedding-store": {
        "Rows per table and tier",
        "Memory",
        "Cache hit rate",
        "Pull latency",
        "Push latency",
        "Keys/s",
        "Shrink and admission",
        "Checkpoint events",
        "GPU memory and utilisation",
        "GPU memory used",
    },
    "streamrec-sampler": {"Negatives/s", "Request latency", "Table size", "Errors/s"},
    "streamrec-control-plane": {
        "Requests/s by route and status",
        "Errors/s",
        "Work queue depth",
        "Passes handed out and requeued",
        "Trainer heartbeats",
        "Trainer groups dead and restarted",
        "Scheduler tick latency",
        "Trainer pool",
        "Jobs waiting for trainers",
    },
}

#: Series every Prometheus makes or every prometheus_client registry carries, and NVIDIA's
#: DCGM exporter's (panels reading them fall back to 0 where it does not run).
BUILT_IN = re.compile(r"^(up|process_\w+|DCGM_FI_\w+)$")

#: Words of PromQL that look like names but are not metrics.
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def _load(name: str) -> dict[str, Any]:
    path = REPO / dashboards.DASHBOARD_DIR / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8"))


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p.get("type") != "row"]


def _metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are no function, label or keyword."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    s = re.sub(r"\{[^}]*\}", "", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", "", s)  # range and subquery windows
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", s)
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?", s):
        if m.group(2) is None and m.group(1) not in KEYWORDS:
            names.add(m.group(1))
    return names


def _metric_sources() -> list[tuple[str, str]]:
    """(source text, its ``PREFIX`` value or "") of every service's metrics module."""
    sources = []
    for path in sorted((REPO / "services").glob("**/metrics.py")):
        text = path.read_text(encoding="utf-8")
        prefix = re.search(r'^PREFIX\s*=\s*"([^"]+)"', text, re.M)
        sources.append((text, prefix.group(1) if prefix else ""))
    return sources


def _declared(name: str, sources: list[tuple[str, str]]) -> bool:
    """Whether a metrics module declares ``name`` (literally, or as PREFIX + suffix)."""
    bases = {name, re.sub(r"_(bucket|count|sum)$", "", name)}
    for text, prefix in sources:
        for base in bases:
            if f'"{base}"' in text:
                return True
            if prefix and base.startswith(prefix + "_"):
                suffix = base.removeprefix(prefix + "_")
                # f"{PREFIX}_rows", or a (suffix, help) table of counters read from stats
                if f'{{PREFIX}}_{suffix}"' in text or f'("{suffix}"' in text:
                    return True
    return False


def test_metric_names_extracted_from_promql():
    expr = (
        'histogram_quantile(0.99, sum by (le, op) (rate(a_seconds_bucket{op=~"x|y"}[1m])))'
        " / ignoring(kind) (b_total or on() vector(0)) > bool 0 unless c offset 1d"
    )
    assert _metric_names(expr) == {"a_seconds_bucket", "b_total", "c"}


def test_committed_json_is_what_the_code_generates():
    paths = dashboards.write_generated(REPO, check=True)
    assert {p.name for p in paths} == {f"{n}.json" for n in EXPECTED_PANELS}


def test_check_names_a_stale_dashboard(tmp_path):
    written = dashboards.write_generated(tmp_path, check=False)
    dashboards.write_generated(tmp_path, check=True)
    stale = written[2]
    stale.write_text(stale.read_text(encoding="utf-8").replace("StreamRec", "Other", 1))
    with pytest.raises(StaleGeneratedFile) as raised:
        dashboards.write_generated(tmp_path, check=True)
    assert raised.value.path == stale


def test_cli_check_exits_1_naming_the_stale_file(tmp_path, capsys):
    assert main(["generate", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in EXPECTED_PANELS:
        assert str(tmp_path / dashboards.DASHBOARD_DIR / f"{name}.json") in out
    assert main(["generate", "--check", "--root", str(tmp_path)]) == 0
    stale = tmp_path / dashboards.DASHBOARD_DIR / "streamrec-sampler.json"
    stale.unlink()
    assert main(["generate", "--check", "--root", str(tmp_path)]) == 1
    assert str(stale) in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(EXPECTED_PANELS))
def test_dashboard_is_well_formed(name):
    board = _load(name)
    assert board["uid"] == name
    assert board["title"].startswith("StreamRec / ")
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = _panels(board)
    assert {p["title"] for p in panels} >= EXPECTED_PANELS[name]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert panel["title"], panel
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]
        exprs = [t.get("expr", "") for t in panel["targets"]]
        assert exprs and all(e.strip() for e in exprs), panel["title"]
        for expr in exprs:
            # a rate window that follows the scrape interval, not a guessed constant
            for window in re.findall(r"\[([^\]]+)\]", expr):
                assert window == "$__rate_interval", (panel["title"], expr)
            if "$job" in expr:
                assert "job" in variables, (panel["title"], expr)


def test_uids_are_unique():
    uids = [_load(name)["uid"] for name in EXPECTED_PANELS]
    assert len(set(uids)) == len(uids)


def test_queries_walks_every_target():
    board = _load("streamrec-sampler")
    exprs = dashboards.queries(board)
    assert len(exprs) == sum(len(p["targets"]) for p in _panels(board))
    assert any("streamrec_sampler_negatives_sampled_total" in e for e in exprs)


@pytest.mark.parametrize("name", sorted(EXPECTED_PANELS))
def test_every_metric_is_declared_by_a_service(name):
    sources = _metric_sources()
    board = _load(name)
    exprs = dashboards.queries(board)
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            found = re.fullmatch(r"label_values\((\w+), *\w+\)", variable["query"])
            assert found, variable["query"]
            exprs.append(found.group(1))
    undeclared = {
        metric
        for expr in exprs
        for metric in _metric_names(expr)
        if not BUILT_IN.match(metric) and not _declared(metric, sources)
    }
    assert not undeclared, f"{name}: no services/**/metrics.py declares {sorted(undeclared)}"


@pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool is not installed")
def test_every_query_parses_under_promtool(tmp_path):
    rules = []
    for name in sorted(EXPECTED_PANELS):
        for i, expr in enumerate(dashboards.queries(_load(name))):
            concrete = expr.replace("$__rate_interval", "1m").replace("$job", ".*")
            assert "$" not in concrete, f"unknown variable in {expr}"
            rules.append({"record": f"dashboard:{name.replace('-', '_')}:{i}", "expr": concrete})
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(rules)} rules found" in result.stdout


def _expr(name: str, title: str, target: int = 0) -> str:
    """A panel's query with the dashboard variables given concrete values."""
    panel = next(p for p in _panels(_load(name)) if p["title"] == title)
    expr = panel["targets"][target]["expr"]
    return expr.replace("$__rate_interval", "2m").replace("$job", ".*")


@pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool is not installed")
def test_queries_compute_what_their_panel_says(tmp_path):
    """A few queries on series as Prometheus stores them (the API's job id as job_id; its
    per-job gauges read from the replica holding the scheduler lease)."""
    api = 'job="streamrec-api", instance="api:8000"'
    stale = 'job="streamrec-api", instance="api-2:8000"'
    cases = {
        "input_series": [
            {
                "series": f'streamrec_api_pass_auc{{{api}, job_id="j1", kind="best"}}',
                "values": "0.75x5",
            },
            {
                "series": f'streamrec_api_pass_auc{{{api}, job_id="j1", kind="predict"}}',
                "values": "0.5x5",
            },
            {
                "series": f'streamrec_api_pass_auc{{{api}, job_id="j2", kind="best"}}',
                "values": "1x5",
            },
            {
                "series": f'streamrec_api_pass_auc{{{api}, job_id="j2", kind="predict"}}',
                "values": "0.875x5",
            },
            {
                "series": f'streamrec_api_requests_total{{{api}, method="GET", route="/v1/jobs", '
                'status="200"}',
                "values": "0+60x5",
            },
            {
                "series": f'streamrec_api_work_queue_depth{{{api}, job_id="j1"}}',
                "values": "3x5",
            },
            {"series": f"streamrec_api_scheduler_leader{{{api}}}", "values": "1x5"},
            # a replica that lost the lease keeps its last gauges: never shown
            {
                "series": f'streamrec_api_work_queue_depth{{{stale}, job_id="j1"}}',
                "values": "9x5",
            },
            {
                "series": f'streamrec_api_pass_auc{{{stale}, job_id="j1", kind="predict"}}',
                "values": "0.1x5",
            },
            {"series": f"streamrec_api_scheduler_leader{{{stale}}}", "values": "0x5"},
        ],
        "promql_expr_test": [
            {  # best - predict per StreamRec job
                "expr": _expr("streamrec-job", "AUC gap to best possible"),
                "eval_time": "4m",
                "exp_samples": [
                    {"labels": f'{{{api}, job_id="j1"}}', "value": 0.25},
                    {"labels": f'{{{api}, job_id="j2"}}', "value": 0.125},
                ],
            },
            {  # no 5xx yet: a share of 0, not an empty panel
                "expr": _expr("streamrec-control-plane", "5xx rate"),
                "eval_time": "4m",
                "exp_samples": [{"labels": "{}", "value": 0}],
            },
            {  # a series exists: the fallback 0 stays out
                "expr": _expr("streamrec-control-plane", "Work queue depth"),
                "eval_time": "4m",
                "exp_samples": [{"labels": '{job_id="j1"}', "value": 3}],
            },
        ],
        "interval": "1m",
    }
    path = tmp_path / "dashboards.test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [], "tests": [cases]}))
    result = subprocess.run(
        [PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _stats(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in _panels(board) if p["type"] == "stat"]


@pytest.mark.parametrize("name", sorted(EXPECTED_PANELS))
def test_every_stat_has_its_own_thresholds(name):
    """Grafana's default (green, red from 80) would show Redis down or a full shard green."""
    for panel in _stats(_load(name)):
        thresholds = panel["fieldConfig"]["defaults"]["thresholds"]
        steps = thresholds["steps"]
        assert thresholds["mode"] == "absolute" and steps, panel["title"]
        assert steps[0]["value"] is None, panel["title"]
        assert [(st["color"], st["value"]) for st in steps] != [("green", None), ("red", 80)]
        assert panel["options"]["colorMode"] == "background", panel["title"]


def _step_colour(panel: dict[str, Any], value: float) -> str:
    colour = ""
    for step in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]:
        if step["value"] is None or value >= step["value"]:
            colour = step["color"]
    return colour


def test_stats_colour_trouble_red_and_health_green():
    plane = {p["title"]: p for p in _stats(_load("streamrec-control-plane"))}
    assert _step_colour(plane["Redis up"], 0) == "red"
    assert _step_colour(plane["Redis up"], 1) == "green"
    assert _step_colour(plane["Scheduler leaders"], 0) == "red"
    assert _step_colour(plane["Scheduler leaders"], 2) == "red"
    store = {p["title"]: p for p in _stats(_load("streamrec-embedding-store"))}
    assert _step_colour(store["Memory used (resident / limit)"], 0.95) == "red"
    assert _step_colour(store["Memory used (resident / limit)"], 0.5) == "green"


def test_sampler_panels_show_each_node():
    for panel in _panels(_load("streamrec-sampler")):
        if panel["type"] == "timeseries":
            for target in panel["targets"]:
                assert "instance" in target["expr"], (panel["title"], target["expr"])
                assert "{{instance}}" in target["legendFormat"], panel["title"]


def test_auc_gap_says_when_no_best_is_known():
    for panel in _panels(_load("streamrec-job")):
        if "gap to best" in panel["title"]:
            assert "no best" in panel["fieldConfig"]["defaults"]["noValue"], panel["title"]


@pytest.mark.parametrize("name", sorted(EXPECTED_PANELS))
def test_dashboard_says_it_is_generated_and_fits_hourly_passes(name):
    board = _load(name)
    assert "Generated by `python -m streamrec.observability generate`" in board["description"]
    assert "services/observability/dashboards.py" in board["description"]
    assert "generated" in board["tags"]
    assert board["time"] == {"from": "now-24h", "to": "now"}


@pytest.mark.parametrize("name", sorted(EXPECTED_PANELS))
def test_api_gauges_are_read_from_the_scheduler_leader(name):
    gauges = re.compile(
        r"streamrec_api_(trainer_\w+_age_seconds|work_queue_depth|pass_auc|pass_ctr|pass_lag"
        r"_seconds|data_wait_seconds|jobs_waiting_for_trainers|pool_groups|pass_logloss|jobs)\b"
    )
    for expr in dashboards.queries(_load(name)):
        for _ in gauges.finditer(expr):
            assert "streamrec_api_scheduler_leader == 1" in expr, expr
