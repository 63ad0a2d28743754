"""``streamrec up`` gives every service a /metrics port, records them in stack.json, and writes
a Prometheus config (checked by promtool) scraping them with the alert rules."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from streamrec.launcher import commands, prometheus
from streamrec.launcher.__main__ import build_parser, check_args
from streamrec.launcher.errors import StackError
from streamrec.launcher.stack import Stack, free_port_run
from streamrec.launcher.state import read_state

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def flag_values(cmd: list[str], flag: str) -> list[str]:
    return [cmd[i + 1] for i, arg in enumerate(cmd) if arg == flag]


def stack(tmp_path: Path, *flags: str) -> Stack:
    args = build_parser().parse_args(["up", "--run-dir", str(tmp_path / "run"), *flags])
    check_args(args)
    return Stack(args)


def test_every_service_gets_a_metrics_port_recorded_in_stack_json(tmp_path: Path) -> None:
    s = stack(tmp_path, "--store-shards", "3", "--trainers", "2", "--trainer-groups", "2")
    s.prepare()
    s.record()
    recorded = read_state(s.run)
    assert recorded is not None
    targets = recorded["metrics"]
    assert set(targets) == set(prometheus.JOBS)
    assert targets[prometheus.API_JOB] == [f"127.0.0.1:{s.api_port}"]
    assert len(targets[prometheus.STORE_JOB]) == 3
    # each group's ranks on consecutive ports from its own base
    assert targets[prometheus.TRAINER_JOB] == [
        f"127.0.0.1:{base + r}" for base in s.trainer_metrics_ports for r in range(2)
    ]
    ports = [int(h.rsplit(":", 1)[1]) for hosts in targets.values() for h in hosts]
    assert len(set(ports)) == len(ports) == 1 + 3 + 1 + 2 * 2
    assert recorded["prometheus_url"] is None  # no --prometheus
    for group, base in zip(s.groups, s.trainer_metrics_ports, strict=True):
        assert flag_values(s.trainer_args(group), "--metrics-port") == [str(base)]


def test_commands_carry_metrics_ports_and_the_ssd_tier(tmp_path: Path) -> None:
    token = tmp_path / "peer-token"
    store = commands.store_command(
        1,
        2,
        "tcp://127.0.0.1:1",
        tmp_path / "t.json",
        tmp_path / "models",
        token,
        metrics_port=9100,
        tier="ssd",
        persistent_path=tmp_path / "store",
        cache_budget_mb=0.5,
    )
    assert flag_values(store, "--metrics-port") == ["9100"]
    assert flag_values(store, "--tier") == ["ssd"]
    assert flag_values(store, "--persistent-path") == [str(tmp_path / "store")]
    assert flag_values(store, "--cache-budget-mb") == ["0.5"]
    assert flag_values(store, "--capacity") == [str(commands.SSD_CAPACITY)]
    host = commands.store_command(0, 1, "tcp://x:1", tmp_path, tmp_path, token)
    assert flag_values(host, "--tier") == ["host"] and "--metrics-port" not in host
    sampler = commands.sampler_command("ipc:///x.sock", token, 9101)
    assert flag_values(sampler, "--metrics-port") == ["9101"]
    trainers = commands.trainer_command(2, "redis://x", "job", 9200)
    assert flag_values(trainers, "--metrics-port") == ["9200"]


def test_the_ssd_tier_reaches_the_job_and_the_cache_flag_needs_it(tmp_path: Path) -> None:
    from streamrec.launcher.job import job_spec

    s = stack(tmp_path, "--store-tier", "ssd", "--cache-budget-mb", "2")
    assert job_spec(s.args, s.run, s.store_endpoints)["store"]["tier"] == "ssd"
    args = build_parser().parse_args(["up", "--cache-budget-mb", "2"])
    with pytest.raises(StackError, match="--cache-budget-mb applies to --store-tier ssd only"):
        check_args(args)
    args = build_parser().parse_args(["up", "--store-tier", "ssd", "--cache-budget-mb", "0"])
    with pytest.raises(StackError, match="--cache-budget-mb must be > 0"):
        check_args(args)


def test_the_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    targets = {
        prometheus.API_JOB: ["127.0.0.1:1"],
        prometheus.STORE_JOB: ["127.0.0.1:2", "127.0.0.1:3"],
        prometheus.SAMPLER_JOB: ["127.0.0.1:4"],
        prometheus.TRAINER_JOB: ["127.0.0.1:5"],
    }
    config = prometheus.write_files(tmp_path / "prometheus", targets)
    loaded = yaml.safe_load(config.read_text())
    assert loaded["global"] == {"scrape_interval": "1s", "evaluation_interval": "1s"}
    assert loaded["rule_files"] == [prometheus.RULES_FILE]
    assert {j["job_name"]: j["static_configs"][0]["targets"] for j in loaded["scrape_configs"]} == (
        targets
    )
    rules = yaml.safe_load((tmp_path / "prometheus" / prometheus.RULES_FILE).read_text())
    assert rules["groups"] and all(g["rules"] for g in rules["groups"])
    # the config and the rules file it names, checked by Prometheus's own tool
    done = subprocess.run(
        [PROMTOOL, "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_missing_prometheus_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prometheus.shutil, "which", lambda _name: None)
    monkeypatch.setattr(prometheus.Path, "is_file", lambda _self: False)
    with pytest.raises(StackError, match="apt-get install prometheus"):
        commands.prometheus_command(tmp_path / "p.yml", tmp_path / "data", 9090)


def test_free_port_run_gives_consecutive_free_ports() -> None:
    import socket

    base = free_port_run(3)
    for port in range(base, base + 3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
