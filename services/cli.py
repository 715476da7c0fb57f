"""The `pdrelay` command: each subcommand lives in its own module under services/commands/.

Every command module exposes `add_parser(subparsers)` (registering its own name, and for bench commands its name
under `bench`) and `run(ns, extra) -> int`; `extra` holds the flags the command did not declare itself, which
commands that take service flags hand to the config resolver (so a foreign flag gets the resolver's message).
Command modules import heavy libraries (torch, grpc) inside run(), keeping `pdrelay --help` fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Top-level commands, in the order `pdrelay --help` lists them.
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("up", "services.commands.up", "start a local cluster (etcd, NATS, gateway, prefill, decode, encoder)"),
    ("down", "services.commands.down", "stop the local cluster started by `pdrelay up`"),
    ("status", "services.commands.status", "list the instances of a running cluster"),
    ("scale", "services.commands.scale", "add or drain instances: pdrelay scale prefill=2 decode=3"),
    ("serve", "services.commands.serve", "run one service in the foreground: pdrelay serve <role> [flags]"),
    ("config", "services.commands.config_show", "show the resolved configuration of a role"),
    ("model", "services.commands.model_prepare", "prepare the bundled model, or check a model directory"),
    ("trace", "services.commands.trace", "print one request's span tree (needs `pdrelay up --trace`)"),
    ("certs", "services.commands.certs", "make a local CA and per-service certificates (mutual TLS)"),
    ("planner", "services.commands.planner", "the planner's decisions (log) and manual pins (unpin)"),
    ("chaos", "services.commands.chaos", "fault scenarios against a running local cluster, with a results table"),
)
BENCH_COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("engine", "services.commands.bench_engine", "engine throughput vs HF generate"),
    ("transfer", "services.commands.bench_transfer", "KV transfer GB/s vs memcpy"),
    ("serve", "services.commands.bench_serve", "serving benchmark against an OpenAI-compatible endpoint"),
    ("control-plane", "services.commands.bench_control_plane", "etcd/NATS/gRPC control-plane latencies"),
    ("handoff", "services.commands.bench_handoff", "disaggregated vs colocated TTFT (KV hand-off overhead)"),
    ("trace", "services.commands.bench_trace", "tracing overhead: throughput with tracing off vs on"),
    ("embed", "services.commands.bench_embed", "embeddings throughput vs sentence-transformers encode per request"),
)


def _register(sub: argparse._SubParsersAction, name: str, module: str, help_text: str) -> None:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:  # a real missing dependency inside the module: say so instead of hiding it
            raise
        p = sub.add_parser(name, help=f"{help_text} (not available in this build)")
        p.set_defaults(_run=lambda ns, extra, n=name: _unavailable(n))
        return
    mod.add_parser(sub)


def _unavailable(name: str) -> int:
    print(f"pdrelay: '{name}' is not available in this build", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdrelay",
        description="pdrelay: prefill/decode-disaggregated LLM serving. Run `pdrelay <command> --help` for details.",
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    sub.required = True
    for name, module, help_text in COMMANDS:
        _register(sub, name, module, help_text)
    bench = sub.add_parser("bench", help="benchmarks that print ratios against a peer measured in the same run")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="<benchmark>")
    bench_sub.required = True
    for name, module, help_text in BENCH_COMMANDS:
        _register(bench_sub, name, module, help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns, extra = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    run = getattr(ns, "_run", None)
    if run is None:
        parser.error(f"unknown arguments: {' '.join(extra)}")
    try:
        return int(run(ns, extra) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
