"""Serving benchmark: an OpenAI-compatible streaming client that measures TTFT, TPOT, ITL and E2E latency,
throughput and goodput, in vLLM's vocabulary and JSON keys.

    pdrelay bench serve --base-url http://127.0.0.1:8000 --num-prompts 200 --max-concurrency 16
    pdrelay bench serve --mock-workers --random-output-len 8 --max-concurrency 1       # the gateway alone
    pdrelay bench serve --base-url URL --compare-url http://127.0.0.1:8001 --compare-pid PID   # side by side
    pdrelay bench serve --mock-workers --peer-cmd 'bench/dynamo_peer.sh {port} {pid_file}' \
        --random-output-len 8 --max-concurrency 1 --throughput-concurrency 32       # vs Dynamo, one run
    pdrelay bench serve --compare-policies kv_aware,round_robin --dataset shared-prefix   # a cluster per policy
    pdrelay bench serve --compare-peer vllm --peer-python VENV/bin/python --random-input-len 128 \
        --num-prompts 64 --max-concurrency 16 --compare-range-ratios 0,0.5   # pdrelay, then vLLM, same box

It points at pdrelay's gateway, `vllm serve`, sglang-router or a Dynamo frontend alike. `--mock-workers` starts
pdrelay's gateway over mock workers itself and reports its CPU per request; `--compare-url` runs the same
workload (same prompts, same arrival times) against a second endpoint right after the first and prints the
ratios; `--peer-cmd` starts that second endpoint itself (bench/serve/peer.py) and reads its front process's
CPU too. `--throughput-concurrency N` runs the workload once more per endpoint at concurrency N. Ctrl-C stops
the run and prints what finished (marked partial).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.entry import bench_main
from bench.serve.client import ENDPOINTS
from bench.serve.compare import add_compare_arguments, run_compare
from bench.serve.datasets import (
    DATASETS,
    BenchRequest,
    BenchTokenizer,
    multi_turn_dataset,
    random_dataset,
    shared_prefix_dataset,
)
from bench.serve.http_client import HTTP_CLIENTS
from bench.serve.kvstore import add_kvstore_arguments, run_kvstore_comparison
from bench.serve.measure import Target, _log, _new_loop, measure
from bench.serve.metrics import Slo, parse_percentiles, parse_slo
from bench.serve.mm import random_mm_dataset
from bench.serve.peer import PeerProcess
from bench.serve.policies import add_policy_arguments, run_policies
from bench.serve.procs import MockGateway
from bench.serve.report import detailed, format_table, headline, ratios
from bench.serve.runner import RunOutcome
from bench.urls import openai_base_url

DEFAULT_MODEL = "bundled:smollm2-135m-instruct"


def _rate(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 requests/s or inf (got {text})")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("target")
    t.add_argument("--base-url", default=None, help="the endpoint to measure (default http://127.0.0.1:8000)")
    t.add_argument("--endpoint", default="/v1/completions", choices=ENDPOINTS, help="API to call")
    t.add_argument("--model", default=None, help="model name to send (default: the first GET /v1/models lists)")
    t.add_argument(
        "--tokenizer",
        default=None,
        metavar="DIR",
        help=f"the served model's directory, for building prompts (default: {DEFAULT_MODEL})",
    )
    t.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    t.add_argument(
        "--http-client",
        default="raw",
        choices=HTTP_CLIENTS,
        help="raw: lean asyncio HTTP/1.1 client (default); httpx: the reference client",
    )
    t.add_argument(
        "--tcp-quickack",
        action="store_true",
        help="raw client: ACK every read at once (servers that leave Nagle on, like Dynamo's frontend, "
        "otherwise stall ~40 ms on the client's delayed ACK)",
    )
    t.add_argument(
        "--target-pid", type=int, default=None, help="pid of the target's front process, to report its CPU per request"
    )
    d = p.add_argument_group("workload")
    d.add_argument("--dataset", "--dataset-name", dest="dataset", default="random", choices=DATASETS)
    d.add_argument("--num-prompts", type=int, default=200, help="requests in the measured run")
    d.add_argument(
        "--random-input-len",
        type=int,
        default=256,
        help="prompt tokens (random), question tokens (shared-prefix), user tokens per turn (multi-turn)",
    )
    d.add_argument("--random-output-len", type=int, default=64, help="output tokens per request (ignore_eos)")
    d.add_argument(
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="random: lengths uniform in [len*(1-r), len*(1+r)] (0: fixed)",
    )
    d.add_argument(
        "--random-prompt-format",
        default="text",
        choices=("text", "ids"),
        help="random: text of exactly N tokens, or N token ids (completions only)",
    )
    d.add_argument("--shared-prefix-groups", type=int, default=8, help="shared-prefix: system prompts")
    d.add_argument(
        "--shared-prefix-prompts-per-group",
        type=int,
        default=None,
        help="shared-prefix: questions per system prompt (default: num-prompts / groups)",
    )
    d.add_argument("--shared-prefix-system-len", type=int, default=512, help="shared-prefix: system prompt tokens")
    d.add_argument("--multi-turn-turns", type=int, default=4, help="multi-turn: user turns per conversation")
    d.add_argument("--mm-images-per-request", type=int, default=1, help="random-mm: images per request")
    d.add_argument(
        "--mm-repeat-ratio",
        type=float,
        default=0.0,
        help="random-mm: share of images drawn from a small reused pool (the rest are unique)",
    )
    d.add_argument("--mm-pool-size", type=int, default=4, help="random-mm: distinct images in the reused pool")
    d.add_argument("--mm-image-size", type=int, default=64, help="random-mm: image width and height (pixels)")
    d.add_argument("--seed", type=int, default=0, help="seeds prompts, lengths and arrival times")
    r = p.add_argument_group("load")
    r.add_argument(
        "--request-rate", type=_rate, default=math.inf, help="requests/s, Poisson arrivals (default inf: all at once)"
    )
    r.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the arrival gaps (1: Poisson)")
    r.add_argument("--max-concurrency", type=int, default=None, help="cap on requests in flight")
    r.add_argument("--num-warmups", type=int, default=2, help="requests sent and discarded before measuring")
    r.add_argument("--timeout-s", type=float, default=120.0, help="per-request limit (a late request fails)")
    r.add_argument(
        "--total-timeout-s",
        type=float,
        default=1800.0,
        help="limit for the whole benchmark; results so far are printed, marked partial",
    )
    r.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="let the model stop at EOS (output lengths then vary)",
    )
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--extra-body", default=None, metavar="JSON", help="fields merged into every request body")
    m = p.add_argument_group("metrics and output")
    m.add_argument(
        "--slo",
        default=None,
        metavar="ttft_ms=..,tpot_ms=..",
        help="objectives for goodput (request_goodput): ttft_ms, tpot_ms, e2el_ms",
    )
    m.add_argument("--metric-percentiles", default="99", help="percentiles to report, e.g. 50,90,99")
    m.add_argument(
        "--output-json",
        "--result-file",
        dest="output_json",
        default=None,
        metavar="PATH",
        help="write the results as JSON (vLLM's keys)",
    )
    m.add_argument("--save-detailed", action="store_true", help="add per-request lists (ttfts, itls, texts, ...)")
    c = p.add_argument_group("mock workers and comparison")
    c.add_argument(
        "--mock-workers",
        action="store_true",
        help="start pdrelay's gateway over mock workers on a free port and measure it",
    )
    c.add_argument("--mock-token-delay-ms", type=float, default=0.0, help="mock: delay between tokens")
    c.add_argument("--mock-first-token-delay-ms", type=float, default=0.0, help="mock: delay before the first")
    c.add_argument("--compare-url", default=None, help="run the same workload against this endpoint too")
    c.add_argument("--compare-model", default=None, help="model name at --compare-url (default: its first)")
    c.add_argument("--compare-pid", type=int, default=None, help="pid of the compare endpoint's front process")
    c.add_argument(
        "--peer-cmd",
        default=None,
        metavar="CMD",
        help="start the compare endpoint with this shell command ({port}: its HTTP port; {pid_file}: "
        "where it may write 'front PID' / 'worker PID' lines), e.g. "
        "'bench/dynamo_peer.sh {port} {pid_file}'",
    )
    c.add_argument("--peer-label", default="peer", help="name of the compare endpoint in the table")
    c.add_argument(
        "--peer-start-timeout-s", type=float, default=180.0, help="how long --peer-cmd may take to list a model"
    )
    c.add_argument(
        "--throughput-concurrency",
        type=int,
        default=None,
        metavar="N",
        help="after the main run, run the same workload at concurrency N against every endpoint",
    )
    add_policy_arguments(p)
    add_compare_arguments(p)
    add_kvstore_arguments(p)


def build_requests(ns: argparse.Namespace, tok: BenchTokenizer) -> list[BenchRequest]:
    if ns.random_prompt_format == "ids":
        if ns.dataset != "random":
            raise ValueError(f"--random-prompt-format ids applies to --dataset random only (got {ns.dataset})")
        if ns.endpoint != "/v1/completions":
            raise ValueError("--random-prompt-format ids needs --endpoint /v1/completions (chat takes text)")
    if ns.dataset == "random":
        return random_dataset(
            tok,
            num_prompts=ns.num_prompts,
            input_len=ns.random_input_len,
            output_len=ns.random_output_len,
            seed=ns.seed,
            range_ratio=ns.random_range_ratio,
            token_ids=ns.random_prompt_format == "ids",
        )
    if ns.dataset == "shared-prefix":
        per_group = ns.shared_prefix_prompts_per_group or max(1, math.ceil(ns.num_prompts / ns.shared_prefix_groups))
        return shared_prefix_dataset(
            tok,
            groups=ns.shared_prefix_groups,
            prompts_per_group=per_group,
            system_len=ns.shared_prefix_system_len,
            question_len=ns.random_input_len,
            output_len=ns.random_output_len,
            seed=ns.seed,
        )
    if ns.dataset == "random-mm":
        if ns.endpoint != "/v1/chat/completions":
            raise ValueError("--dataset random-mm needs --endpoint /v1/chat/completions (images are chat parts)")
        return random_mm_dataset(
            tok,
            num_prompts=ns.num_prompts,
            input_len=ns.random_input_len,
            output_len=ns.random_output_len,
            seed=ns.seed,
            images_per_request=ns.mm_images_per_request,
            repeat_ratio=ns.mm_repeat_ratio,
            pool_size=ns.mm_pool_size,
            image_size=ns.mm_image_size,
        )
    return multi_turn_dataset(
        tok,
        num_prompts=ns.num_prompts,
        turns=ns.multi_turn_turns,
        user_len=ns.random_input_len,
        output_len=ns.random_output_len,
        seed=ns.seed,
    )


def _settings(ns: argparse.Namespace, tokenizer_dir: Path, slo: Slo | None) -> dict[str, Any]:
    return {
        "date": datetime.now(UTC).strftime("%Y%m%d-%H%M%S"),
        "backend": "openai-chat" if ns.endpoint.endswith("chat/completions") else "openai",
        "endpoint": ns.endpoint,
        "tokenizer_id": str(tokenizer_dir),
        "dataset": ns.dataset,
        "num_prompts": ns.num_prompts,
        "random_input_len": ns.random_input_len,
        "random_output_len": ns.random_output_len,
        "request_rate": ns.request_rate if math.isfinite(ns.request_rate) else "inf",
        "burstiness": ns.burstiness,
        "max_concurrency": ns.max_concurrency,
        "num_warmups": ns.num_warmups,
        "seed": ns.seed,
        "http_client": ns.http_client,
        "tcp_quickack": ns.tcp_quickack,
        "mock_workers": ns.mock_workers,
        "slo": slo.as_dict() if slo is not None else None,
    }


def _validate(ns: argparse.Namespace) -> tuple[Slo | None, tuple[float, ...]]:
    for flag, name in (("--base-url", "base_url"), ("--compare-url", "compare_url")):
        if getattr(ns, name):  # http://host:port, with or without /v1: the client appends /v1/...
            setattr(ns, name, openai_base_url(flag, getattr(ns, name)))
    if ns.mock_workers and ns.base_url:
        raise ValueError("--mock-workers starts its own gateway; drop --base-url (or drop --mock-workers)")
    if ns.peer_cmd is not None and ns.compare_url is not None:
        raise ValueError("--peer-cmd starts the compare endpoint itself; drop --compare-url (or --peer-cmd)")
    if ns.peer_cmd is not None and "{port}" not in ns.peer_cmd:
        raise ValueError(f"--peer-cmd {ns.peer_cmd!r} must contain {{port}} (the port the peer serves HTTP on)")
    if ns.throughput_concurrency is not None and ns.throughput_concurrency < 1:
        raise ValueError(f"--throughput-concurrency must be >= 1 (got {ns.throughput_concurrency})")
    if not ns.peer_start_timeout_s > 0:
        raise ValueError(f"--peer-start-timeout-s must be > 0 (got {ns.peer_start_timeout_s})")
    if ns.tcp_quickack and ns.http_client != "raw":
        raise ValueError("--tcp-quickack needs --http-client raw")
    if ns.num_warmups < 0:
        raise ValueError(f"--num-warmups must be >= 0 (got {ns.num_warmups})")
    if not ns.total_timeout_s > 0:
        raise ValueError(f"--total-timeout-s must be > 0 (got {ns.total_timeout_s})")
    if ns.extra_body is not None:
        try:
            if not isinstance(json.loads(ns.extra_body), dict):
                raise ValueError
        except ValueError:
            raise ValueError(f"--extra-body {ns.extra_body!r} must be a JSON object, e.g. '{{\"top_k\": 1}}'") from None
    for name in ("mock_token_delay_ms", "mock_first_token_delay_ms"):
        if getattr(ns, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0 (got {getattr(ns, name)})")
    slo = parse_slo(ns.slo) if ns.slo else None
    return slo, parse_percentiles(ns.metric_percentiles)


async def _bench(
    ns: argparse.Namespace,
    targets: list[Target],
    requests: list[BenchRequest],
    tok: BenchTokenizer,
    slo: Slo | None,
    percentiles: tuple[float, ...],
) -> list[list[tuple[dict[str, Any], RunOutcome]]]:
    """One phase per concurrency (the main one, then --throughput-concurrency); every target in each phase,
    back to back, so that the endpoints see the same box load as nearly as possible."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        _log("stopping: printing what finished (Ctrl-C again to abort)")
        stop.set()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)  # a second Ctrl-C is a KeyboardInterrupt

    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread: no Ctrl-C handling
            pass
    deadline = time.monotonic() + ns.total_timeout_s
    phases = [ns.max_concurrency]
    if ns.throughput_concurrency is not None:
        phases.append(ns.throughput_concurrency)
    out: list[list[tuple[dict[str, Any], RunOutcome]]] = []
    try:
        for concurrency in phases:
            phase: list[tuple[dict[str, Any], RunOutcome]] = []
            for target in targets:
                if stop.is_set() or time.monotonic() >= deadline:
                    break
                phase.append(
                    await measure(
                        target,
                        requests,
                        ns,
                        tok=tok,
                        stop=stop,
                        deadline=deadline,
                        slo=slo,
                        percentiles=percentiles,
                        max_concurrency=concurrency,
                    )
                )
            if phase:
                out.append(phase)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
    return out


def run(ns: argparse.Namespace) -> int:
    try:
        slo, percentiles = _validate(ns)
    except ValueError as e:
        print(f"pdrelay bench serve: {e}", file=sys.stderr)
        return 2
    if ns.tokenizer:
        tokenizer_dir = Path(ns.tokenizer)
    else:
        from shared.modelspec.bundled import resolve_model_path

        tokenizer_dir = Path(resolve_model_path(DEFAULT_MODEL))
    gateway: MockGateway | None = None
    peer: PeerProcess | None = None
    try:
        tok = BenchTokenizer.from_dir(tokenizer_dir)
        if ns.compare_peer:
            return run_compare(ns, tok, tokenizer_dir, _settings(ns, tokenizer_dir, slo), slo, percentiles)
        requests = build_requests(ns, tok)
        if ns.compare_policies:
            return run_policies(ns, requests, tok, tokenizer_dir, _settings(ns, tokenizer_dir, slo), slo, percentiles)
        if ns.compare_kvstore:
            return run_kvstore_comparison(
                ns, requests, tok, tokenizer_dir, _settings(ns, tokenizer_dir, slo), slo, percentiles
            )
        if ns.mock_workers:
            gateway = MockGateway(
                tokenizer_dir, token_delay_ms=ns.mock_token_delay_ms, first_token_delay_ms=ns.mock_first_token_delay_ms
            )
            _log(f"mock gateway pid {gateway.pid} on {gateway.base_url}")
            gateway.wait_ready()
            targets = [Target("pdrelay-mock", gateway.base_url, ns.model, gateway.pid)]
        else:
            targets = [
                Target("target", ns.base_url or "http://127.0.0.1:8000", ns.model, ns.target_pid, flag="--base-url")
            ]
        if ns.compare_url:
            targets.append(Target("compare", ns.compare_url, ns.compare_model, ns.compare_pid, flag="--compare-url"))
        if ns.peer_cmd:
            peer = PeerProcess(ns.peer_cmd)
            _log(f"peer: {peer.command}")
            model = peer.wait_ready(ns.peer_start_timeout_s)
            pids = peer.pids()
            _log(
                f"peer {ns.peer_label} on {peer.base_url} ({model}): front pids {pids['front']}, "
                f"worker pids {pids['worker']}"
            )
            if len(pids["front"]) != 1:
                raise ValueError(f"the peer wrote {len(pids['front'])} front pids; one front process is measured")
            targets.append(
                Target(ns.peer_label, peer.base_url, ns.compare_model or model, pids["front"][0], pids["worker"])
            )
        with asyncio.Runner(loop_factory=_new_loop) as runner:
            runs = runner.run(_bench(ns, targets, requests, tok, slo, percentiles))
    except ValueError as e:
        print(f"pdrelay bench serve: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, TimeoutError) as e:  # the mock gateway did not start, or warm-up failed
        print(f"pdrelay bench serve: {e}", file=sys.stderr)
        return 1
    finally:
        if peer is not None:
            peer.stop()
        if gateway is not None:
            gateway.stop()
    return report(ns, runs, tokenizer_dir, slo, percentiles)


def _phase_doc(
    ns: argparse.Namespace, phase: list[tuple[dict[str, Any], RunOutcome]], title: str, percentiles: tuple[float, ...]
) -> dict[str, Any]:
    """Print one phase's table (side by side when there is a compare endpoint); its part of the JSON."""
    (target, target_run), rest = phase[0], phase[1:]
    doc: dict[str, Any] = {**target}
    if ns.save_detailed:
        doc.update(detailed(target_run.results))
    if rest:
        compare = rest[0][0]
        print(format_table(title, target, percentiles, compare=compare, labels=(target["label"], compare["label"])))
        doc["compare"] = {**compare, **(detailed(rest[0][1].results) if ns.save_detailed else {})}
        doc["ratios"] = ratios(target, compare, percentiles)
    else:
        print(format_table(title, target, percentiles))
    return doc


def report(
    ns: argparse.Namespace,
    runs: list[list[tuple[dict[str, Any], RunOutcome]]],
    tokenizer_dir: Path,
    slo: Slo | None,
    percentiles: tuple[float, ...],
) -> int:
    if not runs:
        print("pdrelay bench serve: stopped before any measured request", file=sys.stderr)
        return 130
    flat = [r for phase in runs for r in phase]
    with_compare = ns.compare_url is not None or ns.peer_cmd is not None
    expected = 1 + (ns.throughput_concurrency is not None)
    partial = (
        any(s["partial"] for s, _ in flat)
        or len(runs) < expected
        or (with_compare and any(len(phase) < 2 for phase in runs))
    )
    suffix = " (partial)" if partial else ""
    doc: dict[str, Any] = {**_settings(ns, tokenizer_dir, slo), "partial": partial}
    doc.update(_phase_doc(ns, runs[0], "Serving Benchmark Result" + suffix, percentiles))
    doc["partial"] = partial
    if len(runs) > 1:
        print()
        doc["throughput_phase"] = _phase_doc(
            ns, runs[1], f"Concurrency {ns.throughput_concurrency}{suffix}", percentiles
        )
    if "ratios" in doc:
        print(headline(doc))
    if ns.output_json:
        Path(ns.output_json).write_text(json.dumps(doc, indent=2) + "\n")
        _log(f"wrote {ns.output_json}")
    if partial:
        return 130 if any(s["stopped"] == "interrupted" for s, _ in flat) else 1
    return 0 if all(s["completed"] > 0 for s, _ in flat) else 1


def main(argv: list[str] | None = None) -> int:
    return bench_main("bench.serve", __doc__, add_arguments, run, argv, whole_doc=True)


if __name__ == "__main__":
    raise SystemExit(main())
