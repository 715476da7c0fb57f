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
from bench.serve.arguments import DEFAULT_MODEL, add_arguments, validate
from bench.serve.compare import run_compare
from bench.serve.datasets import (
    BenchRequest,
    BenchTokenizer,
    multi_turn_dataset,
    random_dataset,
    shared_prefix_dataset,
)
from bench.serve.kvstore import run_kvstore_comparison
from bench.serve.measure import Target, _log, _new_loop, measure
from bench.serve.metrics import Slo
from bench.serve.mm import random_mm_dataset
from bench.serve.peer import PeerProcess
from bench.serve.policies import run_policies
from bench.serve.procs import MockGateway
from bench.serve.report import detailed, format_table, headline, ratios
from bench.serve.runner import RunOutcome


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
        slo, percentiles = validate(ns)
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
