"""Client side of the disaggregation tests: Decode.Generate calls, load reports over NATS, references.

Everything here is what a gateway or an operator sees: token streams, typed errors in trailing metadata, and
the free/total KV pages each instance reports every 0.1 s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import torch

from proto.pdrelay.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from shared.cluster.bus.client import Bus
from shared.cluster.bus.load import LoadReport, LoadTable


@dataclass
class Result:
    tokens: list[int] = field(default_factory=list)
    finish_reason: int = 0
    usage: common_pb2.Usage | None = None
    timings: worker_pb2.DecodeTimings | None = None
    prefill_instance_id: str = ""
    error: common_pb2.Error | None = None  # set when the stream ended with FINISH_REASON_ERROR
    ttft_s: float = 0.0


def greedy(max_tokens: int, ignore_eos: bool = True) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)


async def generate(
    address: str,
    request_id: str,
    prompt: Sequence[int],
    *,
    prefill: worker_pb2.PrefillTarget | None = None,
    max_tokens: int = 12,
    sampling: common_pb2.SamplingParams | None = None,
    timeout_s: float = 60.0,
) -> Result:
    """One Decode.Generate stream to the end. A failed RPC raises grpc.aio.AioRpcError (error_from_rpc reads it)."""
    req = worker_pb2.DecodeRequest(
        request_id=request_id, prompt_token_ids=list(prompt), sampling=sampling or greedy(max_tokens)
    )
    if prefill is not None:
        req.prefill.CopyFrom(prefill)
    out = Result()
    t0 = time.perf_counter()
    async with grpc.aio.insecure_channel(address) as ch:
        async for msg in worker_pb2_grpc.DecodeStub(ch).Generate(req, timeout=timeout_s):
            if not out.ttft_s and msg.token_ids:
                out.ttft_s = time.perf_counter() - t0
            out.tokens.extend(msg.token_ids)
            if msg.HasField("timings"):
                out.timings = msg.timings
                out.prefill_instance_id = msg.prefill_instance_id
            if msg.finish_reason:
                out.finish_reason = msg.finish_reason
                out.usage = msg.usage
                if msg.HasField("error"):
                    out.error = msg.error
    return out


async def generate_all(
    address: str,
    prompts: Sequence[Sequence[int]],
    prefix: str,
    *,
    prefill: worker_pb2.PrefillTarget | None = None,
    max_tokens: int = 12,
) -> list[Result]:
    """All prompts at once (concurrent streams: batching and concurrent hand-offs are part of the test)."""
    return list(
        await asyncio.gather(
            *(
                generate(address, f"{prefix}-{i}", p, prefill=prefill, max_tokens=max_tokens)
                for i, p in enumerate(prompts)
            )
        )
    )


class Loads:
    """The latest load report of every instance of the given clusters (async context manager)."""

    def __init__(self, nats_url: str, clusters: Sequence[str]) -> None:
        self.bus = Bus(nats_url, name="disagg-test")
        self.clusters = list(clusters)
        self.tables: list[LoadTable] = []

    async def __aenter__(self) -> Loads:
        await self.bus.connect()
        self.tables = [await LoadTable().subscribe(self.bus, c) for c in self.clusters]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for t in self.tables:
            await t.close()
        await self.bus.close()

    def latest(self, instance_id: str) -> LoadReport | None:
        for t in self.tables:
            if instance_id in t.latest and (t.age_s(instance_id) or 0.0) < 1.0:
                return t.latest[instance_id]
        return None

    async def wait(
        self, instance_id: str, pred: Callable[[LoadReport], bool], timeout_s: float, what: str = "condition"
    ) -> LoadReport:
        """The first fresh report of instance_id that satisfies pred; AssertionError naming the last one seen."""
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            last = self.latest(instance_id)
            if last is not None and pred(last):
                return last
            await asyncio.sleep(0.05)
        raise AssertionError(f"{instance_id}: {what} not reached in {timeout_s:.1f} s; last report: {last}")

    async def all_pages_free(self, instance_ids: Sequence[str], timeout_s: float = 8.0) -> None:
        """No page leaked: every instance reports free_pages == total_pages (once idle, quarantine expired)."""
        for iid in instance_ids:
            await self.wait(
                iid,
                lambda r: r.load.total_pages > 0 and r.load.free_pages == r.load.total_pages and r.load.running == 0,
                timeout_s,
                "free_pages == total_pages",
            )


# ---- references ------------------------------------------------------------------------------------------------
def mixed_prompts(vocab: int, n: int = 16, seed: int = 5) -> list[list[int]]:
    """n prompts of 3..150 tokens (pages of 16: up to 10 pages), a third of them sharing a 40-token prefix and two
    sharing a whole earlier prompt as their prefix; random ids above the special tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 150, 17, 33, 9, 64, 48, 100, 16, 5, 130, 24, 70, 12, 90, 40][:n]
    shared = torch.randint(3, vocab, (40,), generator=g).tolist()
    out = []
    for i, k in enumerate(lengths):
        tail = torch.randint(3, vocab, (k,), generator=g).tolist()
        out.append(shared + tail if i % 3 == 1 else tail)
    if n > 6:
        out[6] = out[1][:120] + out[6][:10]  # shares 7 full pages with prompt 1
    return out


def hf_greedy(model_dir: str | Path, prompts: Sequence[Sequence[int]], n: int) -> list[list[int]]:
    """Each prompt alone through HF generate, EOS ignored: the independent reference."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    cfg = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    out = []
    with torch.no_grad():
        for p in prompts:
            seq = hf.generate(torch.tensor([list(p)]), generation_config=cfg)
            out.append(seq[0, len(p) :].tolist())
    return out
