"""What `pdrelay up` starts: options, and one launch spec (command line + resolved config file) per instance.

Each real role runs as `python -m services.<role> --resolved-config FILE --ready-file FILE`; the config is
resolved here (defaults < --config < PDRELAY_* env < the user's flags < per-instance settings) and written to
`<run-dir>/config/<id>.json`, so the child does not resolve again and `pdrelay config show` tells no other story.
A role whose `services.<role>.__main__` does not exist in this build is skipped with a note. The `echo` role is
the control-plane test service (services.echo), started with raw flags.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

# Start order; stop order is the reverse (the gateway stops taking requests before the workers go). The planner
# starts last, once there is a cluster to plan for.
ROLE_ORDER = ("kvstore", "encoder", "prefill", "decode", "worker", "echo", "gateway", "planner")
ECHO_MODULE = "services.echo"
# Roles whose processes run an LLM engine: `--threads 0` splits the host's cores among their instances. Encoders
# run a model too, but beside LLM engines they take one thread (shared.config.passes.resolve_threads).
ENGINE_ROLES = ("prefill", "decode", "worker")
ENCODER_ROLE = "encoder"
# Set by `pdrelay up` for every instance; a user flag for them would fight the per-instance value.
PER_INSTANCE_FLAGS = frozenset(
    {
        "--instance-id",
        "--grpc-port",
        "--etcd-endpoints",
        "--etcd",
        "--nats-url",
        "--nats",
        "--cluster",
        "--lease-ttl-s",
        "--admin-secret-file",
    }
)
# Set by `pdrelay up --tls` for every instance (its role's certificate).
TLS_FLAGS = frozenset({"--tls-ca-file", "--tls-certfile", "--tls-keyfile"})


class UpOptions(msgspec.Struct, frozen=True, kw_only=True):
    run_dir: str
    cluster: str = "default"
    etcd_url: str | None = None  # external etcd: start none
    nats_url: str | None = None
    etcd_port: int = 0  # 0: 2379 when free, else any free port
    nats_port: int = 0  # 0: 4222 when free, else any free port
    counts: dict[str, int] = msgspec.field(default_factory=dict)  # role -> instances
    extra: tuple[str, ...] = ()  # service flags, each handed to the roles that accept it
    # service flags for one role only, after `extra` (so they win): e.g. {"prefill": ("--num-pages", "160")}
    role_extra: dict[str, tuple[str, ...]] = msgspec.field(default_factory=dict)
    ready_timeout_s: float = 300.0
    stop_timeout_s: float = 30.0
    lease_ttl_s: int = 5
    demo: bool = False  # send one chat request through the gateway once ready
    echo_log: bool = True  # stream the merged child logs to stdout
    trace: bool = False  # start a local trace sink and point every service at it (`pdrelay trace` reads it)
    tls: bool = False  # mutual TLS on every hop we own, with certificates made in <run-dir>/certs
    tls_dir: str = ""  # set by the supervisor once the certificates exist
    admin_secret_file: str = ""  # set by the supervisor: signs drain / scale commands (shared.cluster.bus.admin_auth)
    restart: bool = True  # restart crashed children, etcd and NATS with backoff (restarts.py)


class InstanceSpec(msgspec.Struct, frozen=True, kw_only=True):
    role: str
    instance_id: str
    argv: tuple[str, ...]  # full command line
    config_path: str = ""
    ready_file: str = ""


def role_available(role: str) -> bool:
    """Does this build have `services.<role>.__main__` (or the echo test service)?"""
    if role == "echo":
        return True
    try:
        return importlib.util.find_spec(f"services.{role}.__main__") is not None
    except ModuleNotFoundError:
        return False


def split_flags(argv: Sequence[str]) -> list[list[str]]:
    """['--a', '1', '--b', '--c=2'] -> [['--a', '1'], ['--b'], ['--c=2']] (values stay with their flag)."""
    chunks: list[list[str]] = []
    for tok in argv:
        if tok.startswith("--") or not chunks:
            chunks.append([tok])
        else:
            chunks[-1].append(tok)
    return chunks


def flags_for_role(role: str, argv: Sequence[str]) -> list[str]:
    """The user's service flags that `role` accepts. Unknown flags go to every role, whose resolver then names
    them; `--config FILE` goes to every role."""
    from shared.config import catalog

    table = catalog.flag_table()
    out: list[str] = []
    for chunk in split_flags(argv):
        flag = chunk[0].split("=", 1)[0]
        spec = table.get(flag) or (table.get("--" + flag[5:]) if flag.startswith("--no-") else None)
        if spec is None or catalog.role_uses(role, spec.group):
            out += chunk
    return out


def _instance_flags(role: str, iid: str, opts: UpOptions, etcd_url: str, nats_url: str, index: int) -> list[str]:
    flags = [
        "--etcd-endpoints",
        etcd_url,
        "--nats-url",
        nats_url,
        "--cluster",
        opts.cluster,
        "--instance-id",
        iid,
        "--lease-ttl-s",
        str(opts.lease_ttl_s),
        "--grpc-port",
        "0",
    ]
    if role == "gateway" and index > 0:
        flags += ["--port", "0"]  # only the first gateway takes the configured HTTP port
    from shared.config.roles import ROLE_GROUPS

    groups = ROLE_GROUPS.get(role, ())  # echo: its own flags (the admin secret, no TLS)
    if opts.admin_secret_file and (role == "echo" or "bus" in groups):
        flags += ["--admin-secret-file", opts.admin_secret_file]
    if opts.tls_dir and "tls" in groups:
        certs = Path(opts.tls_dir)
        flags += [
            "--tls-ca-file",
            str(certs / "ca.pem"),
            "--tls-certfile",
            str(certs / f"{role}.pem"),
            "--tls-keyfile",
            str(certs / f"{role}-key.pem"),
        ]
        user = [c[0].split("=", 1)[0] for c in split_flags([*opts.extra, *opts.role_extra.get(role, ())])]
        if role == "gateway" and "--ssl-certfile" not in user:  # HTTPS + TLS gRPC, unless the user brought a cert
            flags += ["--ssl-certfile", str(certs / "gateway.pem"), "--ssl-keyfile", str(certs / "gateway-key.pem")]
    return flags


def build_spec(
    role: str, index: int, opts: UpOptions, etcd_url: str, nats_url: str, env: Mapping[str, str] | None = None
) -> InstanceSpec:
    """The launch spec of instance number `index` (0-based) of `role`; writes its resolved config file.

    Raises shared.config.ConfigError for bad service flags (before anything is started)."""
    run_dir = Path(opts.run_dir)
    iid = f"{role}-{index + 1}"
    ready_file = str((run_dir / "ready" / f"{iid}.json").resolve())
    per_instance = _instance_flags(role, iid, opts, etcd_url, nats_url, index)
    if role == "echo":
        argv = (sys.executable, "-m", ECHO_MODULE, *per_instance, "--ready-file", ready_file)
        return InstanceSpec(role=role, instance_id=iid, argv=argv, ready_file=ready_file)
    from shared.config import PassContext, resolve

    user = [*flags_for_role(role, opts.extra), *opts.role_extra.get(role, ())]
    ctx = PassContext(
        engines_on_host=sum(opts.counts.get(r, 0) for r in ENGINE_ROLES),
        encoders_on_host=opts.counts.get(ENCODER_ROLE, 0),
    )
    cfg = resolve(role, [*user, *per_instance], os.environ if env is None else env, ctx=ctx)
    cfg_path = (run_dir / "config" / f"{iid}.json").resolve()
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(cfg.to_json())
    argv = (sys.executable, "-m", f"services.{role}", "--resolved-config", str(cfg_path), "--ready-file", ready_file)
    return InstanceSpec(role=role, instance_id=iid, argv=argv, config_path=str(cfg_path), ready_file=ready_file)


def plan(opts: UpOptions, etcd_url: str, nats_url: str) -> tuple[list[InstanceSpec], list[str]]:
    """(launch specs in start order, notes about skipped roles)."""
    specs: list[InstanceSpec] = []
    notes: list[str] = []
    for role in ROLE_ORDER:
        n = opts.counts.get(role, 0)
        if n <= 0:
            continue
        if not role_available(role):
            notes.append(f"{role}: not in this build yet (no services.{role}.__main__); skipped {n} instance(s)")
            continue
        specs += [build_spec(role, i, opts, etcd_url, nats_url) for i in range(n)]
    return specs, notes


def known_roles() -> tuple[str, ...]:
    return ROLE_ORDER


def parse_role_flags(items: Sequence[str], roles: Sequence[str] = ROLE_ORDER) -> dict[str, tuple[str, ...]]:
    """['prefill=--num-pages 160', 'prefill=--page-size 32'] -> {'prefill': ('--num-pages', '160', '--page-size',
    '32')}; ValueError naming a malformed item or an unknown role. Used by `pdrelay up --role-flags` and by the
    benchmarks that start a cluster of their own."""
    out: dict[str, tuple[str, ...]] = {}
    for item in items:
        role, eq, flags = item.partition("=")
        role = role.strip()
        if not eq or role not in roles:
            raise ValueError(
                f"--role-flags {item!r}: write ROLE=FLAGS with ROLE one of {', '.join(roles)}, "
                "e.g. --role-flags 'prefill=--num-pages 160'"
            )
        words = shlex.split(flags)
        if not words or not words[0].startswith("--"):
            raise ValueError(f"--role-flags {item!r}: FLAGS must start with a --flag")
        out[role] = out.get(role, ()) + tuple(words)
    return out
