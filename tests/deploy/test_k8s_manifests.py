"""deploy/k8s: manifests parse, hang together (selectors, Services, ConfigMaps, probes), use only what the compose
definition declares (images, ports, environment), and every pdrelay container resolves through the real config."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from shared.config import PassContext, resolve
from shared.config.catalog import all_specs, role_specs
from tests.deploy.topology import (
    COMPOSE_FILE,
    K8S_DIR,
    compose_launches,
    compose_ports,
    config_maps,
    k8s_documents,
    k8s_files,
    k8s_launches,
    load_compose,
    workloads,
)


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return k8s_documents()


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose(COMPOSE_FILE)


def _containers(docs):
    for w in workloads(docs):
        for c in w["spec"]["template"]["spec"]["containers"]:
            yield w, c


def _compose_service_for(compose, role: str) -> Mapping[str, Any]:
    names = [launch.where.split(":", 1)[1] for launch in compose_launches(compose) if launch.role == role]
    assert names, f"the compose file runs no {role} service"
    return compose["services"][names[0]]


def _port_number(container: Mapping[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}
    assert port in named, f"container {container['name']} has no port named {port!r}"
    return int(named[port])


# -- structure ------------------------------------------------------------------------------------------------------
def test_every_file_parses_and_is_listed_in_the_kustomization(docs):
    assert docs
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), doc
        assert doc["metadata"].get("name"), doc
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in k8s_files())


def test_one_namespace(docs):
    spaces = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    assert len(spaces) == 1
    (space,) = spaces
    for d in docs:
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") == space, f"{d['kind']}/{d['metadata']['name']}"


def test_selectors_match_their_pod_templates(docs):
    for w in workloads(docs):
        want = w["spec"]["selector"]["matchLabels"]
        have = w["spec"]["template"]["metadata"]["labels"]
        assert want.items() <= have.items(), f"{w['kind']}/{w['metadata']['name']}"


def test_services_select_pods_and_target_their_ports(docs):
    pods = [(w, w["spec"]["template"]["metadata"]["labels"]) for w in workloads(docs)]
    for svc in (d for d in docs if d["kind"] == "Service"):
        selected = [w for w, labels in pods if svc["spec"]["selector"].items() <= labels.items()]
        assert len(selected) == 1, f"Service {svc['metadata']['name']} selects {len(selected)} workloads"
        containers = selected[0]["spec"]["template"]["spec"]["containers"]
        names = {p["name"] for c in containers for p in c.get("ports", []) if "name" in p}
        numbers = {p["containerPort"] for c in containers for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])  # Kubernetes defaults targetPort to port
            assert target in (names if isinstance(target, str) else numbers), (
                f"Service {svc['metadata']['name']} port {port['port']} targets {target!r}, which no container has"
            )


def test_etcd_and_nats_are_statefulsets_with_storage(docs):
    kinds = {w["metadata"]["name"]: w for w in workloads(docs)}
    for name in ("etcd", "nats"):
        assert kinds[name]["kind"] == "StatefulSet"
        assert kinds[name]["spec"].get("volumeClaimTemplates"), f"{name} keeps its data on a volume"


def test_prefill_and_decode_scale_separately(docs):
    by_role = {launch.role: launch.where for launch in k8s_launches(docs)}
    assert {"gateway", "prefill", "decode", "encoder", "kvstore"} <= set(by_role)
    assert by_role["prefill"].split("/")[1] != by_role["decode"].split("/")[1]
    for launch in k8s_launches(docs):
        kind = launch.where.split(":")[1].split("/")[0]
        assert kind == "Deployment", f"{launch.where}: pdrelay services are stateless Deployments"


# -- same definitions as compose ------------------------------------------------------------------------------------
def test_images_ports_and_env_exist_in_the_compose_definition(docs, compose):
    images = {str(s.get("image")): name for name, s in compose["services"].items()}
    roles = {launch.where: launch for launch in k8s_launches(docs)}
    maps = config_maps(docs)
    for w, c in _containers(docs):
        where = f"k8s:{w['kind']}/{w['metadata']['name']}/{c['name']}"
        assert c["image"] in images, f"{where}: image {c['image']} is not in the compose file"
        if where in roles:  # a pdrelay container: compare with the compose service of its role
            svc = _compose_service_for(compose, roles[where].role)
        else:
            svc = compose["services"][images[c["image"]]]
        ports = {p["containerPort"] for p in c.get("ports", [])}
        assert ports <= compose_ports(svc), f"{where}: ports {sorted(ports - compose_ports(svc))} not in compose"
        env_names = {e["name"] for e in c.get("env", [])}
        for source in c.get("envFrom", []):
            env_names |= set(maps[source["configMapRef"]["name"]])
        compose_env = set(svc.get("environment") or {})
        assert env_names <= compose_env, f"{where}: env {sorted(env_names - compose_env)} not in compose"


def test_configmap_values_equal_the_compose_values(docs, compose):
    """The shared PDRELAY_* settings mean the same in both deployments (the k8s Services carry compose's names)."""
    for name, data in config_maps(docs).items():
        for launch in compose_launches(compose):
            for key, value in data.items():
                if key in launch.env:
                    assert launch.env[key] == value, f"ConfigMap {name}: {key}={value} vs {launch.where}"


def test_service_urls_name_services_in_the_manifests(docs):
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for launch in k8s_launches(docs):
        for var in ("PDRELAY_ETCD_ENDPOINTS", "PDRELAY_NATS_URL", "PDRELAY_OTLP_TRACES_ENDPOINT"):
            for url in launch.env[var].split(","):
                parts = urlsplit(url)
                assert parts.hostname in services, f"{launch.where}: {var}={url} names no Service"
                assert parts.port in {p["port"] for p in services[parts.hostname]["spec"]["ports"]}, url


# -- the real config system -----------------------------------------------------------------------------------------
def test_every_container_resolves_and_its_probes_use_the_resolved_ports(docs):
    conts = {f"k8s:{w['kind']}/{w['metadata']['name']}/{c['name']}": c for w, c in _containers(docs)}
    launches = k8s_launches(docs)
    assert launches
    for launch in launches:
        cfg = resolve(launch.role, list(launch.argv), launch.env, ctx=PassContext())
        own = {s.env: s.key for s in role_specs(launch.role)}
        for var in (v for v in launch.env if v.startswith("PDRELAY_")):  # read_env skips unknown names silently
            assert var in {s.env for s in all_specs()}, f"{launch.where}: {var} is no config field's env twin"
            if var in own:
                assert cfg.provenance[own[var]].source == "env", f"{launch.where}: {var} was not applied"
        assert cfg.grpc.host == "0.0.0.0", f"{launch.where}: pods must bind every interface for probes and peers"
        c = conts[launch.where]
        probes = {k: c[k] for k in ("startupProbe", "livenessProbe", "readinessProbe") if k in c}
        assert {"livenessProbe", "readinessProbe"} <= set(probes), launch.where
        declared = {p["containerPort"] for p in c.get("ports", [])}
        for kind, probe in probes.items():
            if launch.role == "gateway":
                assert "httpGet" in probe, f"{launch.where} {kind}"
                assert _port_number(c, probe["httpGet"]["port"]) == cfg.http.port, f"{launch.where} {kind}"
                assert probe["httpGet"]["path"] in ("/health", "/ready")
            else:
                assert probe.get("grpc", {}).get("port") == cfg.grpc.grpc_port, f"{launch.where} {kind}"
        assert cfg.grpc.grpc_port in declared
        if cfg.telemetry.metrics_port:
            assert cfg.telemetry.metrics_port in declared, launch.where
    gateway = next(conts[x.where] for x in launches if x.role == "gateway")
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/health"


def test_pods_run_as_the_image_user(docs):
    from tests.deploy.topology import dockerfile_instructions

    uid_args = [rest for word, rest in dockerfile_instructions() if word == "ARG" and rest.startswith("PDRELAY_UID=")]
    assert uid_args, "the Dockerfile declares ARG PDRELAY_UID=<uid>"
    uid = int(uid_args[0].split("=", 1)[1])
    for launch in k8s_launches(docs):
        kind, name, _ = launch.where.split(":")[1].split("/")
        w = next(x for x in workloads(docs) if x["kind"] == kind and x["metadata"]["name"] == name)
        ctx = w["spec"]["template"]["spec"]["securityContext"]
        assert ctx.get("runAsNonRoot") is True and ctx.get("runAsUser") == uid, launch.where


@pytest.mark.skipif(
    shutil.which("kubectl") is None,
    reason="kubectl is not installed (its built-in kustomize renders deploy/k8s without a cluster)",
)
def test_kustomize_renders_every_resource(docs):
    res = subprocess.run(["kubectl", "kustomize", str(K8S_DIR)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    rendered = [d for d in yaml.safe_load_all(res.stdout) if d]
    key = lambda d: (d["kind"], d["metadata"]["name"])
    assert sorted(map(key, rendered)) == sorted(map(key, docs))
    assert all(d["metadata"].get("namespace", "pdrelay") == "pdrelay" for d in rendered if d["kind"] != "Namespace")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed (it renders the overlay)")
def test_gpu_overlay_gives_every_engine_pod_its_own_gpu(docs, tmp_path):
    """deploy/k8s-gpu: prefill and decode request one nvidia.com/gpu per pod, with a memory limit that holds an 8B
    model's shards while they stream to the GPU, and resolve to cuda with the KV pool left to the memory plan."""
    from shared.cluster.certs import make_certs
    from shared.config import StaticProbe

    tls = tmp_path / "tls"
    make_certs(tls, ("gateway", "prefill", "decode", "encoder", "kvstore"))

    overlay = K8S_DIR.parent / "k8s-gpu"
    res = subprocess.run(["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    rendered = [d for d in yaml.safe_load_all(res.stdout) if d]
    key = lambda d: (d["kind"], d["metadata"]["name"])
    # the same resources, patched, and the GPU cluster's own (budgets, the models volume, monitoring)
    assert set(map(key, rendered)) >= set(map(key, docs))
    probe = StaticProbe(
        cuda=True, gpus=1, memory_bytes=80 << 30, modules=frozenset({"nixl_cu12._api"}), rdma=("mlx5_0",)
    )  # a GPU node with the HCA the overlay names
    for launch in k8s_launches(rendered):
        name = launch.where.split("/")[1]
        w = next(x for x in workloads(rendered) if x["metadata"]["name"] == name)
        pod = w["spec"]["template"]["spec"]
        c = pod["containers"][0]
        assert c["image"] == "pdrelay:cuda", launch.where
        if launch.role not in ("prefill", "decode"):
            assert "nvidia.com/gpu" not in c.get("resources", {}).get("limits", {}), launch.where
            continue
        limits, requests = c["resources"]["limits"], c["resources"]["requests"]
        assert limits["nvidia.com/gpu"] == requests["nvidia.com/gpu"] == 1, launch.where
        assert limits["memory"].endswith("Gi") and int(limits["memory"][:-2]) >= 20, launch.where
        assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"]), launch.where
        # the pdrelay-tls Secret mounted at /tls: certificates of a local CA here; the model volume is not here
        env = {k: v.replace("/tls/", f"{tls}/") for k, v in launch.env.items() if k != "PDRELAY_MODEL"}
        cfg = resolve(launch.role, list(launch.argv), env, ctx=PassContext(probe=probe))
        assert cfg.device.device == "cuda" and cfg.cache.kv_cache_memory_bytes == 0, launch.where
        assert "memory plan" in cfg.provenance["cache.kv_cache_memory_bytes"].detail, launch.where
