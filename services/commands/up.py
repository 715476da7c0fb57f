"""`pdrelay up`: a whole cluster on this machine (etcd, NATS, gateway, prefill, decode, encoder) until Ctrl-C or
`pdrelay down`. The encoder (started with the engine roles) serves the bundled embedding model (/v1/embeddings);
`--encoder 0` leaves it out.

Flags it does not know (e.g. `--page-size 32`, `--model DIR`, `--port 8080`) go to every role that accepts them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# role -> default number of instances; the order is the order of --help
DEFAULT_COUNTS = {
    "gateway": 1,
    "prefill": 1,
    "decode": 1,
    "encoder": 1,
    "kvstore": 1,
    "worker": 0,
    "echo": 0,
    "planner": 0,
}
# Roles whose default count applies only when engine roles run: a control-plane-only cluster (echo, a gateway on
# its own) starts no kvstore and no embedding encoder unless asked (--encoder 1 serves embeddings on its own).
_WITH_ENGINES = ("encoder", "kvstore")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "up",
        help="start a local cluster (etcd, NATS, gateway, prefill, decode, encoder)",
        description=__doc__,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _control_plane_args(p)
    _count_args(p)
    _placement_args(p)
    _run_args(p)
    p.set_defaults(_run=run)


def _control_plane_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", default=None, help="state, logs and configs (default: .run, or $PDRELAY_RUN_DIR)")
    p.add_argument("--cluster", default="default", help="cluster name (etcd prefix, NATS subjects)")
    p.add_argument(
        "--etcd", "--etcd-endpoints", dest="etcd_url", default=None, metavar="URL", help="use this etcd; start none"
    )
    p.add_argument(
        "--nats", "--nats-url", dest="nats_url", default=None, metavar="URL", help="use this NATS server; start none"
    )
    p.add_argument("--etcd-port", type=int, default=0, help="port of the etcd we start (0: 2379 if free)")
    p.add_argument("--nats-port", type=int, default=0, help="port of the nats-server we start (0: 4222 if free)")


def _count_args(p: argparse.ArgumentParser) -> None:
    """--<role> N for every role, and --role-flags."""
    for role, n in DEFAULT_COUNTS.items():
        what = "the control-plane test service" if role == "echo" else f"{role} instances"
        if role == "planner":  # `--planner` alone: one planner scaling prefill and decode (services/planner)
            p.add_argument(
                "--planner",
                type=int,
                nargs="?",
                const=1,
                default=n,
                metavar="N",
                help="planners that scale prefill and decode against TTFT / ITL targets (--planner "
                "alone: 1; planner flags such as --ttft-target-ms go to them)",
            )
            continue
        if role in _WITH_ENGINES:  # serves engines only: none by default in a cluster without any
            p.add_argument(
                f"--{role}",
                type=int,
                default=None,
                metavar="N",
                help=f"{what} (default {n} when prefill, decode or worker instances run, else 0)",
            )
            continue
        p.add_argument(f"--{role}", type=int, default=n, metavar="N", help=f"{what} (default {n})")
    p.add_argument(
        "--role-flags",
        action="append",
        default=[],
        metavar="ROLE=FLAGS",
        help="service flags for one role only, after the shared ones (repeatable), e.g. "
        "--role-flags 'prefill=--num-pages 160'",
    )


def _placement_args(p: argparse.ArgumentParser) -> None:
    """Where the engines run: GPUs, and the plan of a dry run."""
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print what each process would get (role, devices, memory plan, flags) and start nothing; "
        "PDRELAY_SIMULATE_DEVICES=8x80GiB plans for GPUs this host does not have",
    )
    p.add_argument("--json", action="store_true", help="with --dry-run: print the plan as JSON")
    p.add_argument(
        "--base-gpu-id", type=int, default=0, metavar="N", help="first GPU engines get (SGLang's --base-gpu-id)"
    )
    p.add_argument(
        "--gpu-id-step",
        type=int,
        default=1,
        metavar="K",
        help="engines take every K-th GPU from --base-gpu-id (SGLang's --gpu-id-step)",
    )
    p.add_argument(
        "--encoder-gpu",
        choices=("own", "shared", "cpu"),
        default="own",
        help="on a GPU host, encoders get a GPU of their own (default), share an engine's GPU, or run on the CPU",
    )


def _run_args(p: argparse.ArgumentParser) -> None:
    """How the cluster runs: leases, timeouts, restarts, foreground or not, tracing, TLS."""
    p.add_argument("--lease-ttl-s", type=int, default=5, help="etcd lease TTL of every instance")
    p.add_argument("--ready-timeout-s", type=float, default=300.0, help="give up when not ready by then")
    p.add_argument("--stop-timeout-s", type=float, default=30.0, help="SIGKILL what has not stopped by then")
    p.add_argument(
        "--no-restart",
        action="store_true",
        help="report crashed services, etcd and NATS but do not restart them (default: restart with backoff)",
    )
    p.add_argument("--detach", action="store_true", help="run in the background; return once ready")
    p.add_argument("--demo", action="store_true", help="once ready, ask the gateway one question and print the answer")
    p.add_argument("--quiet", action="store_true", help="do not stream the services' logs (they stay in the run dir)")
    p.add_argument(
        "--trace",
        action="store_true",
        help="trace every request into <run-dir>/traces/ (a local OTLP sink); read with `pdrelay trace`",
    )
    p.add_argument(
        "--tls",
        action="store_true",
        help="mutual TLS on every hop (gRPC, etcd, NATS) and HTTPS on the gateway, with a local CA and "
        "certificates made in <run-dir>/certs (`pdrelay certs`)",
    )
    p.add_argument(
        "--netns",
        action="store_true",
        help="every instance on a host of its own: a network namespace each, on a bridge, addresses from "
        "198.18.0.0/15; etcd and NATS on another (needs root; `ip netns exec <client ns> CMD` reaches it)",
    )


def _options(ns: argparse.Namespace, extra: list[str]):  # -> UpOptions
    from shared.cluster.localcluster.plan import PER_INSTANCE_FLAGS, TLS_FLAGS, UpOptions, split_flags
    from shared.cluster.localcluster.rundir import default_run_dir

    counts = {role: getattr(ns, role) for role in DEFAULT_COUNTS}
    engines = any(counts[r] for r in ("prefill", "decode", "worker"))
    for role in _WITH_ENGINES:
        if counts[role] is None:
            counts[role] = DEFAULT_COUNTS[role] if engines else 0
    for role, n in counts.items():
        if n < 0:
            raise ValueError(f"--{role} {n}: the number of instances must be >= 0")
    for name in ("ready_timeout_s", "stop_timeout_s"):
        if getattr(ns, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0 (got {getattr(ns, name)})")
    if ns.base_gpu_id < 0 or ns.gpu_id_step < 1:
        raise ValueError(f"--base-gpu-id {ns.base_gpu_id} --gpu-id-step {ns.gpu_id_step}: use N >= 0 and K >= 1")
    if ns.json and not ns.dry_run:
        raise ValueError("--json prints the plan of --dry-run; add --dry-run")
    for flag in split_flags(extra):
        device = flag[0].split("=", 1)[1] if "=" in flag[0] else (flag[1] if len(flag) > 1 else "")
        if flag[0].split("=", 1)[0] == "--device" and device.startswith("cuda:"):
            raise ValueError(
                f"--device {device}: pdrelay up gives each engine its own GPU; use --base-gpu-id "
                f"{device[5:]} to start from that one"
            )
        if flag[0].split("=", 1)[0] in PER_INSTANCE_FLAGS:
            raise ValueError(f"{flag[0]}: pdrelay up sets it for each instance itself; drop it")
        if ns.tls and flag[0].split("=", 1)[0] in TLS_FLAGS:
            raise ValueError(
                f"{flag[0]}: --tls makes a certificate for every instance; drop it (or --tls, to bring "
                "your own certificates)"
            )
        if ns.netns and flag[0].split("=", 1)[0] in ("--host", "--transfer-host"):
            raise ValueError(f"{flag[0]}: --netns gives every instance an address of its own; drop it")
        if ns.trace and flag[0].split("=", 1)[0] == "--otlp-traces-endpoint":
            raise ValueError(
                "--trace points the services at a local trace sink; drop --otlp-traces-endpoint (or "
                "--trace to send traces to your own collector)"
            )
    role_extra = parse_role_flags(ns.role_flags)
    for flags in role_extra.values():
        for flag in split_flags(flags):
            if flag[0].split("=", 1)[0] in PER_INSTANCE_FLAGS:
                raise ValueError(f"{flag[0]}: pdrelay up sets it for each instance itself; drop it")
    run_dir = Path(ns.run_dir) if ns.run_dir else default_run_dir()
    return UpOptions(
        run_dir=str(run_dir.resolve()),
        cluster=ns.cluster,
        etcd_url=ns.etcd_url,
        nats_url=ns.nats_url,
        etcd_port=ns.etcd_port,
        nats_port=ns.nats_port,
        counts=counts,
        extra=tuple(extra),
        role_extra=role_extra,
        ready_timeout_s=ns.ready_timeout_s,
        stop_timeout_s=ns.stop_timeout_s,
        lease_ttl_s=ns.lease_ttl_s,
        demo=ns.demo,
        echo_log=not ns.quiet,
        trace=ns.trace,
        tls=ns.tls,
        restart=not ns.no_restart,
        base_gpu_id=ns.base_gpu_id,
        gpu_id_step=ns.gpu_id_step,
        encoder_gpu=ns.encoder_gpu,
        netns=ns.netns,
    )


def parse_role_flags(items: list[str]) -> dict[str, tuple[str, ...]]:
    """--role-flags items -> extra flags per role (see plan.parse_role_flags), roles named in DEFAULT_COUNTS order."""
    from shared.cluster.localcluster.plan import parse_role_flags as parse

    return parse(items, tuple(DEFAULT_COUNTS))


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    import asyncio
    import logging

    from shared.cluster.localcluster.supervisor import Supervisor

    try:
        opts = _options(ns, extra)
    except ValueError as e:
        print(f"pdrelay up: error: {e}", file=sys.stderr)
        return 2
    if ns.dry_run:
        return _dry_run(opts, as_json=ns.json)
    from shared.config.devices import SIMULATE_ENV

    if os.environ.get(SIMULATE_ENV, "").strip():
        print(
            f"pdrelay up: error: {SIMULATE_ENV} describes GPUs this host may not have; use it with --dry-run "
            f"(or `pdrelay config show --plan`), or unset it to start the cluster",
            file=sys.stderr,
        )
        return 2
    if ns.detach:
        return _detach(opts)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    return asyncio.run(Supervisor(opts).run())


def _dry_run(opts, as_json: bool) -> int:  # opts: UpOptions
    """Resolve and place every instance, print the plan; nothing is started or written. Exit 1 when a layout or a
    plan does not fit (one line naming the numbers), 2 for bad flags."""
    from shared.cluster.localcluster import dry_run
    from shared.cluster.localcluster.plan import resolve_all
    from shared.config import ConfigError
    from shared.config.probe import probe_from_env

    try:
        probe = probe_from_env(os.environ)
        instances, notes = resolve_all(opts, "http://127.0.0.1:2379", "nats://127.0.0.1:4222")
        rows = dry_run.instance_rows(instances, probe)
    except ConfigError as e:
        print(f"pdrelay up: error: {e}", file=sys.stderr)
        return 1 if "does not fit" in str(e) else 2
    except ValueError as e:  # the host has too few GPUs for the layout
        print(f"pdrelay up: error: {e}", file=sys.stderr)
        return 1
    header = dry_run.host_line(probe)
    print(dry_run.to_json(rows, header) if as_json else dry_run.format_table(rows, header))
    for note in notes:
        print(f"pdrelay up: note: {note}", file=sys.stderr)
    for problem in dry_run.problems(rows):
        print(f"pdrelay up: error: {problem}", file=sys.stderr)
    return 1 if dry_run.problems(rows) else 0


def _detach(opts) -> int:  # opts: UpOptions
    from shared.cluster.localcluster.detached import SUPERVISOR_LOG, NotReady, StartFailed, start
    from shared.cluster.localcluster.summary import format_summary

    try:
        state = start(opts)
    except (ValueError, StartFailed, NotReady) as e:  # already running, exited early, not ready in time
        print(f"pdrelay up: {e}", file=sys.stderr)
        return (e.returncode or 1) if isinstance(e, StartFailed) else 1
    print(format_summary(state))
    print(f"Logs: {Path(opts.run_dir) / SUPERVISOR_LOG}")
    return 0
