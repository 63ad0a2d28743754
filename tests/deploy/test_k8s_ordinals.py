"""The Kubernetes counts trap, guarded at run time: a user's kustomization that sets
``replicas:`` itself (without components/counts after it) renders pods whose ordinal is not
below the counts in their flags. Such a trainer pod (``WORLD_SIZE``) or store pod
(``--num-shards``) exits at once saying so, naming components/counts; the pods that fit start.

The pods' commands are the rendered ones, run as processes with the env the kubelet would give
them (the downward API's pod index, the ConfigMaps' keys, the CPU limit), as in
``test_manifests_run.py``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_overlays import single_rank_pool
from streamrec.process import bin_path
from streamrec.trainer.agent.pod_entry import ordinal_problem

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(bin_path("streamrec-api")).parent
COUNTS = "components/counts"


def render(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl") or shutil.which("kubectl", path=str(ROOT / ".venv" / "bin"))
    if kubectl is None:
        pytest.fail("kubectl (>= 1.32, with kustomize) must be on PATH to render deploy/k8s")
    out = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def trap_overlay(tmp: Path, shards: int, trainers: int) -> Path:
    """A user's overlay over cpu-dev (1 shard, 1 rank) setting ``replicas:`` in its own
    Kustomization: the counts component of cpu-dev ran before, so the flags keep 1 and 1."""
    (tmp / "streamrec").symlink_to(ROOT)
    mine = tmp / "my-cluster"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["../streamrec/deploy/k8s/overlays/cpu-dev"],
                "replicas": [
                    {"name": "embedding-store", "count": shards},
                    {"name": "trainer", "count": trainers},
                ],
            }
        )
    )
    return mine


def pod_command(docs: list[dict[str, Any]], name: str, ordinal: int) -> tuple[list[str], dict]:
    """The command line and env of pod ``name-ordinal`` of StatefulSet ``name``."""
    (workload,) = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == name]
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    configs = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    env: dict[str, str] = {"HOSTNAME": f"{name}-{ordinal}"}
    for e in c.get("env", []):
        ref = e.get("valueFrom", {})
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "fieldRef" in ref:
            field = ref["fieldRef"]["fieldPath"]
            env[e["name"]] = {
                "metadata.name": f"{name}-{ordinal}",
                "metadata.labels['apps.kubernetes.io/pod-index']": str(ordinal),
            }[field]
        elif "configMapKeyRef" in ref:
            env[e["name"]] = configs[ref["configMapKeyRef"]["name"]][ref["configMapKeyRef"]["key"]]
        elif "resourceFieldRef" in ref:
            env[e["name"]] = "1"
    words = [*c.get("command", []), *c.get("args", [])]
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], w) for w in words], env


def run_pod(args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    program = shutil.which(args[0], path=str(VENV_BIN))
    assert program, f"{args[0]} is not in {VENV_BIN}"
    t0 = time.monotonic()
    done = subprocess.run(
        [program, *args[1:]],
        env={"PATH": f"{VENV_BIN}:/usr/bin:/bin", "LANG": "C.UTF-8", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, time.monotonic() - t0


@pytest.fixture(scope="module")
def trap(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return render(trap_overlay(tmp_path_factory.mktemp("trap"), shards=3, trainers=3))


def test_the_trap_renders_counts_that_do_not_follow_the_replicas(trap) -> None:
    """The premise: 3 replicas each, the flags still 1 (what the guards are for)."""
    for name, count_env in (("trainer", "WORLD_SIZE"), ("embedding-store", "NUM_SHARDS")):
        (w,) = [d for d in trap if d["kind"] == "StatefulSet" and d["metadata"]["name"] == name]
        assert w["spec"]["replicas"] == 3
        _, env = pod_command(trap, name, 0)
        assert env[count_env] == "1"


@pytest.mark.timeout(120)
def test_a_trainer_pod_past_world_size_exits_at_once_naming_the_counts_component(trap) -> None:
    args, env = pod_command(trap, "trainer", 2)
    assert args[:3] == ["python3", "-m", "streamrec.trainer.agent.pod_entry"], args
    done, seconds = run_pod(args, env)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "ordinal 2 is not below WORLD_SIZE 1" in done.stderr, done.stderr
    assert COUNTS in done.stderr and "trainer-2" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # a message, no traceback
    assert seconds < 30


def test_trainer_pods_inside_the_group_pass_the_check(trap, tmp_path) -> None:
    """Pod 0 of the trap, and pod 5 of single-rank groups (each pod its own group of one),
    would start torchrun: the check passes them."""
    _, env = pod_command(trap, "trainer", 0)
    assert ordinal_problem(env) is None
    pool = render(single_rank_pool(tmp_path, 6))
    _, env = pod_command(pool, "trainer", 5)
    assert (env["GROUP_POD_INDEX"], env["WORLD_SIZE"]) == ("0", "1")
    assert ordinal_problem(env) is None
    assert "GROUP_POD_INDEX" in (ordinal_problem({"WORLD_SIZE": "1"}) or "")


@pytest.mark.timeout(120)
def test_a_store_pod_past_num_shards_exits_at_once_naming_the_counts_component(trap) -> None:
    args, env = pod_command(trap, "embedding-store", 2)
    assert args[0] == "streamrec-embedding-store" and "--num-shards" in args
    done, seconds = run_pod(args, env)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "--shard-id 2 is not below --num-shards 1" in done.stderr, done.stderr
    assert COUNTS in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert seconds < 30
