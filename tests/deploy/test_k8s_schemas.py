"""Every Kubernetes object this repository ships, validated offline against the Kubernetes 1.37 schemas (strict: no
unknown fields) that the kubernetes-validate package vendors: deploy/k8s as it is, and the GPU-cluster overlay
deploy/k8s-gpu as kustomize renders it (tests/deploy/kustomize_lite.py). Then what the schemas cannot see: the
overlay's clusters, budgets, volumes, secrets, probes and the dashboard's metric names."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.kustomize_lite import build
from tests.deploy.topology import COMPOSE_DIR, K8S_DIR, REPO

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (test extra)")

K8S_VERSION = "1.37.0"
GPU_DIR = REPO / "deploy" / "k8s-gpu"
EXTERNAL_SECRET = "pdrelay-tls"  # made from `pdrelay certs` at deploy time (deploy/k8s-gpu/kustomization.yaml)
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")


def _validate(doc: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = "/".join(str(p) for p in e.path)
        raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']}: {where}: {e.message}") from None


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return build(K8S_DIR)


@pytest.fixture(scope="module")
def gpu() -> list[dict[str, Any]]:
    return build(GPU_DIR)


def _by(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_base_manifests_match_the_kubernetes_schemas(base: list[dict[str, Any]]) -> None:
    assert len(base) >= 15
    for doc in base:
        _validate(doc)


def test_gpu_overlay_matches_the_kubernetes_schemas(gpu: list[dict[str, Any]]) -> None:
    kinds = {d["kind"] for d in gpu}
    assert {"PodDisruptionBudget", "PersistentVolumeClaim", "Role", "RoleBinding"} <= kinds
    for doc in gpu:
        _validate(doc)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed (its kustomize is the reference)")
@pytest.mark.parametrize("root", [K8S_DIR, GPU_DIR], ids=["k8s", "k8s-gpu"])
def test_kustomize_renders_the_same_objects_and_they_validate(root: Path) -> None:
    """kubectl's own kustomize agrees with kustomize_lite on what the directory makes, and its output validates."""
    import yaml

    res = subprocess.run(["kubectl", "kustomize", str(root)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    rendered = [d for d in yaml.safe_load_all(res.stdout) if d]
    lite = {(d["kind"], d["metadata"]["name"]) for d in build(root)}
    # generated ConfigMaps get a content hash appended to their name
    made = {(d["kind"], re.sub(r"-[a-z0-9]{10}$", "", d["metadata"]["name"])) for d in rendered}
    assert made == lite and len(rendered) == len(lite)
    for doc in rendered:
        _validate(doc)


def test_the_validator_catches_a_wrong_field() -> None:
    bad = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "dataa": {}}
    with pytest.raises(AssertionError, match="dataa"):
        _validate(bad)


def test_gpu_overlay_control_plane_is_three_members_over_tls(gpu: list[dict[str, Any]]) -> None:
    sts = _by(gpu, "StatefulSet")
    etcd, nats = sts["etcd"], sts["nats"]
    assert etcd["spec"]["replicas"] == 3 and nats["spec"]["replicas"] == 3
    etcd_cmd = " ".join(etcd["spec"]["template"]["spec"]["containers"][0]["command"])
    assert "etcd-2=https://etcd-2.etcd:2380" in etcd_cmd and "--client-cert-auth" in etcd_cmd
    nats_args = nats["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--tlsverify" in nats_args and any("nats-2.nats-cluster:6222" in a for a in nats_args)
    config = _by(gpu, "ConfigMap")["pdrelay-config"]["data"]
    assert config["PDRELAY_ETCD_ENDPOINTS"].count("https://") == 3 and config["PDRELAY_NATS_URL"].startswith("tls://")


def _pods(gpu: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(d["metadata"]["name"], d["spec"]["template"]) for d in gpu if d["kind"] in WORKLOADS]


def test_every_budget_selects_pods_and_every_volume_exists(gpu: list[dict[str, Any]]) -> None:
    pods = _pods(gpu)
    for name, pdb in _by(gpu, "PodDisruptionBudget").items():
        want = pdb["spec"]["selector"]["matchLabels"]
        assert any(want.items() <= t["metadata"]["labels"].items() for _, t in pods), f"PDB {name} selects no pod"
    maps, claims = _by(gpu, "ConfigMap"), _by(gpu, "PersistentVolumeClaim")
    secrets = {*_by(gpu, "Secret"), EXTERNAL_SECRET}
    for name, t in pods:
        for v in t["spec"].get("volumes", ()):
            if "configMap" in v:
                assert v["configMap"]["name"] in maps, (name, v)
            if "secret" in v:
                assert v["secret"]["secretName"] in secrets, (name, v)
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims, (name, v)


def test_engines_get_gpu_rdma_the_model_volume_tls_and_drain_time(gpu: list[dict[str, Any]]) -> None:
    deployments = _by(gpu, "Deployment")
    for role in ("prefill", "decode"):
        spec = deployments[role]["spec"]["template"]["spec"]
        c = spec["containers"][0]
        limits = c["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == 1 and limits["rdma/rdma_shared_device_a"] == 1
        assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]
        assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/models", "/tls"}
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["PDRELAY_TLS_CERTFILE"] == f"/tls/{role}.pem" and env["UCX_TLS"].startswith("rc")
        # the preStop pause and a drain with hand-offs in flight fit the grace period
        assert spec["terminationGracePeriodSeconds"] >= 30 + c["lifecycle"]["preStop"]["sleep"]["seconds"]
    for role in ("gateway", "encoder", "kvstore"):
        env = {e["name"]: e.get("value") for e in deployments[role]["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["PDRELAY_TLS_CERTFILE"] == f"/tls/{role}.pem", role


def test_the_dashboard_asks_for_metrics_the_services_export() -> None:
    defined = set()
    for path in [*(REPO / "services").rglob("*.py"), *(REPO / "shared").rglob("*.py")]:
        defined |= set(re.findall(r'"(pdrelay:[a-z0-9_]+)"', path.read_text()))
    dash = json.loads((GPU_DIR / "monitoring" / "pdrelay-dashboard.json").read_text())
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for needed in ("first token", "inter-token", "hand-off", "kvstore", "planner"):
        assert needed in titles, needed
    for panel in dash["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"pdrelay:[a-z0-9_]+", target["expr"]):
                base = re.sub(r"_(bucket|count|sum|total)$", "", name)
                assert name in defined or base in defined, f"{panel['title']}: {name} is exported by no service"


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose (Debian) is not installed")
def test_compose_monitoring_overlay_is_valid() -> None:
    files = ["-f", str(COMPOSE_DIR / "docker-compose.yml"), "-f", str(COMPOSE_DIR / "docker-compose.monitoring.yml")]
    r = subprocess.run(["docker-compose", *files, "config"], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert "grafana" in r.stdout and "prometheus" in r.stdout
    for mounted in ("grafana-datasource.yml", "grafana-dashboards.yml", "pdrelay-dashboard.json"):
        assert (GPU_DIR / "monitoring" / mounted).exists()
    assert Path(COMPOSE_DIR / "prometheus.yml").exists()
