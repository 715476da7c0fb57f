"""Embedding benchmark: pdrelay's /v1/embeddings (gateway -> encoder, dynamic batching) vs sentence-transformers'
`encode` called once per request, at concurrency 1 / 16 / 64, in the same run, on the same sentences.

    python -m bench.embed [--concurrency 1,16,64] [--requests 256] [--threads 1] [--json-out P]
    pdrelay bench embed ...   (same flags)

pdrelay side: etcd, NATS, one gateway and one encoder (--threads N) on the bundled all-MiniLM-L6-v2; `c` clients
each send one sentence per POST /v1/embeddings (encoding_format base64, what the openai client sends) and the next
as soon as the answer is in (closed loop), over a lean keep-alive HTTP client (bench/serve/http_client.py).
sentence-transformers side: the same model directory, `SentenceTransformer.encode([sentence],
normalize_embeddings=True)` per request in this process, with the same torch thread count, served by
--st-workers threads (default 1: one encode at a time, like a server that runs the model per request), `c` client
coroutines closed-loop as above. The two sides alternate per concurrency level so drifting load on a shared box
hits both. Printed: requests/s, p50 / p99 latency, the throughput ratio, the encoder's mean batch size (inputs
per forward, from its /metrics), and CPU time per request on each side (pdrelay: encoder + gateway + client
processes; sentence-transformers: this process), whose ratio a busy shared box distorts less than wall time (three
processes get a larger share of a contended CPU than one). Target: >= 2x throughput at c=16.
A sample of the vectors is checked against sentence-transformers (max abs difference) before measuring.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.entry import bench_main
from shared.cluster.localcluster.service_process import ServiceProcess, python_cmd, stop_all, wait_all_ready

TARGET_RATIO = 2.0
TARGET_CONCURRENCY = 16
MODEL = "bundled:all-minilm-l6-v2"
READY_TIMEOUT_S = 180.0
_WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "the",
    "serving",
    "system",
    "batches",
    "requests",
    "of",
    "many",
    "lengths",
    "embedding",
    "vectors",
    "for",
    "search",
    "ranking",
    "retrieval",
    "and",
    "clustering",
    "of",
    "documents",
    "in",
    "several",
    "languages",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated client concurrency levels")
    p.add_argument("--requests", type=int, default=256, help="requests per side and concurrency level")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the encoder and of sentence-transformers")
    p.add_argument(
        "--st-workers",
        type=int,
        default=1,
        help="threads running sentence-transformers encode calls at once (each with --threads)",
    )
    p.add_argument("--min-words", type=int, default=6, help="shortest sentence, in words")
    p.add_argument("--max-words", type=int, default=40, help="longest sentence, in words")
    p.add_argument("--seed", type=int, default=0, help="seed of the sentences")
    p.add_argument("--encoder-flags", default="", help="extra flags for the encoder (e.g. '--encoder-batch-wait-ms 1')")
    p.add_argument("--json-out", default=None, help="also write the results as JSON to this file")


def sentences(n: int, lo: int, hi: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))) + "." for _ in range(n)]


def _summary(latencies: Sequence[float], wall_s: float) -> dict[str, Any]:
    lat = sorted(latencies)
    return {
        "requests": len(lat),
        "request_throughput": len(lat) / wall_s,
        "median_latency_ms": statistics.median(lat) * 1e3,
        "p99_latency_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3,
    }


async def _closed_loop(texts: Sequence[str], concurrency: int, one: Callable[[str], Any]) -> tuple[list[float], float]:
    """`concurrency` clients, each sending the next text when its previous answer arrived."""
    it = iter(texts)
    latencies: list[float] = []

    async def client() -> None:
        for text in it:
            t0 = time.perf_counter()
            await one(text)
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return latencies, time.perf_counter() - t0


# ---- the two sides ----------------------------------------------------------------------------------------------
class StSide:
    def __init__(self, model_dir: Path, threads: int, workers: int) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        self.model = SentenceTransformer(str(model_dir), device="cpu")
        self.pool = ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(threads,))

    def encode(self, text: str) -> np.ndarray:
        return self.model.encode([text], normalize_embeddings=True, convert_to_numpy=True)[0]

    async def one(self, text: str) -> np.ndarray:
        return await asyncio.get_running_loop().run_in_executor(self.pool, self.encode, text)


class PdrelaySide:
    def __init__(self, http: Any) -> None:
        self.http = http

    async def one(self, text: str) -> np.ndarray:
        body = json.dumps({"input": text, "encoding_format": "base64"}).encode()
        data = json.loads(await self.http.post_json("/v1/embeddings", body))
        return np.frombuffer(base64.b64decode(data["data"][0]["embedding"]), dtype="<f4")


def _service(role: str, name: str, args: Sequence[str], tmp: Path, etcd: str, nats: str) -> ServiceProcess:
    """One pdrelay service of the benchmark's cluster: its output in tmp, ended by the kernel if this one dies."""
    return ServiceProcess(
        name,
        python_cmd(
            f"services.{role}",
            "--etcd-endpoints",
            etcd,
            "--nats-url",
            nats,
            "--cluster",
            "bench-embed",
            "--instance-id",
            name,
            *args,
        ),
        tmp,
        tie_to_parent=True,
    )


# ---- run ----------------------------------------------------------------------------------------------------------
def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--concurrency {text!r}: write comma-separated integers, e.g. 1,16,64") from None
    if not levels or min(levels) < 1:
        raise ValueError(f"--concurrency {text!r}: every level must be >= 1")
    return levels


def run(ns: argparse.Namespace) -> int:
    try:
        levels = _levels(ns.concurrency)
        if ns.requests < 1 or ns.threads < 1 or ns.st_workers < 1:
            raise ValueError("--requests, --threads and --st-workers must be >= 1")
        if not 1 <= ns.min_words <= ns.max_words:
            raise ValueError(f"--min-words {ns.min_words} / --max-words {ns.max_words}: need 1 <= min <= max")
        import sentence_transformers  # noqa: F401
    except ValueError as e:
        print(f"pdrelay bench embed: {e}", file=sys.stderr)
        return 2
    except ImportError:
        print(
            "pdrelay bench embed: the reference side needs sentence-transformers: pip install "
            "'sentence-transformers>=5,<7' (the project's test extra)",
            file=sys.stderr,
        )
        return 2
    return asyncio.run(_run(ns, levels))


async def _run(ns: argparse.Namespace, levels: list[int]) -> int:
    from bench.serve.http_client import RawHttp
    from shared.cluster.localcluster.servers import EtcdServer, NatsServer, free_port
    from shared.modelspec.bundled import resolve_model_path

    model_dir = resolve_model_path(MODEL)
    texts = sentences(ns.requests, ns.min_words, ns.max_words, ns.seed)
    warm = sentences(32, ns.min_words, ns.max_words, ns.seed + 1)
    tmp = Path(tempfile.mkdtemp(prefix="pdrelay-bench-embed-"))
    etcd = EtcdServer(data_dir=tmp / "etcd", port=free_port())
    nats = NatsServer(data_dir=tmp / "nats", port=free_port())
    procs: list[ServiceProcess] = []
    try:
        etcd.start()
        nats.start()
        common = ("--threads", str(ns.threads), "--grpc-port", "0")
        procs = [
            _service(
                "encoder",
                "encoder-1",
                (*common, "--encoder-model", MODEL, *ns.encoder_flags.split()),
                tmp,
                etcd.url,
                nats.url,
            ),
            _service("gateway", "gateway-1", (*common, "--port", "0"), tmp, etcd.url, nats.url),
        ]
        st = StSide(model_dir, ns.threads, ns.st_workers)  # loads while the services start
        wait_all_ready(procs, READY_TIMEOUT_S)
        encoder, gateway = (p.ready for p in procs)
        assert encoder is not None and gateway is not None
        http = RawHttp(f"http://{gateway.http}", max_connections=max(levels) + 8)
        ours = PdrelaySide(http)
        await _wait_for_encoder(ours)
        # Correctness first: the served vectors are the reference's.
        diffs = [float(np.abs(await ours.one(t) - st.encode(t)).max()) for t in warm[:8]]
        for side in (st, ours):  # warm-up: first calls, connection pool, oneDNN / MKL primitives
            await _closed_loop(warm, 4, side.one)
        results: dict[str, Any] = {
            "model": MODEL,
            "threads": ns.threads,
            "st_workers": ns.st_workers,
            "max_abs_diff_vs_st": max(diffs),
            "levels": {},
        }
        for c in levels:
            results["levels"][str(c)] = await _measure_level(texts, c, st, ours, procs, encoder.metrics)
        await http.aclose()
    finally:
        stop_all(reversed(procs), 20.0)
        nats.stop()
        etcd.stop()
    print(_report(results))
    if ns.json_out:
        Path(ns.json_out).write_text(json.dumps(results, indent=2))
    target = results["levels"].get(str(TARGET_CONCURRENCY))
    return 0 if target is None or target["throughput_ratio"] >= TARGET_RATIO else 1


async def _measure_level(
    texts: list[str], c: int, st: StSide, ours: PdrelaySide, procs: list[ServiceProcess], metrics: str
) -> dict[str, Any]:
    """One concurrency level, the reference first, then pdrelay: latency, throughput, CPU per request (pdrelay's
    per process: encoder, gateway, this client) and the encoder's mean batch size."""
    from bench.serve.procs import process_cpu

    st_cpu0 = time.process_time()
    st_lat, st_wall = await _closed_loop(texts, c, st.one)
    st_cpu = (time.process_time() - st_cpu0) / len(st_lat) * 1e3
    before = _batch_counts(metrics)
    cpu0 = [process_cpu(p.proc.pid).best_s for p in procs] + [time.process_time()]
    our_lat, our_wall = await _closed_loop(texts, c, ours.one)
    cpu1 = [process_cpu(p.proc.pid).best_s for p in procs] + [time.process_time()]
    after = _batch_counts(metrics)
    a, b = _summary(our_lat, our_wall), _summary(st_lat, st_wall)
    n = len(our_lat)
    a["cpu_ms_per_request"] = {
        name: (y - x) / n * 1e3 for name, x, y in zip(("encoder", "gateway", "client"), cpu0, cpu1, strict=True)
    }
    b["cpu_ms_per_request"] = st_cpu
    forwards = after[1] - before[1]
    a["encoder_forwards"] = forwards
    a["mean_batch_size"] = (after[0] - before[0]) / forwards if forwards else 0.0
    return {
        "pdrelay": a,
        "sentence_transformers": b,
        "throughput_ratio": a["request_throughput"] / b["request_throughput"],
        "cpu_ratio": st_cpu / sum(a["cpu_ms_per_request"].values()),
    }


def _batch_counts(metrics_address: str) -> tuple[float, float]:
    """(inputs, forwards) the encoder has computed so far, from its /metrics."""
    import urllib.request

    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith(("pdrelay:encoder_batch_size_sum", "pdrelay:encoder_batch_size_count")):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values.get("pdrelay:encoder_batch_size_sum", 0.0), values.get("pdrelay:encoder_batch_size_count", 0.0)


async def _wait_for_encoder(side: PdrelaySide, timeout_s: float = 30.0) -> None:
    """The gateway learns the encoder from etcd a moment after both are ready."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await side.one("warm-up")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def _report(r: dict[str, Any]) -> str:
    lines = [
        f"embeddings: {r['model']}, torch threads {r['threads']} on each side, sentence-transformers "
        f"workers {r['st_workers']}; max |pdrelay - sentence-transformers| = {r['max_abs_diff_vs_st']:.1e}",
        f"{'c':>4}  {'pdrelay req/s':>14} {'p50 ms':>8} {'p99 ms':>8}   {'s-t req/s':>10} {'p50 ms':>8} "
        f"{'p99 ms':>8}   {'ratio':>6}   {'batch':>5}",
    ]
    for c, lv in r["levels"].items():
        a, b = lv["pdrelay"], lv["sentence_transformers"]
        lines.append(
            f"{c:>4}  {a['request_throughput']:>14.1f} {a['median_latency_ms']:>8.1f} "
            f"{a['p99_latency_ms']:>8.1f}   {b['request_throughput']:>10.1f} {b['median_latency_ms']:>8.1f} "
            f"{b['p99_latency_ms']:>8.1f}   {lv['throughput_ratio']:>5.2f}x   {a['mean_batch_size']:>5.1f}"
        )
    lines.append(
        "CPU ms per request, pdrelay (encoder + gateway + client) vs sentence-transformers (this process): "
        + ", ".join(
            f"c={c} {lv['pdrelay']['cpu_ms_per_request']['encoder']:.1f} + "
            f"{lv['pdrelay']['cpu_ms_per_request']['gateway']:.1f} + "
            f"{lv['pdrelay']['cpu_ms_per_request']['client']:.1f} vs "
            f"{lv['sentence_transformers']['cpu_ms_per_request']:.1f} ({lv['cpu_ratio']:.2f}x)"
            for c, lv in r["levels"].items()
        )
    )
    t = r["levels"].get(str(TARGET_CONCURRENCY))
    if t is not None:
        ok = "met" if t["throughput_ratio"] >= TARGET_RATIO else "NOT met"
        lines.append(
            f"target: >= {TARGET_RATIO:g}x throughput at c={TARGET_CONCURRENCY}: {ok} ({t['throughput_ratio']:.2f}x)"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("bench.embed", __doc__, add_arguments, run, argv, whole_doc=True)


if __name__ == "__main__":
    sys.exit(main())
