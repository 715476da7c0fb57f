"""Tracing overhead: the same serving workload against a cluster with tracing off and one tracing every request.

    python -m bench.trace_overhead [--model M] [--num-prompts 24] [--max-concurrency 4] [--rounds 2] [--quick]

Starts etcd, NATS, a trace sink process (the OTLP receiver of `pdrelay up --trace`, writing JSON lines), and two
disaggregated clusters side by side (gateway + prefill + decode each, every service on --threads 1): "untraced"
(no --otlp-traces-endpoint: the no-op tracer) and "traced" (--trace-sample-ratio 1 to the sink). The workload is
`pdrelay bench serve`'s (bench/serve/: random prompts of --input-len tokens, streamed completions of
--output-len tokens, a concurrency cap), run once per cluster per round, in alternating order (off/on, on/off, ...)
so that drift on a shared box hits both alike. Printed: vLLM's serving metrics of each mode side by side with the
traced/untraced ratios, the spans received per traced request, and

    overhead = 1 - request_throughput(traced) / request_throughput(untraced)     target <= 5%
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.entry import bench_main
from shared.cluster.localcluster.service_process import ServiceProcess, python_cmd, stop_all, wait_all_ready

TARGET_OVERHEAD = 0.05
READY_TIMEOUT_S = 240.0
MODES = ("untraced", "traced")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default="bundled:smollm2-135m-instruct",
        help="model of every service: 'bundled:smollm2-135m-instruct' or a local model directory",
    )
    p.add_argument("--num-prompts", type=int, default=24, help="requests per mode per round")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens (random dataset)")
    p.add_argument("--output-len", type=int, default=32, help="generated tokens per request")
    p.add_argument("--max-concurrency", type=int, default=4, help="requests in flight at once")
    p.add_argument("--rounds", type=int, default=2, help="measured rounds (each runs both modes)")
    p.add_argument("--transfer-backend", default="nixl", choices=("nixl", "mooncake"))
    p.add_argument("--threads", type=int, default=1, help="--threads of every service")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="smoke run: 8 prompts of 64 tokens, 8 new, 1 round")
    p.add_argument("--json-out", default=None, help="also write the results as JSON to this file")


# ---- processes --------------------------------------------------------------------------------------------------
def _service(role: str, name: str, args: Sequence[str], tmp: Path) -> ServiceProcess:
    """One pdrelay service process: its output in tmp, ended by the kernel if this process dies."""
    return ServiceProcess(name, python_cmd(f"services.{role}", *args, "--instance-id", name), tmp, tie_to_parent=True)


def _cluster(mode: str, common: Sequence[str], engine: Sequence[str], endpoint: str, tmp: Path) -> list[ServiceProcess]:
    traced = ["--otlp-traces-endpoint", endpoint, "--trace-sample-ratio", "1"] if mode == "traced" else []
    args = [*common, "--cluster", f"bench-{mode}", *traced]
    return [
        _service("prefill", f"{mode}-prefill", [*args, *engine], tmp),
        _service("decode", f"{mode}-decode", [*args, *engine], tmp),
        _service("gateway", f"{mode}-gateway", [*args, "--port", "0"], tmp),
    ]


# ---- workload ---------------------------------------------------------------------------------------------------
async def _measure(gateways: dict[str, str], ns: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    from bench.serve.client import RequestOptions, served_model
    from bench.serve.datasets import BenchTokenizer, random_dataset
    from bench.serve.http_client import make_http
    from bench.serve.runner import RunOutcome, Workload, run_workload, warm_up

    tok = BenchTokenizer.from_dir(model_dir)
    https = {m: make_http("raw", f"http://{addr}") for m, addr in gateways.items()}
    try:
        model = await served_model(https["untraced"])
        opts = RequestOptions(endpoint="/v1/completions", model=model)
        for mode in MODES:
            warm = random_dataset(
                tok,
                num_prompts=ns.max_concurrency,
                input_len=ns.input_len,
                output_len=ns.output_len,
                seed=ns.seed + 999,
            )
            await warm_up(
                https[mode], opts, warm, max_concurrency=ns.max_concurrency, timeout_s=120, count_tokens=tok.count
            )
        outcomes: dict[str, list[RunOutcome]] = {m: [] for m in MODES}
        for r in range(ns.rounds):
            # fresh prompts every round (no prefix-cache hits across rounds), the same ones for both modes
            reqs = random_dataset(
                tok, num_prompts=ns.num_prompts, input_len=ns.input_len, output_len=ns.output_len, seed=ns.seed + r
            )
            workload = Workload(tuple(reqs), max_concurrency=ns.max_concurrency, timeout_s=300)
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                out = await run_workload(https[mode], opts, workload, count_tokens=tok.count)
                outcomes[mode].append(out)
                print(
                    f"  round {r + 1}/{ns.rounds} {mode:>9}: {len([x for x in out.results if x.success])} ok in "
                    f"{out.duration_s:.1f} s",
                    file=sys.stderr,
                )
        return outcomes
    finally:
        for h in https.values():
            await h.aclose()


def _summaries(outcomes: dict[str, Any]) -> dict[str, dict[str, float | int]]:
    from bench.serve.metrics import compute_metrics

    out = {}
    for mode, runs in outcomes.items():
        results = [x for run in runs for x in run.results]
        out[mode] = compute_metrics(results, sum(run.duration_s for run in runs), percentiles=(50, 99))
    return out


def run(ns: argparse.Namespace) -> int:
    from shared.cluster.localcluster.servers import EtcdServer, NatsServer, free_port
    from shared.cluster.localcluster.tracesink import TraceSink
    from shared.modelspec.bundled import resolve_model_path

    if ns.quick:
        ns.num_prompts, ns.input_len, ns.output_len, ns.rounds = 8, 64, 8, 1
    for name in ("num_prompts", "input_len", "output_len", "max_concurrency", "rounds", "threads"):
        if getattr(ns, name) < 1:
            print(f"bench trace_overhead: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    model_dir = resolve_model_path(ns.model)
    tmp = Path(tempfile.mkdtemp(prefix="pdrelay-trace-bench-"))
    etcd = EtcdServer(data_dir=tmp / "etcd", port=free_port())
    nats = NatsServer(data_dir=tmp / "nats", port=free_port())
    spans_path = tmp / "spans.jsonl"
    sink = TraceSink(data_dir=tmp, port=free_port(), out=spans_path)
    services: list[ServiceProcess] = []
    try:
        for server in (etcd, nats, sink):
            server.start()
        common = [
            "--etcd-endpoints",
            etcd.url,
            "--nats-url",
            nats.url,
            "--model",
            str(model_dir),
            "--threads",
            str(ns.threads),
            "--lease-ttl-s",
            "5",
        ]
        engine = ["--transfer-backend", ns.transfer_backend]
        print(f"starting two clusters (untraced, traced) on {model_dir.name} ...", file=sys.stderr)
        for mode in MODES:
            services += _cluster(mode, common, engine, sink.endpoint, tmp)
        wait_all_ready(services, READY_TIMEOUT_S)
        gateways = {s.name.split("-")[0]: s.ready.http for s in services if s.name.endswith("gateway") and s.ready}
        outcomes = asyncio.run(_measure(gateways, ns, model_dir))
        time.sleep(1.5)  # the last spans leave the services' exporters (0.5 s batches)
    finally:
        stop_all(services, 15.0)
        for server in (sink, nats, etcd):
            server.stop()
    summaries = _summaries(outcomes)
    return _report(ns, summaries, spans_path)


def _report(ns: argparse.Namespace, summaries: dict[str, dict[str, float | int]], spans_path: Path) -> int:
    from bench.serve.report import format_table
    from shared.telemetry.tree import load, requests

    traced, untraced = summaries["traced"], summaries["untraced"]
    records = load(spans_path) if spans_path.exists() else []
    traced_requests = [r for r in requests(records) if r.request_id]
    per_request = len(records) / len(traced_requests) if traced_requests else 0.0
    overhead = 1.0 - float(traced["request_throughput"]) / float(untraced["request_throughput"])
    print(
        format_table(
            "Tracing overhead (same workload, one run)",
            traced,
            (50, 99),
            compare=untraced,
            labels=("traced", "untraced"),
        )
    )
    print(
        f"spans received: {len(records)} for {len(traced_requests)} traced requests ({per_request:.1f} per "
        f"request); from the untraced cluster: {sum(1 for r in records if r.instance.startswith('untraced-'))}"
    )
    verdict = "OK" if overhead <= TARGET_OVERHEAD else "ABOVE TARGET"
    print(f"request throughput overhead of tracing: {overhead:+.1%} (target <= {TARGET_OVERHEAD:.0%}): {verdict}")
    if ns.json_out:
        Path(ns.json_out).write_text(
            json.dumps(
                {
                    "settings": {k: v for k, v in vars(ns).items() if k != "func"},
                    "untraced": untraced,
                    "traced": traced,
                    "overhead": overhead,
                    "spans": len(records),
                    "traced_requests": len(traced_requests),
                },
                indent=2,
            )
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("bench.trace_overhead", __doc__, add_arguments, run, argv, whole_doc=True)


if __name__ == "__main__":
    sys.exit(main())
