"""Read the deployment definitions the way their engines do, and turn each pdrelay container into a launch:
(role, flags, environment) that the real config system can resolve.

- compose: YAML with anchors/merge keys, `${VAR:-default}` interpolation, and `-f a -f b` overlays (mappings such
  as `environment` merge, other keys are replaced), as docker-compose does it;
- Kubernetes: every document of deploy/k8s/*.yaml; a container's environment is its ConfigMaps (`envFrom`) overlaid
  by its `env`; its command is `command + args`, or the image's entrypoint followed by `args`.

No Docker engine is needed; tests compare this reading with `docker-compose config` where that binary exists.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO / "deploy" / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
GPU_FILE = COMPOSE_DIR / "docker-compose.gpu.yml"
DOCKERFILE = COMPOSE_DIR / "Dockerfile"
K8S_DIR = REPO / "deploy" / "k8s"

_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class Launch:
    """One pdrelay container as its engine would start it."""

    where: str  # "compose:decode", "k8s:Deployment/decode/decode"
    role: str
    argv: tuple[str, ...]  # the flags after the role
    env: dict[str, str] = field(hash=False)
    image: str = ""


# -- commands -------------------------------------------------------------------------------------------------------
def parse_service_command(command: Sequence[str] | str | None) -> tuple[str, tuple[str, ...]] | None:
    """(role, flags) of `pdrelay serve <role> [flags]` or `python -m services.<role> [flags]`; None for a command
    that is not a pdrelay service (etcd, nats). A path before `pdrelay`/`python` is allowed."""
    if command is None:
        return None
    words = shlex.split(command) if isinstance(command, str) else [str(w) for w in command]
    if not words:
        return None
    exe = Path(words[0]).name
    if exe == "pdrelay":
        if len(words) < 3 or words[1] != "serve":
            raise ValueError(f"{' '.join(words)!r}: a pdrelay container must run `pdrelay serve <role> [flags]`")
        return words[2], tuple(words[3:])
    if re.fullmatch(r"python(3(\.\d+)?)?", exe) and len(words) >= 3 and words[1] == "-m":
        module = words[2]
        if module.startswith("services.") and module.count(".") == 1:
            return module.split(".", 1)[1], tuple(words[3:])
    return None


# -- compose --------------------------------------------------------------------------------------------------------
def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's variable syntax: $VAR, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, $$ for a dollar."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3) or ""
        value = env.get(name)
        if op in (":-", ":?") and not value or op in ("-", "?") and value is None:
            if op.endswith("?"):
                raise ValueError(f"compose variable {name} is required: {arg}")
            return arg
        return value or ""

    return _VAR.sub(sub, text)


def _interpolate_tree(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_interpolate_tree(n, env) for n in node]
    if isinstance(node, dict):
        return {k: _interpolate_tree(v, env) for k, v in node.items()}
    return node


def env_mapping(environment: Any) -> dict[str, str]:
    """A compose `environment` (mapping or list of KEY=VALUE) as a dict of strings (None -> '')."""
    if environment is None:
        return {}
    if isinstance(environment, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in map(str, environment))
    return {str(k): "" if v is None else _scalar(v) for k, v in environment.items()}


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def load_compose(*paths: Path, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The merged compose model of `paths` (first is the base), with variables interpolated from `env` (none set:
    every default applies)."""
    env = {} if env is None else env
    merged: dict[str, Any] = {}
    for path in paths or (COMPOSE_FILE,):
        data = _interpolate_tree(yaml.safe_load(path.read_text()), env)
        for key, value in data.items():
            if key != "services":
                merged.setdefault(key, value)
                continue
            services = merged.setdefault("services", {})
            for name, svc in value.items():
                base = services.setdefault(name, {})
                for k, v in svc.items():
                    if k == "environment":
                        base[k] = {**env_mapping(base.get(k)), **env_mapping(v)}
                    elif isinstance(v, dict) and isinstance(base.get(k), dict):
                        base[k] = {**base[k], **v}
                    else:
                        base[k] = v
    return merged


def compose_launches(model: Mapping[str, Any]) -> list[Launch]:
    launches = []
    for name, svc in model["services"].items():
        parsed = parse_service_command(svc.get("command"))
        if parsed is None:
            continue
        role, argv = parsed
        launches.append(
            Launch(f"compose:{name}", role, argv, env_mapping(svc.get("environment")), str(svc.get("image", "")))
        )
    return launches


def compose_ports(svc: Mapping[str, Any]) -> set[int]:
    """Container-side ports a compose service declares: `expose` and the container side of `ports`."""
    ports = {int(p) for p in svc.get("expose", [])}
    for spec in svc.get("ports", []):
        ports.add(int(str(spec).rsplit(":", 1)[-1].split("/")[0]))
    return ports


def published_host_ports(svc: Mapping[str, Any]) -> list[str]:
    """The `ports` entries that bind a host port (everything but a bare container port)."""
    return [str(p) for p in svc.get("ports", []) if ":" in str(p)]


# -- Kubernetes -----------------------------------------------------------------------------------------------------
def k8s_files() -> list[Path]:
    return sorted(p for p in K8S_DIR.glob("*.yaml") if p.name != "kustomization.yaml")


def k8s_documents() -> list[dict[str, Any]]:
    docs = []
    for path in k8s_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append(doc)
    return docs


def workloads(docs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [d for d in docs if d.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "Job")]


def config_maps(docs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    return {
        d["metadata"]["name"]: {k: str(v) for k, v in (d.get("data") or {}).items()}
        for d in docs
        if d.get("kind") == "ConfigMap"
    }


def container_env(container: Mapping[str, Any], maps: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """envFrom ConfigMaps first, then `env` (which wins, as in Kubernetes). A valueFrom entry is an error here:
    its value is unknown before the pod runs, so the config tests could not check it."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref is None:
            raise ValueError(f"container {container['name']}: only configMapRef envFrom sources are checked")
        if ref["name"] not in maps:
            raise KeyError(f"container {container['name']} reads ConfigMap {ref['name']!r}, which no manifest defines")
        env.update(maps[ref["name"]])
    for item in container.get("env", []):
        if "value" not in item:
            raise ValueError(f"container {container['name']}: env {item['name']} has no literal value")
        env[item["name"]] = str(item["value"])
    return env


def k8s_launches(docs: Sequence[Mapping[str, Any]]) -> list[Launch]:
    """pdrelay containers of every workload. Without `command` the image's entrypoint (pdrelay-entrypoint, which
    execs its arguments) runs `args`, so `args` is the service command."""
    maps = config_maps(docs)
    launches = []
    for w in workloads(docs):
        for c in w["spec"]["template"]["spec"]["containers"]:
            cmd = list(c.get("command", [])) + list(c.get("args", [])) if c.get("command") else c.get("args")
            parsed = parse_service_command(cmd)
            if parsed is None:
                continue
            role, argv = parsed
            launches.append(
                Launch(
                    f"k8s:{w['kind']}/{w['metadata']['name']}/{c['name']}",
                    role,
                    argv,
                    container_env(c, maps),
                    str(c.get("image", "")),
                )
            )
    return launches


# -- Dockerfile -----------------------------------------------------------------------------------------------------
def dockerfile_instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = (pending + stripped).strip()
        pending = ""
        word, _, rest = whole.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def dockerfile_env(path: Path = DOCKERFILE) -> dict[str, str]:
    """The image's ENV (KEY=VALUE form), as a container started from it sees it ($VAR references are left as is)."""
    env: dict[str, str] = {}
    for word, rest in dockerfile_instructions(path):
        if word == "ENV":
            for item in shlex.split(rest):
                key, eq, value = item.partition("=")
                assert eq, f"ENV {rest!r}: use the KEY=VALUE form"
                env[key] = value
    return env
