"""deploy/compose/docker-compose.yml: valid for docker-compose 1.29, scalable per role, and every pdrelay service's
command and environment resolve through the real config system (transfer-engine check on, as in production)."""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import subprocess
from urllib.parse import urlsplit

import pytest
import yaml

from shared.config import HostProbe, PassContext, ResolvedConfig, resolve
from shared.config.catalog import all_specs, role_specs
from tests.deploy.topology import (
    COMPOSE_FILE,
    GPU_FILE,
    REPO,
    Launch,
    compose_launches,
    compose_ports,
    dockerfile_env,
    env_mapping,
    load_compose,
    parse_service_command,
    published_host_ports,
)

DOCKER_COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.skipif(
    DOCKER_COMPOSE is None,
    reason="the docker-compose binary is not installed "
    "(scripts/install.sh installs Debian's docker-compose 1.29; CI has it)",
)
ALL_ENV_TWINS = {s.env for s in all_specs()}
INFRA = ("etcd", "nats", "jaeger")


def _compose(*files, args=("config", "-q")) -> subprocess.CompletedProcess[str]:
    cmd = [DOCKER_COMPOSE or "docker-compose"]
    for f in files:
        cmd += ["-f", str(f)]
    # Only PATH and HOME: a compose variable set in the developer's shell (GATEWAY_PORT=...) must not change the
    # model docker-compose reads, since load_compose() applies the file's defaults.
    env = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    return subprocess.run(cmd + list(args), cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def _resolved(launch: Launch, ctx: PassContext | None = None) -> ResolvedConfig:
    # The container's environment is the image's ENV overlaid by the service's environment.
    env = {**dockerfile_env(), **launch.env}
    return resolve(launch.role, list(launch.argv), env, ctx=ctx or PassContext())


@pytest.fixture(scope="module")
def model():
    return load_compose(COMPOSE_FILE)


# -- the engine's own validation -----------------------------------------------------------------------------------
@needs_compose
@pytest.mark.parametrize("files", [(COMPOSE_FILE,), (COMPOSE_FILE, GPU_FILE)], ids=["cpu", "cpu+gpu-overlay"])
def test_docker_compose_129_accepts_the_file(files):
    res = _compose(*files)
    assert res.returncode == 0, res.stderr


@needs_compose
def test_docker_compose_rejects_what_the_file_avoids(tmp_path):
    """The check above can fail: 1.29 refuses the Compose-v2-only keys the file must not use."""
    original = yaml.safe_load(COMPOSE_FILE.read_text())
    for mutate in (
        lambda d: d.update(name="pdrelay"),
        lambda d: d["services"]["decode"]["depends_on"]["etcd"].update(required=True),
    ):
        bad = copy.deepcopy(original)
        mutate(bad)
        path = tmp_path / "docker-compose.yml"
        path.write_text(yaml.safe_dump(bad))
        assert _compose(path).returncode != 0


@needs_compose
@pytest.mark.parametrize("files", [(COMPOSE_FILE,), (COMPOSE_FILE, GPU_FILE)], ids=["cpu", "cpu+gpu-overlay"])
def test_our_reading_matches_docker_compose(files):
    """The launches the config tests check are the ones docker-compose would start (commands and environments)."""
    res = _compose(*files, args=("config",))
    assert res.returncode == 0, res.stderr
    theirs = yaml.safe_load(res.stdout)["services"]
    ours = load_compose(*files)["services"]
    assert set(theirs) == set(ours)
    for name, svc in theirs.items():
        assert svc.get("command") == ours[name].get("command"), name
        assert env_mapping(svc.get("environment")) == env_mapping(ours[name].get("environment")), name
        assert svc.get("image") == ours[name].get("image"), name


def test_no_compose_v2_only_keys(model):
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    assert "name" not in raw and "include" not in raw, "docker-compose 1.29 rejects top-level name:/include:"
    for name, svc in model["services"].items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert "required" not in (cond or {}), f"{name}.depends_on.{dep}.required is Compose-v2 only"


# -- topology -------------------------------------------------------------------------------------------------------
def test_every_role_has_a_service(model):
    roles = {launch.role: launch.where for launch in compose_launches(model)}
    assert {"gateway", "prefill", "decode", "encoder", "kvstore", "worker"} <= set(roles)
    default = {n for n, s in model["services"].items() if not s.get("profiles")}
    assert {"etcd", "nats", "jaeger", "gateway", "prefill", "decode"} <= default


def test_workers_can_scale(model):
    """`up --scale prefill=2 --scale decode=3` needs no fixed names and no fixed host ports on scaled services."""
    for name, svc in model["services"].items():
        assert "container_name" not in svc, f"{name}: container_name forbids --scale"
        if name not in ("gateway", "jaeger"):
            assert not published_host_ports(svc), f"{name} publishes a host port; only the gateway and the UI may"
    assert "8000" in " ".join(published_host_ports(model["services"]["gateway"]))


def test_services_start_after_healthy_infrastructure(model):
    for infra in ("etcd", "nats"):
        assert model["services"][infra].get("healthcheck", {}).get("test"), f"{infra} needs a healthcheck"
    for launch in compose_launches(model):
        svc = model["services"][launch.where.split(":", 1)[1]]
        deps = svc.get("depends_on") or {}
        for infra in ("etcd", "nats"):
            assert deps.get(infra, {}).get("condition") == "service_healthy", f"{launch.where} -> {infra}"
        assert svc.get("restart") in ("unless-stopped", "always", "on-failure"), launch.where
        assert svc.get("healthcheck", {}).get("test"), f"{launch.where} needs a healthcheck"
        assert svc.get("mem_limit") and svc.get("cpus"), f"{launch.where} needs resource hints"


def test_infrastructure_images_are_the_ones_asked_for(model):
    svcs = model["services"]
    assert svcs["etcd"]["image"].startswith(("quay.io/coreos/etcd:v3.5", "gcr.io/etcd-development/etcd:v3.5"))
    nats_tag = svcs["nats"]["image"].split(":", 1)[1]
    assert tuple(int(x) for x in nats_tag.split("-")[0].split(".")[:2]) >= (2, 10)
    assert "-js" in svcs["nats"]["command"]
    assert "jaeger" in svcs["jaeger"]["image"] and 4317 in compose_ports(svcs["jaeger"])


def test_service_urls_point_at_declared_services(model):
    """PDRELAY_ETCD_ENDPOINTS / NATS_URL / OTLP endpoint name a compose service and a port it exposes."""
    for launch in compose_launches(model):
        for var in ("PDRELAY_ETCD_ENDPOINTS", "PDRELAY_NATS_URL", "PDRELAY_OTLP_TRACES_ENDPOINT"):
            for url in launch.env[var].split(","):
                parts = urlsplit(url)
                assert parts.hostname in model["services"], f"{launch.where}: {var}={url} names no service"
                assert parts.port in compose_ports(model["services"][parts.hostname]), f"{launch.where}: {url}"


def test_published_ports_bind_loopback_by_default(model):
    for name in ("gateway", "jaeger"):
        for spec in published_host_ports(model["services"][name]):
            assert spec.startswith("127.0.0.1:"), f"{name}: {spec} should bind 127.0.0.1 unless PUBLISH_ADDR is set"
    opened = load_compose(COMPOSE_FILE, env={"PUBLISH_ADDR": "0.0.0.0", "GATEWAY_PORT": "18000"})
    assert "0.0.0.0:18000:8000" in published_host_ports(opened["services"]["gateway"])


# -- the real config system -----------------------------------------------------------------------------------------
def test_command_parser_understands_both_spellings():
    assert parse_service_command(["pdrelay", "serve", "decode", "--page-size", "32"]) == (
        "decode",
        ("--page-size", "32"),
    )
    assert parse_service_command("python -m services.prefill --threads 2") == ("prefill", ("--threads", "2"))
    assert parse_service_command(["/usr/local/bin/etcd", "--name=etcd"]) is None
    with pytest.raises(ValueError):
        parse_service_command(["pdrelay", "up"])


def test_every_service_resolves_with_the_real_config(model):
    launches = compose_launches(model)
    assert launches
    for launch in launches:
        cfg = _resolved(launch)  # raises ConfigError on a renamed flag, a bad value or a missing transfer engine
        assert cfg.role == launch.role
        assert cfg.grpc.host == "0.0.0.0", f"{launch.where}: containers must bind every interface"
        assert cfg.discovery.etcd_endpoints == ("http://etcd:2379",)
        assert cfg.bus.nats_url == "nats://nats:4222"


def test_every_pdrelay_variable_is_a_field_the_role_reads(model):
    """read_env ignores unknown PDRELAY_* names, so a renamed field would silently drop a setting: catch it here.

    A variable must be the env twin of a field; if the role uses that field, resolution must show it came from
    the environment (the shared block also carries variables for other roles, e.g. the model cache for kvstore).
    """
    for launch in compose_launches(model):
        cfg = _resolved(launch)
        own = {s.env: s.key for s in role_specs(launch.role)}
        for var in (v for v in launch.env if v.startswith("PDRELAY_")):
            assert var in ALL_ENV_TWINS, f"{launch.where}: {var} is no config field's env twin (renamed?)"
            if var in own:
                assert cfg.provenance[own[var]].source == "env", f"{launch.where}: {var} was not applied"


def test_ports_agree_with_the_resolved_config(model):
    """Health checks, `expose` and published ports use the ports the services will actually listen on."""
    for launch in compose_launches(model):
        svc = model["services"][launch.where.split(":", 1)[1]]
        cfg = _resolved(launch)
        wanted = {cfg.grpc.grpc_port} | ({cfg.telemetry.metrics_port} if cfg.telemetry.metrics_port else set())
        if launch.role == "gateway":
            wanted.add(cfg.http.port)
            assert cfg.telemetry.metrics_port == 0  # the gateway serves /metrics on its HTTP port
        assert 0 not in wanted, f"{launch.where}: a container port must be fixed, not picked at random"
        assert compose_ports(svc) == wanted, launch.where
        check = svc["healthcheck"]["test"]
        port = cfg.http.port if launch.role == "gateway" else cfg.grpc.grpc_port
        assert any(f"127.0.0.1:{port}" in word for word in check), f"{launch.where}: {check} misses port {port}"


class _GpuHost(HostProbe):
    """This machine's installed modules and libraries, plus one 80 GiB GPU (the GPU overlay's target host)."""

    def cuda_available(self) -> bool:
        return True

    def cuda_device_count(self) -> int:
        return 1

    def device_memory(self, device: str) -> tuple[int, str]:
        return (80 << 30, "CUDA device memory") if device == "cuda" else super().device_memory(device)

    def gpu_memory(self, gpu: int) -> tuple[int, int]:
        return 80 << 30, 80 << 30


def test_gpu_overlay_resolves_on_a_gpu_host(tmp_path):
    from tests.helpers.header_checkpoints import LLAMA_31_8B, write_header_checkpoint

    gpu_model = load_compose(COMPOSE_FILE, GPU_FILE)
    ctx = PassContext(probe=_GpuHost())
    llama = write_header_checkpoint(tmp_path / "Llama-3.1-8B-Instruct", LLAMA_31_8B)
    for launch in compose_launches(gpu_model):
        cfg = _resolved(launch, ctx)
        assert launch.image.endswith(":cuda"), launch.where
        if launch.role in ("prefill", "decode", "worker"):
            assert cfg.device.device == "cuda" and cfg.model.dtype == "bfloat16", launch.where
            # the bundled model is prepared inside the image: its engine plans the KV pool at start
            assert cfg.cache.kv_cache_memory_bytes == 0, launch.where
            assert "memory plan" in cfg.provenance["cache.kv_cache_memory_bytes"].detail, launch.where
            # an 8B checkpoint on the 80 GiB GPU: the plan leaves most of it to the KV pool
            big = _resolved(dataclasses.replace(launch, argv=(*launch.argv, "--model", str(llama))), ctx)
            assert big.cache.kv_cache_memory_bytes > 40 << 30, launch.where
        elif launch.role == "encoder":
            assert cfg.device.device == "cpu", "the encoder stays on the CPU unless given a GPU"
    services = gpu_model["services"]
    gpus = {
        name: services[name]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
        for name in ("prefill", "decode", "worker")
    }
    assert gpus == {"prefill": ["0"], "decode": ["1"], "worker": ["0"]}  # engines of one stack: their own GPUs
    for name in gpus:
        assert int(str(services[name]["mem_limit"]).rstrip("g")) >= 20, f"{name}: staging an 8B model needs ~20 GB"
