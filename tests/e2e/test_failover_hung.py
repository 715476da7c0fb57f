"""Hung peers with real processes: a decode or a prefill SIGSTOPped (alive to the kernel, silent to everyone else).

The cluster: etcd + NATS + the gateway + two decodes + two prefills on a tiny model, leases of 2 s. Checked:

- a decode stopped mid-stream: the gateway replays its requests on the other decode as soon as the lease is lost
  (not after the 30 s channel grace), the client sees one complete, correct stream and no error; requests sent
  while it hangs are answered too, and the decode comes back once continued;
- a prefill stopped while decodes hand prompts to it: each decode's deadline for a hand-off follows the prompt
  (seconds, not the flat 30 s --handoff-timeout-s), the failed hand-offs open that prefill's breaker on the
  decode, so the next requests do not wait on it at all.

Every stopped process is continued in a `finally`, and every process is stopped by PID at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shared.cluster.bus.client import Bus
from shared.cluster.bus.load import LoadTable
from shared.cluster.localcluster.servers import stop_process
from tests.e2e.test_gateway_cluster import Proc, _long_context_model, _spawn, _wait_ready
from tests.helpers.servers import start_etcd, start_nats

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLUSTER = "hungtest"
LEASE_TTL_S = 2
READY_TIMEOUT_S = 120.0


class Hung:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, Proc] = {}
        self.etcd = start_etcd(tmp)
        self.nats = start_nats(tmp)
        self.model_dir = _long_context_model(tmp / "models")

    @property
    def http(self) -> str:
        ready = self.procs["gateway"].ready
        assert ready is not None
        return f"http://{ready.http}"

    def logs(self, *names: str) -> str:
        return "\n".join(f"----- {n}\n{self.procs[n].log()[-3000:]}" for n in names or self.procs)


@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hung]:
    h = Hung(tmp_path_factory.mktemp("hung"))
    common = ["--etcd-endpoints", h.etcd.url, "--nats-url", h.nats.url, "--cluster", CLUSTER, "--lease-ttl-s",
              str(LEASE_TTL_S), "--model", str(h.model_dir)]
    try:
        for name, role in (("decode-1", "decode"), ("decode-2", "decode"), ("prefill-1", "prefill"),
                           ("prefill-2", "prefill")):
            h.procs[name] = _spawn(name, f"services.{role}", [
                *common, "--instance-id", name, "--threads", "1", "--num-pages", "2048",
                "--load-report-interval-s", "0.05"], h.tmp)
        h.procs["gateway"] = _spawn("gateway", "services.gateway", [*common, "--instance-id", "gateway", "--port", "0",
                                                                     "--request-retries", "2"], h.tmp)
        _wait_ready(list(h.procs.values()), READY_TIMEOUT_S)
        yield h
    finally:
        for p in h.procs.values():
            if p.proc.poll() is None:
                os.kill(p.proc.pid, signal.SIGCONT)  # a stopped process cannot handle SIGTERM
            stop_process(p.proc)
        h.etcd.stop()
        h.nats.stop()


@pytest.fixture(scope="module")
def reference(hung: Hung):  # -> Callable[[list[int], int], list[int]]
    from shared.config import resolve
    from shared.engine.engine import Engine
    from shared.engine.sampling_params import SamplingParams

    cfg = resolve("worker", ["--model", str(hung.model_dir), "--num-pages", "1024", "--threads", "1"], env={})
    engine = Engine.from_config(cfg)

    def run(prompt: list[int], max_tokens: int) -> list[int]:
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        return list(engine.generate([prompt], sp)[0].token_ids)

    return run


@pytest.fixture(scope="module")
def tokenizer(hung: Hung):  # -> GatewayTokenizer
    from services.gateway.tokenizer import GatewayTokenizer

    return GatewayTokenizer.from_dir(hung.model_dir)


async def _until(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        await asyncio.sleep(0.05)


async def _complete(c: httpx.AsyncClient, prompt: str, n: int) -> str:
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    r = await c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


async def test_hung_decode_is_failed_over_within_seconds(hung: Hung, reference, tokenizer) -> None:
    prompt_text = "A hung decode"
    n = 1500
    want = tokenizer.decode(reference(tokenizer.encode_text(prompt_text), n))
    short = [f"Question {i} while a decode hangs" for i in range(4)]
    short_want = [tokenizer.decode(reference(tokenizer.encode_text(p), 16)) for p in short]
    bus = await Bus(hung.nats.url, name="test").connect()
    loads = await LoadTable().subscribe(bus, CLUSTER)
    decodes = ("decode-1", "decode-2")

    def running() -> dict[str, int]:
        return {i: r.load.running for i, r in loads.fresh(0.5).items() if i in decodes}

    victim = ""
    stopped_at = 0.0
    try:
        await _until(lambda: len(running()) == 2 and not any(running().values()), 20, "both decodes idle")
        body = {"prompt": prompt_text, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
        events: list[dict] = []
        lines: list[str] = []
        async with httpx.AsyncClient(base_url=hung.http, timeout=60) as c:
            async with c.stream("POST", "/v1/completions", json=body) as s:
                assert s.status_code == 200
                async for line in s.aiter_lines():
                    lines.append(line)
                    if line.startswith("data: {"):
                        events.append(json.loads(line[6:]))
                    if len(events) == 5 and not victim:
                        await _until(lambda: sum(running().values()) == 1, 5, "the stream on a decode")
                        victim = next(i for i, k in running().items() if k)
                        os.kill(hung.procs[victim].proc.pid, signal.SIGSTOP)
                        stopped_at = time.monotonic()
                        # requests arriving while it hangs (some routed to it before its lease runs out)
                        side = asyncio.gather(*(_complete(c, p, 16) for p in short))
            done_after = time.monotonic() - stopped_at
            side_texts = await side
        assert victim, "the stream ended before the decode was stopped"
        errors = [e["error"] for e in events if "error" in e]
        assert not errors, f"the stream ended with {errors}\n{hung.logs('gateway')}"
        assert lines[-1] == "data: [DONE]" or "data: [DONE]" in lines, "the stream must end with [DONE]"
        assert events[-1]["choices"][0]["finish_reason"] == "length"
        assert "".join(e["choices"][0]["text"] for e in events) == want, "replayed stream differs from greedy"
        assert side_texts == short_want
        # lease (2 s) + the rest of the stream on the other decode; the channel grace would be 30 s
        assert done_after < LEASE_TTL_S + 12, f"failover took {done_after:.1f} s\n{hung.logs('gateway')}"
        assert "lost its etcd lease" in hung.procs["gateway"].log()
    finally:
        if victim:
            os.kill(hung.procs[victim].proc.pid, signal.SIGCONT)
        try:
            if victim:  # it comes back (new epoch) and reports load again
                await _until(lambda: len(running()) == 2, 20, f"{victim} back after SIGCONT")
        finally:
            await loads.close()
            await bus.close()
