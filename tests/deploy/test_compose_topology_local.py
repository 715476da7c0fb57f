"""The compose topology runs without Docker: every pdrelay service of the default profile is started as a local
process exactly as docker-compose.yml declares it (through the image's entrypoint, with the image's ENV and the
service's environment), against a local etcd and NATS, and a chat request goes through the gateway.

Only what a container network provides differently is rewritten: service hostnames (etcd, nats, mooncake-master)
become the local servers, PDRELAY_HOST becomes 127.0.0.1, each fixed container port becomes a free port (replicas share one
host here), the model cache is the prepared bundled model's, and tracing is off (no Jaeger).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from shared.cluster.localcluster.servers import MooncakeMaster, free_port, stop_process
from shared.config import resolve
from tests.deploy.topology import (
    COMPOSE_DIR,
    COMPOSE_FILE,
    REPO,
    Launch,
    compose_launches,
    dockerfile_env,
    load_compose,
)
from tests.helpers.servers import etcd_server, nats_server  # noqa: F401 (fixtures)

MODEL = load_compose(COMPOSE_FILE)
DEFAULT_PROFILE = [
    launch for launch in compose_launches(MODEL) if not MODEL["services"][launch.where.split(":", 1)[1]].get("profiles")
]
# Like `docker compose up --scale decode=2`: replicas get identical environments and must still register apart.
SCALE = {"decode": 2}
MISSING = sorted(
    {
        f"services/{launch.role}/__main__.py"
        for launch in DEFAULT_PROFILE
        if not (REPO / "services" / launch.role / "__main__.py").is_file()
    }
)
READY_TIMEOUT_S = 240.0

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING), reason=f"the services are not written yet: {', '.join(MISSING)} missing"),
]


def _local_env(launch: Launch, endpoints: dict[str, str], model_cache: Path, tmp: Path) -> dict[str, str]:
    """The container's environment (image ENV < service environment), rewritten for processes on one host."""
    image_env = {k: v for k, v in dockerfile_env().items() if k.startswith("PDRELAY_") or k == "HF_HUB_OFFLINE"}
    env: dict[str, str] = {}
    for key, value in {**image_env, **launch.env}.items():
        if key == "PDRELAY_OTLP_TRACES_ENDPOINT":
            continue  # no Jaeger here
        if key == "PDRELAY_HOST":
            value = "127.0.0.1"  # the container network is not here: stay on loopback
        elif key.startswith("PDRELAY_") and key.endswith("_PORT") and value != "0":
            value = str(free_port())  # a fixed port per container; processes on one host need their own
        elif key == "PDRELAY_MODEL_CACHE_DIR":
            value = str(model_cache)
        elif key == "PDRELAY_KVSTORE_DISK_DIR":
            value = str(tmp / "kvstore-disk")  # the container's volume: a folder of this test
        elif key == "PDRELAY_KVSTORE_MOONCAKE_MASTER":
            value = endpoints["mooncake-master"]
        elif key == "PDRELAY_KVSTORE_MOONCAKE_METADATA_URL":
            value = endpoints["mooncake-metadata"]
        elif "://" in value:
            value = ",".join(_rehost(url, endpoints) for url in value.split(","))
        env[key] = value
    # What the entrypoint would derive from the container's address: here the loopback address.
    env["PDRELAY_TRANSFER_HOST"] = "127.0.0.1"
    return env


def _rehost(url: str, endpoints: dict[str, str]) -> str:
    parts = urlsplit(url)
    if parts.hostname not in endpoints:
        return url
    local = urlsplit(endpoints[parts.hostname])
    return urlunsplit((parts.scheme, local.netloc, parts.path, parts.query, parts.fragment))


class _Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def start(self, name: str, launch: Launch, env: dict[str, str]) -> None:
        venv_bin = str(Path(sys.executable).parent)
        full = {
            "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": os.environ.get("HOME", str(self.tmp)),
            **env,
        }
        if "PYTHONPATH" in os.environ:  # a checkout run against another checkout's venv: import this one's code
            full["PYTHONPATH"] = os.environ["PYTHONPATH"]
        command = MODEL["services"][launch.where.split(":", 1)[1]]["command"]
        log = self.tmp / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["sh", str(COMPOSE_DIR / "entrypoint.sh"), *command],
                env=full,
                cwd=self.tmp,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.procs.append((name, proc, log))

    def check_alive(self) -> None:
        for name, proc, log in self.procs:
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with code {proc.returncode}; last log lines:\n{_tail(log)}")

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{_tail(log)}" for name, _, log in self.procs)

    def stop(self) -> None:
        for _, proc, _ in reversed(self.procs):
            stop_process(proc, timeout=15.0)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


async def _registered(etcd_url: str, cluster: str) -> dict[str, list[str]]:
    from shared.cluster.etcd import connect_etcd
    from shared.cluster.membership import Membership

    client = await connect_etcd([etcd_url])
    try:
        async with Membership(client, cluster) as members:
            out: dict[str, list[str]] = {}
            for info in members.instances():
                out.setdefault(info.role, []).append(info.instance_id)
            return out
    finally:
        await client.close()


def test_compose_topology_serves_a_chat_request_as_local_processes(
    etcd_server, nats_server, tmp_path, bundled_model_dir
):
    master = MooncakeMaster(tmp_path / "mooncake", free_port(), start_timeout_s=60.0)
    master.start()  # the compose file's mooncake-master service (not a pdrelay role)
    endpoints = {
        "etcd": etcd_server.url,
        "nats": nats_server.url,
        "mooncake-master": master.address,
        "mooncake-metadata": master.metadata_url,
    }
    cluster = _Cluster(tmp_path)
    gateway_port = None
    cluster_name = "default"
    try:
        # Workers first, the gateway last: the order compose's depends_on allows, and the gateway's /ready then
        # only waits for registration.
        for launch in sorted(DEFAULT_PROFILE, key=lambda x: x.role == "gateway"):
            name = launch.where.split(":", 1)[1]
            for replica in range(SCALE.get(name, 1)):
                env = _local_env(launch, endpoints, Path(bundled_model_dir).parent, tmp_path)
                cfg = resolve(launch.role, list(launch.argv), env)  # fails fast, with the config's own message
                cluster_name = cfg.discovery.cluster
                if launch.role == "gateway":
                    gateway_port = cfg.http.port
                cluster.start(f"{name}-{replica + 1}", launch, env)
        assert gateway_port, "the compose file runs a gateway in its default profile"
        base = f"http://127.0.0.1:{gateway_port}"

        deadline = time.monotonic() + READY_TIMEOUT_S
        with httpx.Client(base_url=base, timeout=60.0) as http:
            while True:
                cluster.check_alive()
                try:
                    if http.get("/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"the gateway was not ready within {READY_TIMEOUT_S:.0f} s\n{cluster.logs()}")
                time.sleep(0.5)

            models = http.get("/v1/models").json()["data"]
            assert models, "the gateway lists no model"
            resp = http.post(
                "/v1/chat/completions",
                json={
                    "model": models[0]["id"],
                    "messages": [{"role": "user", "content": "What is the capital of France?"}],
                    "max_tokens": 16,
                    "temperature": 0,
                },
            )
            assert resp.status_code == 200, f"{resp.status_code} {resp.text}\n{cluster.logs()}"
            body = resp.json()
            text = body["choices"][0]["message"]["content"]
            assert body["usage"]["completion_tokens"] >= 1
            # SmolLM2-135M-Instruct answers this greedily with Paris: garbage KV from a broken hand-off would not.
            assert "paris" in text.lower(), text

        registered = asyncio.run(_registered(etcd_server.url, cluster_name))
        for launch in DEFAULT_PROFILE:
            if launch.role == "gateway":
                continue
            name = launch.where.split(":", 1)[1]
            ids = registered.get(launch.role, [])
            assert len(ids) == len(set(ids)) == SCALE.get(name, 1), f"{launch.role}: {ids}"
    finally:
        cluster.stop()
        master.stop()
