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
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from shared.config import ResolvedConfig

from shared.cluster.localcluster.placement import (
    ENCODER_ROLE,
    ENGINE_ROLES,
    EncoderGpu,
    GpuLayout,
    Placement,
    Request,
    next_free,
    place,
    shared_bytes,
)

# Start order; stop order is the reverse (the gateway stops taking requests before the workers go). The planner
# starts last, once there is a cluster to plan for.
ROLE_ORDER = ("kvstore", "encoder", "prefill", "decode", "worker", "echo", "gateway", "planner")
ECHO_MODULE = "services.echo"
# ENGINE_ROLES run an LLM engine: `--threads 0` splits the host's cores among their instances, and each gets GPUs
# of its own (placement.py). Encoders run a model too, but beside LLM engines they take one thread
# (shared.config.passes.resolve_threads).
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
        "--base-gpu-id",
        "--gpu-id-step",
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
    base_gpu_id: int = 0  # the first GPU engines get; then every --gpu-id-step-th one (placement.py)
    gpu_id_step: int = 1
    encoder_gpu: str = EncoderGpu.OWN.value
    netns: bool = False  # every instance on a host (network namespace) of its own (netns_hosts.py)
    hosts: dict[str, str] = msgspec.field(default_factory=dict)  # set by the supervisor: instance id -> address


class InstanceSpec(msgspec.Struct, frozen=True, kw_only=True):
    role: str
    instance_id: str
    argv: tuple[str, ...]  # full command line
    config_path: str = ""
    ready_file: str = ""
    env: dict[str, str] = msgspec.field(default_factory=dict)  # set in the child's environment (CUDA placement)
    devices: tuple[str, ...] = ()  # cuda:N of each of its GPUs (host numbering); empty: none


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
    if iid in opts.hosts:  # --netns: the instance's own host, bound and advertised
        flags += ["--host", opts.hosts[iid]]
        if "transfer" in groups:
            flags += ["--transfer-host", opts.hosts[iid]]
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


class ResolvedInstance(msgspec.Struct, frozen=True, kw_only=True):
    """One instance before anything is written or started: its resolved config (None for echo), the flags and
    environment `pdrelay up` gives it, and its GPUs."""

    role: str
    instance_id: str
    index: int
    argv: tuple[str, ...]  # the per-instance flags
    user_flags: tuple[str, ...] = ()  # the user's flags this role accepts (shown by --dry-run)
    config_json: str = ""
    placement: Placement | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)

    def config(self) -> ResolvedConfig:
        from shared.config import ResolvedConfig

        return ResolvedConfig.from_json(self.config_json)


def _context(opts: UpOptions, env: Mapping[str, str], reserved: int = 0):  # -> PassContext
    from shared.config import PassContext
    from shared.config.probe import probe_from_env
    from shared.modelspec.bundled import prepared_model_dir

    return PassContext(
        probe=probe_from_env(env),
        engines_on_host=sum(opts.counts.get(r, 0) for r in ENGINE_ROLES),
        encoders_on_host=opts.counts.get(ENCODER_ROLE, 0),
        locate_model=prepared_model_dir,
        reserved_gpu_bytes=reserved,
    )


def _user_flags(role: str, opts: UpOptions) -> list[str]:
    return [*flags_for_role(role, opts.extra), *opts.role_extra.get(role, ())]


def gpu_layout(opts: UpOptions, env: Mapping[str, str]) -> tuple[GpuLayout | None, list[Request]]:
    """(the host's GPU layout, the processes that want GPUs in start order), or (None, []) when no engine or
    encoder role resolves to cuda (a CPU host: nothing is placed and nothing changes). Resolves each such role once
    with the user's flags, so a bad flag fails here, before anything starts."""
    from shared.config import resolve

    requests: list[Request] = []
    ctx = _context(opts, env)
    for role in ROLE_ORDER:
        n = opts.counts.get(role, 0)
        if n <= 0 or role not in (*ENGINE_ROLES, ENCODER_ROLE) or not role_available(role):
            continue
        cfg = resolve(role, _user_flags(role, opts), env, ctx=ctx)
        if cfg.device.device != "cuda":
            continue
        ranks = cfg.parallel.tp_size * cfg.parallel.dp_size if cfg.has("parallel") else 1
        requests += [Request(f"{role}-{i + 1}", role, ranks) for i in range(n)]
    if not requests:
        return None, []
    count = ctx.probe.cuda_device_count()
    return GpuLayout(count, opts.base_gpu_id, opts.gpu_id_step, EncoderGpu(opts.encoder_gpu)), requests


def _placement_flags(p: Placement | None, opts: UpOptions) -> list[str]:
    if p is None:
        return []
    if p.cpu:
        return ["--device", "cpu"]
    flags = ["--base-gpu-id", str(p.gpus[0])]
    return flags + (["--gpu-id-step", str(opts.gpu_id_step)] if len(p.gpus) > 1 and opts.gpu_id_step != 1 else [])


def resolve_instance(
    role: str,
    index: int,
    opts: UpOptions,
    etcd_url: str,
    nats_url: str,
    env: Mapping[str, str] | None = None,
    *,
    placement: Placement | None = None,
    on_gpu_host: bool = False,
    reserved_bytes: int = 0,
) -> ResolvedInstance:
    """Instance number `index` (0-based) of `role`, resolved (defaults < --config < PDRELAY_* env < the user's flags
    < per-instance settings) but not written. Raises shared.config.ConfigError for bad service flags."""
    from shared.config import resolve

    env = os.environ if env is None else env
    iid = f"{role}-{index + 1}"
    per_instance = _instance_flags(role, iid, opts, etcd_url, nats_url, index) + _placement_flags(placement, opts)
    child_env = placement.env() if placement is not None and placement.gpus else {}
    if on_gpu_host and not child_env:
        child_env = {"CUDA_VISIBLE_DEVICES": ""}  # no GPU: never a context on GPU 0
    if role == "echo":
        return ResolvedInstance(role=role, instance_id=iid, index=index, argv=tuple(per_instance), env=child_env)
    user = _user_flags(role, opts)
    cfg = resolve(role, [*user, *per_instance], env, ctx=_context(opts, env, reserved_bytes))
    return ResolvedInstance(
        role=role,
        instance_id=iid,
        index=index,
        argv=tuple(per_instance),
        user_flags=tuple(user),
        config_json=cfg.to_json(),
        placement=placement,
        env=child_env,
    )


def write_spec(inst: ResolvedInstance, opts: UpOptions) -> InstanceSpec:
    """The launch spec of a resolved instance; writes its resolved config to <run-dir>/config/<id>.json."""
    run_dir = Path(opts.run_dir)
    ready_file = str((run_dir / "ready" / f"{inst.instance_id}.json").resolve())
    devices = inst.placement.devices if inst.placement is not None else ()
    if inst.role == "echo":
        argv = (sys.executable, "-m", ECHO_MODULE, *inst.argv, "--ready-file", ready_file)
        return InstanceSpec(role=inst.role, instance_id=inst.instance_id, argv=argv, ready_file=ready_file)
    cfg_path = (run_dir / "config" / f"{inst.instance_id}.json").resolve()
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(inst.config_json)
    argv = (
        sys.executable,
        "-m",
        f"services.{inst.role}",
        "--resolved-config",
        str(cfg_path),
        "--ready-file",
        ready_file,
    )
    return InstanceSpec(
        role=inst.role,
        instance_id=inst.instance_id,
        argv=argv,
        config_path=str(cfg_path),
        ready_file=ready_file,
        env=inst.env,
        devices=devices,
    )


def build_spec(
    role: str,
    index: int,
    opts: UpOptions,
    etcd_url: str,
    nats_url: str,
    env: Mapping[str, str] | None = None,
    *,
    placement: Placement | None = None,
    on_gpu_host: bool = False,
) -> InstanceSpec:
    """The launch spec of instance number `index` (0-based) of `role`; writes its resolved config file.

    Raises shared.config.ConfigError for bad service flags (before anything is started)."""
    inst = resolve_instance(role, index, opts, etcd_url, nats_url, env, placement=placement, on_gpu_host=on_gpu_host)
    return write_spec(inst, opts)


def resolve_all(
    opts: UpOptions, etcd_url: str, nats_url: str, env: Mapping[str, str] | None = None
) -> tuple[list[ResolvedInstance], list[str]]:
    """(every instance resolved and placed, in start order; notes about skipped roles). ValueError when the host
    has too few GPUs for the layout; ConfigError for bad flags or a memory plan that does not fit."""
    env = os.environ if env is None else env
    layout, requests = gpu_layout(opts, env)
    placements = place(requests, layout) if layout is not None else {}
    out: list[ResolvedInstance] = []
    notes: list[str] = []
    for role in ROLE_ORDER:
        n = opts.counts.get(role, 0)
        if n <= 0:
            continue
        if not role_available(role):
            notes.append(f"{role}: not in this build yet (no services.{role}.__main__); skipped {n} instance(s)")
            continue
        for i in range(n):
            iid = f"{role}-{i + 1}"
            out.append(
                resolve_instance(
                    role,
                    i,
                    opts,
                    etcd_url,
                    nats_url,
                    env,
                    placement=placements.get(iid),
                    on_gpu_host=layout is not None,
                    reserved_bytes=shared_bytes(placements, iid),
                )
            )
    return out, notes


def scale_placement(
    role: str, opts: UpOptions, used: set[int], env: Mapping[str, str] | None = None
) -> tuple[Placement | None, bool]:
    """(the placement of one more instance of `role` started by `pdrelay scale`, whether the host has GPUs in the
    layout): the first free GPUs for an engine or encoder on a GPU host (ValueError when none is left)."""
    env = os.environ if env is None else env
    one = msgspec.structs.replace(opts, counts={r: int(r == role) for r in opts.counts})
    layout, requests = gpu_layout(one, env) if role in (*ENGINE_ROLES, ENCODER_ROLE) else (None, [])
    if layout is None:
        return None, bool(used)
    if role == ENCODER_ROLE and layout.encoder == EncoderGpu.CPU:
        return Placement(cpu=True), True
    return Placement(next_free(layout, used, requests[0].ranks)), True


def plan(opts: UpOptions, etcd_url: str, nats_url: str) -> tuple[list[InstanceSpec], list[str]]:
    """(launch specs in start order, notes about skipped roles)."""
    instances, notes = resolve_all(opts, etcd_url, nats_url)
    return [write_spec(i, opts) for i in instances], notes


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
