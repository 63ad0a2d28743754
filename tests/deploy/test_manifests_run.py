"""The cpu-dev manifests run as local processes, and a job started over REST alone succeeds.

The closest check to a cluster that runs here: ``kubectl kustomize deploy/k8s/overlays/cpu-dev``
is rendered and every container of every workload is started as a process with exactly the
command, args and env the manifests give it. What a cluster would provide is mapped, not
rewritten by hand:

- each pod gets its own loopback address, ``127.<workload>.<ordinal>.1``, so every
  container keeps the ports its manifest names; cluster DNS names (a StatefulSet pod's
  ``<name>-<K>.<service>``, a Service's name, the API's ``{shard}`` endpoint template) map
  to those addresses, and a bind to ``0.0.0.0`` to the pod's own;
- volumes map to directories: a claim to one directory every pod mounting it shares, an
  ``emptyDir`` to one per pod, a Secret or ConfigMap to its items written as files;
- the downward API: a pod's name and ``apps.kubernetes.io/pod-index`` (its ordinal), and
  ``resourceFieldRef`` of the CPU limit (rounded up, as the kubelet does with divisor 1).

Then the README's steps: the demo stream is written to the data volume, a job is created
and started with two REST calls, and it must succeed on the trainer pool, whose group then
goes back to the pool (its process keeps running). A second layout, the README's overlay of
one's own over cpu-dev with two trainer pods of one rank each
(``components/single-rank-groups``), runs two jobs at once on the two groups of the pool.
A flag, a port, a path or an env variable on which the manifests and the code disagree
fails here.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_overlays import single_rank_pool
from servers import wait_for
from streamrec.process import bin_path, spawn, stop_process

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "deploy" / "k8s" / "overlays" / "cpu-dev"
WORKLOADS = ("StatefulSet", "Deployment", "DaemonSet")
VENV_BIN = Path(bin_path("streamrec-api")).parent
JOB_TIMEOUT_S = 420.0


def render(overlay: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl") or shutil.which("kubectl", path=str(ROOT / ".venv" / "bin"))
    if kubectl is None:
        pytest.fail("kubectl (>= 1.32, with kustomize) must be on PATH to render deploy/k8s")
    out = subprocess.run(
        [kubectl, "kustomize", str(overlay)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def cpu_cores(quantity: str) -> int:
    """A CPU quantity ("2", "500m") in whole cores, rounded up (resourceFieldRef, divisor 1)."""
    value = float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)
    return max(1, math.ceil(value))


@dataclass
class Pod:
    """One replica of a workload's pod template, as a local process."""

    name: str
    ordinal: int
    ip: str
    workload: dict[str, Any]
    mounts: dict[str, Path] = field(default_factory=dict)  # mountPath -> local directory
    proc: subprocess.Popen | None = None

    @property
    def container(self) -> dict[str, Any]:
        (only,) = self.workload["spec"]["template"]["spec"]["containers"]
        return only

    def port(self, name: str) -> int:
        return next(p["containerPort"] for p in self.container["ports"] if p["name"] == name)


class Cluster:
    """The rendered objects, the pods they make, and the name and path mapping above.

    Args:
        docs: the rendered manifests.
        root: where volumes and logs go.
    """

    def __init__(self, docs: list[dict[str, Any]], root: Path) -> None:
        self.docs = docs
        self.root = root
        self.config = {
            d["metadata"]["name"]: dict(d.get("data") or {}) for d in self.of("ConfigMap")
        }
        self.secrets = {
            d["metadata"]["name"]: {
                k: base64.b64decode(v).decode() for k, v in (d.get("data") or {}).items()
            }
            for d in self.of("Secret")
        }
        self.pods: list[Pod] = []
        self.hosts: dict[str, str] = {}
        workloads = [w for kind in WORKLOADS for w in self.of(kind)]
        for k, w in enumerate(sorted(workloads, key=lambda w: w["metadata"]["name"]), start=1):
            name = w["metadata"]["name"]
            replicas = 1 if w["kind"] == "DaemonSet" else int(w["spec"].get("replicas", 1))
            for ordinal in range(replicas):
                pod = Pod(f"{name}-{ordinal}", ordinal, f"127.{k}.{ordinal}.1", w)
                self.pods.append(pod)
                if w["kind"] == "StatefulSet":
                    self.hosts[f"{name}-{ordinal}.{w['spec']['serviceName']}"] = pod.ip
            if w["kind"] == "StatefulSet":  # the API's endpoint template
                self.hosts[f"{name}-{{shard}}.{w['spec']['serviceName']}"] = f"127.{k}.{{shard}}.1"
        for svc in self.of("Service"):
            selector = svc["spec"]["selector"]
            pod = next(
                p
                for p in self.pods
                if selector.items() <= p.workload["spec"]["template"]["metadata"]["labels"].items()
            )
            self.hosts[svc["metadata"]["name"]] = pod.ip
        #: mountPath -> directory of the claims every pod mounting them shares
        self.shared: dict[str, Path] = {}
        for pod in self.pods:
            self._volumes(pod)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def pod(self, name: str) -> Pod:
        return next(p for p in self.pods if p.name == name)

    def _volumes(self, pod: Pod) -> None:
        spec = pod.workload["spec"]["template"]["spec"]
        claims = {
            t["metadata"]["name"] for t in pod.workload["spec"].get("volumeClaimTemplates", [])
        }
        sources = {v["name"]: v for v in spec.get("volumes", [])}
        for mount in pod.container.get("volumeMounts", []):
            name = mount["name"]
            source = sources.get(name, {})
            if name in claims:
                path = self.root / "pvc" / f"{name}-{pod.name}"
            elif "persistentVolumeClaim" in source:
                path = self.root / "pvc" / source["persistentVolumeClaim"]["claimName"]
                assert self.shared.setdefault(mount["mountPath"], path) == path, mount
            else:
                path = self.root / "pods" / pod.name / name
            path.mkdir(parents=True, exist_ok=True)
            for kind, ref, data in (
                ("secret", "secretName", self.secrets),
                ("configMap", "name", self.config),
            ):
                if kind in source:
                    values = data[source[kind][ref]]
                    for item in source[kind].get("items") or [
                        {"key": k, "path": k} for k in values
                    ]:
                        (path / item["path"]).write_text(values[item["key"]])
            pod.mounts[mount["mountPath"]] = path

    def env(self, pod: Pod) -> dict[str, str]:
        """The container's environment as the kubelet builds it (envFrom, then env)."""
        c = pod.container
        env: dict[str, str] = {}
        for source in c.get("envFrom", []):
            env.update(self.config[source["configMapRef"]["name"]])
        limits = c.get("resources", {}).get("limits", {})
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], e["value"])
                continue
            ref = e["valueFrom"]
            if "fieldRef" in ref:
                path = ref["fieldRef"]["fieldPath"]
                fields = {
                    "metadata.name": pod.name,
                    "metadata.namespace": "streamrec",
                    "metadata.labels['apps.kubernetes.io/pod-index']": str(pod.ordinal),
                }
                env[e["name"]] = fields[path]
            elif "configMapKeyRef" in ref:
                env[e["name"]] = self.config[ref["configMapKeyRef"]["name"]][
                    ref["configMapKeyRef"]["key"]
                ]
            elif "secretKeyRef" in ref:
                env[e["name"]] = self.secrets[ref["secretKeyRef"]["name"]][
                    ref["secretKeyRef"]["key"]
                ]
            elif "resourceFieldRef" in ref:
                resource = ref["resourceFieldRef"]["resource"]
                assert resource == "limits.cpu", resource
                assert str(ref["resourceFieldRef"].get("divisor", "1")) == "1"
                env[e["name"]] = str(cpu_cores(str(limits["cpu"])))
            else:
                raise AssertionError(f"{pod.name}: env {e['name']} from {ref}")
        return {k: self.local(pod, v) for k, v in env.items()}

    def local(self, pod: Pod, value: str) -> str:
        """``value`` with the cluster's names, binds and mount paths mapped for ``pod``."""
        # the pod's own mounts, then the shared claims' paths, the same in every pod (the
        # API names /models as a root without mounting it)
        mounts = {**self.shared, **pod.mounts}
        for mount_path in sorted(mounts, key=len, reverse=True):
            if value == mount_path or value.startswith(mount_path + "/"):
                value = str(mounts[mount_path]) + value[len(mount_path) :]
                break
        if value == "0.0.0.0":
            return pod.ip
        return self.resolve(value, pod.ip)

    def resolve(self, value: str, own_ip: str = "") -> str:
        """Host names before a ``:port`` (at the start or after ``//``) as the cluster's DNS
        would answer them; ``0.0.0.0`` (a bind) as the pod's own address."""

        def host(m: re.Match[str]) -> str:
            name = m.group(2)
            if name == "localhost":  # the pod's own: no cluster name
                return m.group(0)
            # mapped already (env expanded in args; a {shard} template's too)
            if re.fullmatch(r"127(\.(\d+|\{shard\})){3}", name):
                return m.group(0)
            ip = own_ip if name == "0.0.0.0" and own_ip else self.hosts.get(name)
            assert ip is not None, f"no cluster name {name!r} (in {value!r})"
            return m.group(1) + ip

        return re.sub(r"(^|//)([A-Za-z0-9{}._-]+)(?=:\d)", host, value)

    def command(self, pod: Pod, env: dict[str, str]) -> list[str]:
        c = pod.container
        words = [*c.get("command", []), *c.get("args", [])]
        expanded = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], w) for w in words]
        return [self.local(pod, w) for w in expanded]

    def start(self, pod: Pod) -> None:
        env = self.env(pod)
        args = self.command(pod, env)
        path = shutil.which(args[0], path=f"{VENV_BIN}{os.pathsep}/usr/bin{os.pathsep}/bin")
        assert path, f"{pod.name}: {args[0]} is not installed"
        base = {"PATH": f"{VENV_BIN}{os.pathsep}/usr/bin{os.pathsep}/bin", "LANG": "C.UTF-8"}
        pod.proc = spawn(
            [path, *args[1:]], log=self.root / "logs" / f"{pod.name}.log", env={**base, **env}
        )

    def logs(self) -> str:
        out = []
        for pod in self.pods:
            log = self.root / "logs" / f"{pod.name}.log"
            text = log.read_text(errors="replace") if log.exists() else ""
            out.append(f"--- {pod.name} ({pod.proc and pod.proc.poll()}):\n" + text[-3000:])
        return "\n".join(out)


def http(method: str, url: str, token: str = "", body: dict | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            text = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as e:
        text, status = e.read().decode(), e.code
    except OSError:
        return 0, None
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def wait_until(what: str, check: Any, timeout_s: float, cluster: Cluster) -> Any:
    """``check``'s truthy value within ``timeout_s``; fails at once when a pod exited."""

    def exited() -> str | None:
        dead = [p.name for p in cluster.pods if p.proc is not None and p.proc.poll() is not None]
        return f"exited: {dead}" if dead else None

    return wait_for(check, timeout_s, 0.5, what=what, gone=exited, detail=cluster.logs)


def job_body(name: str, data: Path, models: Path, endpoint: str) -> dict[str, Any]:
    """The README's cpu-dev job: the demo stream, one endpoint, host tier, one CPU rank."""
    return {
        "name": name,
        "data": {
            "train_data_dir": str(data / "ctr"),
            "start_day": "20190720",
            "end_day": "20190720",
            "split_interval": 360,
            "split_per_pass": 1,
            "data_donefile": "to.hadoop.done",
            "data_format": "generated",
        },
        "checkpoint": {"model_save_path": str(models / name), "checkpoint_per_pass": 1},
        "model": {"hyper_parameters": {"sparse_inputs_slots": 26, "arch_sparse_feature_size": 16}},
        "store": {"endpoints": [endpoint], "tier": "host"},
        "resources": {"trainer_ranks": 1, "device": "cpu"},
    }


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["cpu-dev", "single-rank-pool"])
def test_manifests_run_jobs_started_over_rest(tmp_path: Path, layout: str) -> None:
    """cpu-dev as it is: one group, one job. With single-rank groups and two trainer pods:
    two groups in the pool, two jobs at once."""
    overlay = OVERLAY if layout == "cpu-dev" else single_rank_pool(tmp_path, trainers=2)
    cluster = Cluster(render(overlay), tmp_path / "cluster")
    trainers = [p for p in cluster.pods if p.name.startswith("trainer-")]
    jobs = ["ctr"] if layout == "cpu-dev" else ["ctr-a", "ctr-b"]
    assert len(trainers) == len(jobs)
    assert {p.name for p in cluster.pods} == {
        "api-0",
        "embedding-store-0",
        "redis-0",
        "serving-redis-0",
        "sampler-0",
        *(p.name for p in trainers),
    }
    try:
        for pod in cluster.pods:  # all at once, as a cluster starts them
            cluster.start(pod)
        api = cluster.pod("api-0")
        base = f"http://{api.ip}:{api.port('http')}"
        (token,) = [v["api-token"] for v in cluster.secrets.values() if "api-token" in v]
        wait_until("the API ready", lambda: http("GET", f"{base}/readyz")[0] == 200, 90, cluster)
        # every scrape target answers on the port its monitor names
        for pod in cluster.pods:
            ports = {p["name"]: p["containerPort"] for p in pod.container.get("ports", [])}
            port = ports.get("metrics") or (ports.get("http") if pod.name == "api-0" else None)
            if port:
                url = f"http://{pod.ip}:{port}/metrics"
                wait_until(
                    f"{pod.name} /metrics", lambda u=url: http("GET", u)[0] == 200, 120, cluster
                )
        idle = f'streamrec_api_pool_groups{{state="idle"}} {float(len(trainers))}'
        wait_until(
            "every group idle in the pool",
            lambda: idle in str(http("GET", f"{base}/metrics")[1]),
            120,
            cluster,
        )

        # the README's demo stream (cpu-dev: one file per split) on the data volume
        data = trainers[0].mounts["/data"]
        models = trainers[0].mounts["/models"]
        subprocess.run(
            [bin_path("streamrec-datagen"), "--out", str(data / "ctr"), "--start-day", "20190720"]
            + ["--days", "1", "--split-interval", "360", "--samples-per-split", "400"]
            + ["--files-per-split", "1"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        endpoint = cluster.resolve("tcp://embedding-store-0.embedding-store:5555")
        ids = []
        for name in jobs:  # REST calls only: create, start
            status, job = http(
                "POST", f"{base}/v1/jobs", token, job_body(name, data, models, endpoint)
            )
            assert status == 201, job
            status, started = http("POST", f"{base}/v1/jobs/{job['id']}/start", token)
            assert status == 200, started
            ids.append(job["id"])

        def all_succeeded() -> bool:
            states = []
            for job_id in ids:
                code, body = http("GET", f"{base}/v1/jobs/{job_id}", token)
                assert code == 200, body
                assert body["state"] not in ("failed", "stopped"), body
                states.append(body["state"])
            return all(s == "succeeded" for s in states)

        wait_until("every job succeeded", all_succeeded, JOB_TIMEOUT_S, cluster)
        for job_id in ids:
            _, passes = http("GET", f"{base}/v1/jobs/{job_id}/passes", token)
            assert [p["state"] for p in passes["data"]] == ["done"] * 4, passes
        # the groups went back to the pool: their processes run on, idle
        for pod in trainers:
            assert pod.proc is not None and pod.proc.poll() is None, cluster.logs()
        wait_until(
            "every group idle in the pool again",
            lambda: idle in str(http("GET", f"{base}/metrics")[1]),
            60,
            cluster,
        )
    finally:
        for pod in reversed(cluster.pods):
            if pod.proc is not None:
                stop_process(pod.proc, timeout_s=20)
