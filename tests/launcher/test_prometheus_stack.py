"""End to end: ``streamrec up --prometheus`` runs a short job with a real Prometheus scraping
every service; then every dashboard panel and every alert has data.

How the expressions are evaluated, through Prometheus's HTTP API:

- A dashboard panel is a graph over a time range, so each expression runs as Grafana runs
  it: a range query (``/api/v1/query_range``) over the whole run, step 2 s. It passes when
  it returns a series with at least one finite point (one Grafana would draw). The trainers
  (and the running-only gauges of the control plane) end with the job, so an instant query
  after the job would miss them.
- Grafana's variables are replaced before the query: the interval variables
  (``$__rate_interval``, ``$__interval``, ``$__range`` ...) by ``1m``; every template variable
  (``$job``, ``${job}``, ``[[job]]``) by ``.*``, Grafana's "All" (the dashboards use them in
  regex matchers, ``=~"$job"``).
- An alert's ``signals`` are range queries like the panels (but those of an alert whose
  series exist only with a device or an event this stack has not, ``only_with``); its
  ``expr`` must be accepted by an instant query (status ``success``).
- Scrape targets: the API's, the shards' and the sampler's are up at the end (``up == 1``);
  each trainer rank's target was up during the run (``max_over_time(up[...]) == 1``).
- Alerts, as the stack's Prometheus evaluates them: none fires during the healthy job, the
  idle pool after it and a second job stopped mid-way; then injected faults fire theirs: a
  job whose data never lands, Redis hung, a store shard hung, a rank killed three times on
  its pass (the crash-loop alert). The first three wait minutes to hours in production
  (``for`` 1-10 min, data late past 2 h): for them the test reloads the stack's Prometheus
  with the same expressions, ``for`` at 1 s and the data threshold at 5 s (:func:`quick`).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
import servers
import torch
import yaml
from streamrec.api.client import ApiClient
from streamrec.launcher.prometheus import API_JOB, JOBS, SAMPLER_JOB, STORE_JOB, TRAINER_JOB
from streamrec.launcher.state import read_state
from streamrec.observability import alerts
from streamrec.process import bin_path, descendants, pid_alive, spawn, stop_process
from streamrec.ragged import RaggedTensor
from streamrec.sampler import LocalRpcDataSampler

pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "deploy" / "k8s" / "base" / "dashboards"
#: A short job: 1 day of 4 splits (4 passes), one shard on the ssd tier, one trainer rank; a
#: split lands every 4 s, so the trainers live (and are scraped) for a while.
UP_FLAGS = [
    "--prometheus",
    "--store-tier",
    "ssd",
    "--keep-running",
    "--days",
    "1",
    "--split-interval",
    "360",
    "--samples-per-split",
    "600",
    "--slots",
    "4",
    "--batch-size",
    "128",
    "--store-shards",
    "1",
    "--trainers",
    "1",
    "--trainer-groups",
    "1",
    "--rate",
    "0.25",
    "--timeout-s",
    "200",
]
INTERVAL_VARIABLE = re.compile(r"\$\{?__(rate_interval|interval|range)(_ms|_s)?\}?")
TEMPLATE_VARIABLE = re.compile(r"\$\{\w+(:\w+)?\}|\$\w+|\[\[\w+\]\]")

T = TypeVar("T")


def another_job(spec: dict[str, Any], name: str, **sections: Any) -> dict[str, Any]:
    """The demo job's spec as job ``name``, with its own model path (one path, one job)."""
    checkpoint = spec["checkpoint"]
    path = str(Path(checkpoint["model_save_path"]).parent / name)
    return {**spec, "name": name, "checkpoint": {**checkpoint, "model_save_path": path}, **sections}


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, up: Any) -> T:
    """Polls ``probe`` until it returns a truthy value; fails after ``timeout_s`` or as soon as
    the ``streamrec up`` process exits, with the end of its output."""
    return servers.wait_for(
        probe,
        timeout_s,
        0.5,
        what=what,
        gone=lambda: (
            None if up.proc.poll() is None else f"streamrec up exited ({up.proc.returncode})"
        ),
        detail=up.tail,
    )


class Up:
    """The ``streamrec up`` process and its output."""

    def __init__(self, run: Path, log: Path) -> None:
        self.run, self.log = run, log
        self.proc = spawn(
            [bin_path("streamrec"), "up", "--run-dir", str(run), *UP_FLAGS],
            log=log,
            die_with_parent=True,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.output().splitlines()[-n:])


class Prometheus:
    """Queries of the stack's Prometheus over its HTTP API."""

    def __init__(self, url: str, start: float) -> None:
        self.http = httpx.Client(base_url=url, timeout=10)
        self.start = start

    def instant(self, expr: str) -> dict[str, Any]:
        resp = self.http.get("/api/v1/query", params={"query": expr})
        return resp.json()

    def series(self, expr: str) -> list[dict[str, Any]]:
        """The series of an instant query (none when it fails)."""
        body = self.instant(expr)
        return body["data"]["result"] if body.get("status") == "success" else []

    def drawn(self, expr: str) -> list[dict[str, Any]]:
        """The series of ``expr`` over the run (a range query) with at least one finite
        point; raises AssertionError naming the expression when the query fails."""
        end, step = time.time(), 2
        # the last point is evaluated at ``end`` itself: the newest scrape counts
        start = end - math.ceil((end - self.start) / step) * step
        resp = self.http.get(
            "/api/v1/query_range",
            params={"query": expr, "start": start, "end": end, "step": step},
        )
        body = resp.json()
        assert body.get("status") == "success", f"{expr!r} refused: {body.get('error')}"
        return [
            s
            for s in body["data"]["result"]
            if any(math.isfinite(float(v)) for _t, v in s.get("values", []))
        ]


def grafana_to_promql(expr: str) -> str:
    """A panel's expression as Grafana would send it with every variable at "All" (see the
    module docstring)."""
    return TEMPLATE_VARIABLE.sub(".*", INTERVAL_VARIABLE.sub("1m", expr))


#: Panels whose empty state is a device this stack has not (they say so in their noValue).
NOT_HERE = ("no shard on a GPU",)


def panel_exprs(panels: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    """(panel title, expr) of every target of ``panels``, rows' nested panels included, but
    the panels of :data:`NOT_HERE`."""
    for panel in panels:
        no_value = str(panel.get("fieldConfig", {}).get("defaults", {}).get("noValue", ""))
        for target in panel.get("targets") or []:
            if target.get("expr") and no_value not in NOT_HERE:
                yield str(panel.get("title", "?")), str(target["expr"])
        yield from panel_exprs(panel.get("panels") or [])


def dashboard_queries() -> list[tuple[str, str]]:
    """(dashboard file / panel title, expr) of every dashboard JSON of the base."""
    files = sorted(DASHBOARDS.glob("*.json"))
    assert files, f"no dashboard JSON under {DASHBOARDS}"
    out = []
    for path in files:
        board = json.loads(path.read_text())
        found = [(f"{path.name} / {title}", e) for title, e in panel_exprs(board["panels"])]
        assert found, f"{path.name}: no panel with a PromQL expression"
        out += found
    return out


def drive_the_sampler(state: dict[str, Any], requests: int = 20) -> None:
    """Loads a small negative table into the node's sampler and draws negatives, as a trainer
    with negative sampling would (the demo job samples none)."""
    n = 200
    j = np.arange(n)
    table = {
        "item": torch.from_numpy(j * 10 + 1),
        "cat": RaggedTensor.from_lengths(torch.from_numpy(j % 4), torch.ones(n, dtype=torch.int64)),
        "w": torch.from_numpy((1 + j % 7).astype(np.float32)),
        "skey": [""] * n,
    }
    with LocalRpcDataSampler(
        "cat",
        "item",
        "w",
        "skey",
        endpoint=state["sampler_endpoint"],
        auto_start=False,
        timeout_s=30,
        auth_token_file=state["peer_token_file"],
    ) as sampler:
        assert sampler.reload(table)["rows"] == n
        for i in range(requests):
            positives = torch.from_numpy(j[i : i + 8] * 10 + 1)
            got = sampler.sample_ids(positives, 3, torch.from_numpy(j[i : i + 8] % 4))
            assert got.numel() == 24


def rank_pid(torchrun_pid: int) -> int | None:
    """The pid of the trainer rank (streamrec.trainer.agent) torchrun ``torchrun_pid`` runs."""
    for pid in descendants(torchrun_pid):
        try:
            if b"streamrec.trainer.agent" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


#: The faults the test injects whose alerts wait long in production: (alert, the part of its
#: expression that sets the threshold, what the test puts there).
QUICK = {
    "StreamRecDataNotArriving": (
        "streamrec_api_data_wait_seconds > 7200",
        "streamrec_api_data_wait_seconds > 5",
    ),
    "StreamRecRedisUnreachable": ("", ""),
    "StreamRecTargetDown": ("", ""),
}


def quick(run: Path, state: dict[str, Any]) -> None:
    """Rewrites the stack's rules file with the :data:`QUICK` alerts' ``for`` at 1 s and
    their thresholds lowered, and has Prometheus reload it (SIGHUP)."""
    rules_file = run / "prometheus" / "alerts.rules.yml"
    doc = yaml.safe_load(rules_file.read_text())
    changed = 0
    for rule in doc["groups"][0]["rules"]:
        if rule["alert"] in QUICK:
            old, new = QUICK[rule["alert"]]
            assert old in rule["expr"], (rule["alert"], rule["expr"])
            rule["expr"] = rule["expr"].replace(old, new) if old else rule["expr"]
            rule["for"] = "1s"
            changed += 1
    assert changed == len(QUICK)
    rules_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    (pid,) = [c["pid"] for c in state["children"].values() if c["cmd"] == "prometheus"]
    os.kill(pid, signal.SIGHUP)


def wait_firing(p: Prometheus, alert: str, up: Any, labels: str = "") -> None:
    """Waits for ``alert`` firing (``labels``: more matchers)."""
    wait_for(
        f"{alert} firing",
        lambda: p.series(f'ALERTS{{alertname="{alert}", alertstate="firing"{labels}}}'),
        60,
        up,
    )


def crash_loop(state: dict[str, Any], token: str, run: Path, up: Any, p: Prometheus) -> None:
    """Kills the rank of a job's group three times while its pass runs (one pass of the
    whole day in small batches: seconds long), then waits for the crash-loop alert."""
    api = ApiClient(state["api_url"], token)
    try:
        spec = api.job(state["job_id"])["spec"]
        model = {
            **spec["model"],
            "runner": {**spec["model"].get("runner", {}), "train_batch_size": 4},
        }
        data = {**spec["data"], "split_per_pass": 4}
        job_id = api.create_job(another_job(spec, "crash-loop", data=data, model=model))["id"]
        api.action(job_id, "start")
        for n in range(3):
            wait_for(
                f"the crash-loop job's pass running ({n})",
                lambda: any(x["state"] == "running" for x in api.passes(job_id)),
                90,
                up,
            )
            group = api.job(job_id)["group"]
            torchrun = ((read_state(run) or {}).get("children") or {})[group]["pid"]
            pid = wait_for("the group's rank", lambda t=torchrun: rank_pid(t), 30, up)
            os.kill(pid, signal.SIGKILL)
            wait_for(
                f"restart {n + 1} counted",
                lambda n=n: api.job(job_id)["restarts_total"] > n,
                90,
                up,
            )
        wait_firing(p, "StreamRecTrainerGroupRestarting", up, f', job_id="{job_id}"')
        api.action(job_id, "stop")
    finally:
        api.close()


def test_every_panel_and_alert_has_data_in_a_running_stack(tmp_path: Path) -> None:
    queries = dashboard_queries()  # fail first, and fast, when there are none
    run = tmp_path / "run"
    start = time.time() - 5
    up = Up(run, tmp_path / "up.log")
    prom: Prometheus | None = None
    try:
        state = wait_for(
            "Prometheus in stack.json",
            lambda: (s := read_state(run)) and s.get("prometheus_url") and s.get("job_id") and s,
            120,
            up,
        )
        targets = state["metrics"]
        assert set(targets) == set(JOBS)
        assert len(targets[STORE_JOB]) == 1 and len(targets[TRAINER_JOB]) == 1
        assert f"prometheus       {state['prometheus_url']}" in up.output()
        wait_for("the end of the job", lambda: "services stay up" in up.output(), 240, up)
        token = Path(state["token_file"]).read_text().strip()
        api = ApiClient(state["api_url"], token)
        try:
            job = api.job(state["job_id"])
        finally:
            api.close()
        assert job["state"] == "succeeded", up.tail()
        drive_the_sampler(state)
        prom = Prometheus(state["prometheus_url"], start)
        p = prom
        wait_for(
            "a scrape of the sampler's requests",
            lambda: p.series('streamrec_sampler_requests_total{op="sample_ids"} >= 20'),
            30,
            up,
        )
        # (a) every target of every job
        for job_name in (API_JOB, STORE_JOB, SAMPLER_JOB):
            values = {
                s["metric"]["instance"]: s["value"][1] for s in p.series(f'up{{job="{job_name}"}}')
            }
            assert values == {t: "1" for t in targets[job_name]}, job_name
        window = f"{int(time.time() - start) + 1}s"
        ranks = {
            s["metric"]["instance"]: s["value"][1]
            for s in p.series(f'max_over_time(up{{job="{TRAINER_JOB}"}}[{window}])')
        }
        assert ranks == {t: "1" for t in targets[TRAINER_JOB]}
        # (b) every panel of every dashboard
        empty = [
            f"{where}: {expr}" for where, expr in queries if not p.drawn(grafana_to_promql(expr))
        ]
        assert not empty, "panel expressions without data:\n" + "\n".join(empty)
        # (c) every alert: its signals have data, its expression is valid
        for alert in alerts.ALERTS:
            for series in alert.signals if not alert.only_with else ():
                assert p.drawn(series), f"{alert.name}: signal {series!r} returned no data"
            body = p.instant(alert.expr)
            assert body.get("status") == "success", f"{alert.name}: {body.get('error')}"
        # (d) a healthy job, the idle pool, and a second job stopped mid-way: no alert fired
        # (a stop is no group death, restart or failed checkpoint)
        api = ApiClient(state["api_url"], token)
        try:
            second = api.create_job(another_job(api.job(state["job_id"])["spec"], "stopped"))["id"]
            api.action(second, "start")
            wait_for("a pass of the second job", lambda: api.job(second)["passes_done"] > 0, 60, up)
            api.action(second, "stop")
            wait_for(
                "the second job stopped", lambda: api.job(second)["state"] == "stopped", 60, up
            )
        finally:
            api.close()
        time.sleep(3)  # a few scrapes and rule evaluations (1 s) after the stop
        firing = p.drawn('ALERTS{alertstate="firing"}')
        assert not firing, f"alerts fired in a healthy stack: {[f['metric'] for f in firing]}"
        # (e) injected faults fire their alerts (the QUICK ones with short waits). Data that
        # stops arriving: a job whose next split never lands (the wait is probed every 30 s,
        # data_gauges.py: 0 at the start, then past 5 s).
        state = read_state(run) or state
        quick(run, state)
        api = ApiClient(state["api_url"], token)
        try:
            spec = api.job(state["job_id"])["spec"]
            data = {**spec["data"], "start_day": "20190722", "end_day": "20190722"}
            starved = api.create_job(another_job(spec, "starved", data=data))["id"]
            api.action(starved, "start")
            wait_firing(p, "StreamRecDataNotArriving", up, f', job_id="{starved}"')
            api.action(starved, "stop")
        finally:
            api.close()
        for child, alert in (
            ("redis", "StreamRecRedisUnreachable"),  # the control plane's, not the serving one
            ("store-0", "StreamRecTargetDown"),
        ):
            pid = state["children"][child]["pid"]
            os.kill(pid, signal.SIGSTOP)  # hung, not dead: the launcher restarts no one
            try:
                wait_firing(p, alert, up)
            finally:
                os.kill(pid, signal.SIGCONT)
        # (f) a group that keeps dying on its pass (its rank killed three times): the
        # restarts make StreamRecTrainerGroupRestarting fire (its `for` is 0)
        crash_loop(state, token, run, up, p)
    finally:
        if prom is not None:
            prom.http.close()
        recorded = read_state(run) or {}
        down = spawn(
            [bin_path("streamrec"), "down", "--run-dir", str(run)], log=tmp_path / "down.log"
        )
        try:
            assert down.wait(timeout=90) == 0
            assert up.proc.wait(timeout=60) is not None
        finally:
            stop_process(down, timeout_s=5)
            stop_process(up.proc, timeout_s=30)
    pids = [c["pid"] for c in (recorded.get("children") or {}).values()]
    assert pids and not [pid for pid in pids if pid_alive(pid)], "children left running"
    assert read_state(run) is None
    assert not os.path.exists(run / "stack.json")
