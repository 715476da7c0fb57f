"""Hand-off benchmark: time to first token disaggregated (decode + prefill, KV over NIXL or Mooncake) vs colocated.

    python -m bench.disagg [--backends nixl,mooncake] [--lengths 256,1024,2048] [--reps 3] [--quick] [--json-out P]
    pdrelay bench handoff ...   (same flags)

Starts etcd and NATS, one colocated worker, and per backend one prefill + one decode (each service with
--threads, default 1, so every mode computes on one core), all on the bundled model unless --model says
otherwise. Each round sends, for every prompt length, one request per mode in turn (colocated, then each backend)
with max_tokens=1 and a prompt of fresh random token ids (no prefix-cache hit anywhere), and measures TTFT at the
client. Printed per length and backend (medians over rounds):
    TTFT colocated, TTFT disaggregated,
    overhead = TTFT_disagg - TTFT_colocated (transfer + protocol: reserve, ticket, checksums, activation, RPCs),
               the median of per-round differences, as a fraction of the colocated TTFT,
    transfer = the prefill-reported KV write time (DecodeResponse.timings.transfer_s), as a fraction of TTFT,
    the KV bytes moved (whole pages of the prompt),
    and the CPU time the mode's processes spent per request (worker; prefill + decode), which, unlike TTFT
    differences, another load on the machine barely moves.
Target: overhead <= 10% of TTFT at 1024 tokens with NIXL. A warm-up request per mode (the first hand-off also
connects the transfer engines) is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.entry import bench_main
from shared.cluster.handshake import ReadyInfo
from shared.cluster.localcluster.service_process import ServiceProcess, python_cmd, stop_all, wait_all_ready

TARGET_OVERHEAD = 0.10  # of TTFT, at 1024 prompt tokens, NIXL
TARGET_TOKENS = 1024
READY_TIMEOUT_S = 180.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default="bundled:smollm2-135m-instruct",
        help="model of every service: 'bundled:smollm2-135m-instruct' or a local model directory",
    )
    p.add_argument("--backends", default="nixl,mooncake", help="comma-separated transfer backends (nixl, mooncake)")
    p.add_argument("--lengths", default="256,1024,2048", help="comma-separated prompt lengths in tokens")
    p.add_argument("--reps", type=int, default=3, help="measured rounds per length (each mode once per round)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each service")
    p.add_argument("--page-size", type=int, default=16, help="--page-size of every service")
    p.add_argument(
        "--kv-cache-dtype",
        default="float32",
        choices=("float32", "bfloat16", "fp8_e4m3"),
        help="--kv-cache-dtype of every service (fp8_e4m3: half the bytes of bfloat16 per hand-off)",
    )
    p.add_argument("--prefill-tp-size", type=int, default=1, help="--tp-size of each prefill (the worker stays at 1)")
    p.add_argument("--decode-tp-size", type=int, default=1, help="--tp-size of each decode (the worker stays at 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    p.add_argument("--quick", action="store_true", help="smoke run: prompts of 64 and 256 tokens, 2 rounds")
    p.add_argument("--json-out", default=None, help="also write the results as JSON to this file")


# ---- processes --------------------------------------------------------------------------------------------------
def _service(
    role: str, name: str, cluster: str, args: Sequence[str], tmp: Path, etcd: str, nats: str
) -> ServiceProcess:
    """One pdrelay service as a child process: its output in tmp, ended by the kernel if this process dies."""
    return ServiceProcess(
        name,
        python_cmd(
            f"services.{role}",
            "--etcd-endpoints",
            etcd,
            "--nats-url",
            nats,
            "--cluster",
            cluster,
            "--instance-id",
            name,
            *args,
        ),
        tmp,
        tie_to_parent=True,
    )


# ---- measurement ------------------------------------------------------------------------------------------------
async def _ttft(address: str, rid: str, prompt: list[int], prefill: Any | None) -> tuple[float, float]:
    """(TTFT seconds at the client, prefill-reported transfer seconds) of one max_tokens=1 request."""
    import grpc

    from proto.pdrelay.v1 import common_pb2, worker_pb2, worker_pb2_grpc

    req = worker_pb2.DecodeRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        sampling=common_pb2.SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True),
    )
    if prefill is not None:
        req.prefill.CopyFrom(prefill)
    async with grpc.aio.insecure_channel(address) as ch:
        stub = worker_pb2_grpc.DecodeStub(ch)
        await ch.channel_ready()  # connection set-up is not part of TTFT
        t0 = time.perf_counter()
        ttft, transfer = 0.0, 0.0
        async for msg in stub.Generate(req, timeout=300):
            if msg.token_ids and not ttft:
                ttft = time.perf_counter() - t0
            if msg.HasField("timings"):
                transfer = msg.timings.transfer_s
    if not ttft:
        raise RuntimeError(f"request {rid} to {address} returned no token")
    if prefill is not None and not transfer:
        raise RuntimeError(f"request {rid} was not handed off (no transfer time reported)")
    return ttft, transfer


def _cpu_s(pids: Sequence[int]) -> float:
    from bench.serve.procs import process_cpu

    return sum(process_cpu(pid).best_s for pid in pids)


async def _measure(
    modes: dict[str, tuple[str, Any, list[int]]], lengths: list[int], reps: int, vocab: int, seed: int
) -> dict[tuple[str, int], list[tuple[float, float, float]]]:
    """(TTFT s, transfer s, CPU s of the mode's processes) per request, keyed by (mode, prompt length)."""
    rng = random.Random(seed)
    lo = min(100, vocab // 4)  # above the special tokens

    def prompt(n: int) -> list[int]:
        return [rng.randrange(lo, vocab) for _ in range(n)]

    for mode, (address, prefill, _) in modes.items():  # warm-up: connects the transfer engines
        await _ttft(address, f"warmup-{mode}", prompt(min(lengths)), prefill)
    out: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for r in range(reps):
        for n in lengths:
            for mode, (address, prefill, pids) in modes.items():  # interleaved: noise hits every mode alike
                cpu0 = _cpu_s(pids)
                ttft, transfer = await _ttft(address, f"{mode}-{n}-{r}", prompt(n), prefill)
                out.setdefault((mode, n), []).append((ttft, transfer, _cpu_s(pids) - cpu0))
        print(f"round {r + 1}/{reps} done", file=sys.stderr, flush=True)
    return out


def _summarize(
    raw: dict[tuple[str, int], list[tuple[float, float, float]]],
    backends: list[str],
    lengths: list[int],
    page_bytes: int,
    page_size: int,
) -> list[dict[str, Any]]:
    rows = []
    for n in lengths:
        colo = [t for t, _, _ in raw[("colocated", n)]]
        colo_cpu = statistics.median(c for _, _, c in raw[("colocated", n)])
        for b in backends:
            pd = raw[(b, n)]
            ttft = [t for t, _, _ in pd]
            diffs = [d - c for d, c in zip(ttft, colo, strict=True)]
            transfer = statistics.median(x for _, x, _ in pd)
            pd_cpu = statistics.median(c for _, _, c in pd)
            colo_med, pd_med, over = statistics.median(colo), statistics.median(ttft), statistics.median(diffs)
            rows.append(
                {
                    "prompt_tokens": n,
                    "backend": b,
                    "rounds": len(pd),
                    "ttft_colocated_ms": 1e3 * colo_med,
                    "ttft_disagg_ms": 1e3 * pd_med,
                    "overhead_ms": 1e3 * over,
                    "overhead_frac": over / colo_med,
                    # the spread of the per-round differences: compute noise of a shared box shows up here
                    "overhead_ms_min": 1e3 * min(diffs),
                    "overhead_ms_max": 1e3 * max(diffs),
                    "transfer_ms": 1e3 * transfer,
                    "transfer_frac": transfer / pd_med,
                    # CPU seconds the mode's processes spent per request (worker; prefill + decode): unlike TTFT
                    # differences, barely moved by other load on the machine
                    "cpu_colocated_ms": 1e3 * colo_cpu,
                    "cpu_disagg_ms": 1e3 * pd_cpu,
                    "extra_cpu_frac": (pd_cpu - colo_cpu) / colo_cpu if colo_cpu else 0.0,
                    "kv_bytes": -(-n // page_size) * page_bytes,
                    "transfer_gb_s": -(-n // page_size) * page_bytes / transfer / 1e9 if transfer else 0.0,
                }
            )
    return rows


def _row(r: dict[str, Any]) -> str:
    return (
        f"{r['prompt_tokens']:>6} {r['backend']:>9}  TTFT colocated {r['ttft_colocated_ms']:8.1f} ms  "
        f"disagg {r['ttft_disagg_ms']:8.1f} ms  overhead {r['overhead_ms']:7.1f} ms "
        f"({100 * r['overhead_frac']:5.1f}% of TTFT; rounds {r['overhead_ms_min']:.0f}.."
        f"{r['overhead_ms_max']:.0f} ms)  transfer {r['transfer_ms']:6.1f} ms "
        f"({100 * r['transfer_frac']:4.1f}%, {r['kv_bytes'] / 2**20:6.1f} MiB, {r['transfer_gb_s']:5.2f} GB/s)  "
        f"CPU/request {r['cpu_colocated_ms']:.0f} -> {r['cpu_disagg_ms']:.0f} ms "
        f"({100 * r['extra_cpu_frac']:+.1f}%)"
        + (
            f"  bench transfer {r['engine_gb_s']:.2f} GB/s, hand-off at {r['vs_engine']:.2f}x"
            if "vs_engine" in r
            else ""
        )
    )


def _engine_reference(rows: list[dict[str, Any]], page_bytes: int) -> None:
    """Adds what `bench transfer` moves the same bytes at (same pages, same backend, this run) to each row."""
    from bench.transfer import measure

    for b in sorted({r["backend"] for r in rows}):
        mine = [r for r in rows if r["backend"] == b]
        ref = measure([b], sorted({r["kv_bytes"] for r in mine}), page_bytes, 0, "127.0.0.1", 0)
        gbps = {x["bytes"]: x[f"{b}_gbps"] for x in ref["rows"]}
        for r in mine:
            r["engine_gb_s"] = gbps[r["kv_bytes"]]
            r["vs_engine"] = r["transfer_gb_s"] / r["engine_gb_s"]


def _target(rows: list[dict[str, Any]], quick: bool) -> dict[str, Any] | None:
    hit = next((r for r in rows if r["backend"] == "nixl" and r["prompt_tokens"] == TARGET_TOKENS), None)
    if hit is None:
        return None
    out = {"value": hit["overhead_frac"], "target": TARGET_OVERHEAD, "met": hit["overhead_frac"] <= TARGET_OVERHEAD}
    if quick:
        out["note"] = "--quick: not a measurement of the target"
    return out


def run(ns: argparse.Namespace) -> int:
    from shared.engine.models import load_model_config
    from shared.modelspec.bundled import resolve_model_path
    from shared.modelspec.kv_layout import KVLayout

    try:
        backends, lengths, reps = _workload(ns)
    except ValueError as e:
        print(f"bench handoff: {e}", file=sys.stderr)
        return 2
    model = str(resolve_model_path(ns.model))
    arch = load_model_config(model)
    if max(lengths) >= arch.max_position_embeddings:
        print(
            f"bench handoff: --lengths up to {max(lengths)} tokens do not fit the model's context of "
            f"{arch.max_position_embeddings}; use shorter prompts",
            file=sys.stderr,
        )
        return 2
    kind = "mla" if arch.mla is not None else "mha"  # the engines' own layout (model_runner._build_kv)
    kv = KVLayout(ns.kv_cache_dtype, ns.page_size, arch.num_layers, arch.num_kv_heads, arch.head_dim, kind)
    page_bytes = kv.page_bytes
    pages = str(2 * (-(-max(lengths) // ns.page_size)) + 8)  # the longest prompt twice over: never short of pages
    common = ["--model", model, "--threads", str(ns.threads), "--num-pages", pages, "--page-size", str(ns.page_size)]
    common += ["--kv-cache-dtype", ns.kv_cache_dtype]
    tp = (ns.prefill_tp_size, ns.decode_tp_size)
    raw, load = _run_services(common, backends, lengths, reps, arch.vocab_size, ns.seed, tp)
    rows = _summarize(raw, backends, lengths, page_bytes, ns.page_size)
    _engine_reference(rows, page_bytes)
    _report(ns, rows, reps, load)
    return 0


def _workload(ns: argparse.Namespace) -> tuple[list[str], list[int], int]:
    """(backends, prompt lengths, rounds) from the flags (--quick: 64 and 256 tokens, 2 rounds); ValueError
    naming the flag that is wrong."""
    backends = [b.strip() for b in ns.backends.split(",") if b.strip()]
    bad = [b for b in backends if b not in ("nixl", "mooncake")]
    if bad or not backends:
        raise ValueError(f"--backends {ns.backends!r}: use nixl and/or mooncake, e.g. --backends nixl,mooncake")
    lengths = [64, 256] if ns.quick else [int(x) for x in ns.lengths.split(",") if x.strip()]
    reps = 2 if ns.quick else ns.reps
    if reps < 1 or not lengths or min(lengths) < 1:
        raise ValueError(f"--reps {reps} and --lengths {ns.lengths!r} must be >= 1")
    return backends, lengths, reps


def _run_services(
    common: list[str],
    backends: list[str],
    lengths: list[int],
    reps: int,
    vocab: int,
    seed: int,
    tp: tuple[int, int] = (1, 1),
) -> tuple[dict[tuple[str, int], list[tuple[float, float, float]]], tuple[float, float]]:
    """Starts etcd, NATS, the colocated worker and a prefill + decode per backend (at tp = (prefill's, decode's)
    --tp-size), measures every mode, stops them all; (the measurements, the machine's load average before and after
    them)."""
    from shared.cluster.localcluster.servers import EtcdServer, NatsServer, free_port

    tmp = Path(tempfile.mkdtemp(prefix="pdrelay-bench-handoff-"))
    etcd = EtcdServer(data_dir=tmp / "etcd", port=free_port())
    nats = NatsServer(data_dir=tmp / "nats", port=free_port())
    services: list[ServiceProcess] = []
    ok = False
    try:
        etcd.start()
        nats.start()
        services.append(_service("worker", "bench-worker", "bench-colo", common, tmp, etcd.url, nats.url))
        for b in backends:
            args = [*common, "--transfer-backend", b, "--local-prefill-threshold", "0"]
            pre, dec = [*args, "--tp-size", str(tp[0])], [*args, "--tp-size", str(tp[1])]
            services.append(_service("prefill", f"bench-prefill-{b}", f"bench-{b}", pre, tmp, etcd.url, nats.url))
            services.append(_service("decode", f"bench-decode-{b}", f"bench-{b}", dec, tmp, etcd.url, nats.url))
        t0 = time.monotonic()
        wait_all_ready(services, READY_TIMEOUT_S)
        print(f"{len(services)} services ready in {time.monotonic() - t0:.1f} s (logs in {tmp})", file=sys.stderr)
        modes = _modes({s.name: s for s in services}, backends)
        load_before = os.getloadavg()[0]
        raw = asyncio.run(_measure(modes, lengths, reps, vocab, seed))
        load_after = os.getloadavg()[0]
        ok = True
    finally:
        stop_all(services, 20.0)
        nats.stop()
        etcd.stop()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)  # on failure the service logs stay for a look
    return raw, (load_before, load_after)


def _modes(by: dict[str, ServiceProcess], backends: list[str]) -> dict[str, tuple[str, Any, list[int]]]:
    """(decode address, prefill target or None, pids whose CPU counts) per mode: colocated, then each backend."""
    from proto.pdrelay.v1 import worker_pb2

    w = by["bench-worker"]
    modes: dict[str, tuple[str, Any, list[int]]] = {"colocated": (_ready(w).grpc, None, [w.proc.pid])}
    for b in backends:
        pre, dec = by[f"bench-prefill-{b}"], by[f"bench-decode-{b}"]
        p = _ready(pre)
        modes[b] = (
            _ready(dec).grpc,
            worker_pb2.PrefillTarget(instance_id=p.instance_id, grpc_address=p.grpc, epoch=p.epoch),
            [pre.proc.pid, dec.proc.pid],
        )
    return modes


def _ready(s: ServiceProcess) -> ReadyInfo:
    assert s.ready is not None, f"{s.name} is not ready (wait_all_ready returned)"
    return s.ready


def _report(ns: argparse.Namespace, rows: list[dict[str, Any]], reps: int, load: tuple[float, float]) -> None:
    """The table, the target line and (--json-out) the JSON."""
    load_before, load_after = load
    print(
        f"model {ns.model}, {ns.threads} thread(s) per service, prefill TP={ns.prefill_tp_size} -> decode "
        f"TP={ns.decode_tp_size}, {reps} rounds, medians; overhead = TTFT_disagg - "
        "TTFT_colocated as a fraction of TTFT_colocated, transfer = prefill-reported KV write time; machine load "
        f"average {load_before:.1f} -> {load_after:.1f} on {os.cpu_count()} CPUs (TTFT differences are noise when "
        "it exceeds the CPU count; CPU/request is not)"
    )
    for r in rows:
        print(_row(r))
    target = _target(rows, ns.quick)
    if target is not None:
        print(
            f"target overhead at {TARGET_TOKENS} tokens with nixl: {100 * target['value']:.1f}% "
            f"(<= {100 * TARGET_OVERHEAD:.0f}%) {'met' if target['met'] else 'NOT met'}"
            + (f" [{target['note']}]" if "note" in target else "")
        )
    if ns.json_out:
        summary = {
            "model": ns.model,
            "threads": ns.threads,
            "prefill_tp_size": ns.prefill_tp_size,
            "decode_tp_size": ns.decode_tp_size,
            "rounds": reps,
            "quick": ns.quick,
            "results": rows,
            "load_average": [load_before, load_after],
            "target_overhead_1024_nixl": target,
        }
        Path(ns.json_out).write_text(json.dumps(summary, indent=2))


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("bench.disagg", __doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
