"""Hung peers with real processes: a decode or a prefill SIGSTOPped (alive to the kernel, silent to everyone else).

The cluster: etcd + NATS + the gateway + two decodes + two prefills on a tiny model, leases of 3 s. Checked:

- a decode stopped mid-stream: the gateway replays its requests on the other decode as soon as the lease is lost
  (not after the 30 s channel grace), the client sees one complete, correct stream and no error; requests sent
  while it hangs are answered too, and the decode comes back once continued;
- a prefill stopped while decodes hand prompts to it: each decode's deadline for a hand-off follows the prompt
  (seconds, not the flat 30 s --handoff-timeout-s), the failed hand-offs open that prefill's breaker on the
  decode, so the next requests do not wait on it at all;
- a gateway's prefill choice with an older epoch than etcd's (the prefill restarted since) is not handed off to;
- SIGTERM to a prefill while it computes and writes hand-offs: it drains them (exit 0), new tickets go to the other
  prefill, every request is answered correctly and no page stays taken on decode (the last test: one prefill left);
- the disaggregated decode queues what it cannot run yet (`--max-queued-requests`) and refuses only beyond the
  queue; a ticket the prefill refuses frees its pages at once (not after the 30 s quarantine).

`decode-q` and `prefill-odd` (page size 32: every ticket of decode-q is refused by it) run in a cluster of their
own, so the gateway never routes to them.

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

import grpc
import httpx
import pytest

from proto.pdrelay.v1 import common_pb2, worker_pb2
from shared.cluster.bus.client import Bus
from shared.cluster.bus.load import LoadTable
from shared.cluster.grpc_errors import error_from_rpc
from shared.cluster.localcluster.servers import stop_process
from shared.cluster.localcluster.service_process import ServiceProcess, wait_all_ready
from tests.e2e.test_gateway_cluster import _long_context_model, _spawn
from tests.helpers.servers import start_etcd, start_nats
from tests.services.disagg.disagg_client import generate

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLUSTER = "hungtest"
SIDE_CLUSTER = "hungside"
LEASE_TTL_S = 3
READY_TIMEOUT_S = 240.0  # eight model processes starting together on a shared 2-core box


class Hung:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, ServiceProcess] = {}
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
    common = [
        "--etcd-endpoints",
        h.etcd.url,
        "--nats-url",
        h.nats.url,
        "--cluster",
        CLUSTER,
        "--lease-ttl-s",
        str(LEASE_TTL_S),
        "--model",
        str(h.model_dir),
    ]
    try:
        for name, role in (
            ("decode-1", "decode"),
            ("decode-2", "decode"),
            ("prefill-1", "prefill"),
            ("prefill-2", "prefill"),
        ):
            h.procs[name] = _spawn(
                name,
                f"services.{role}",
                [
                    *common,
                    "--instance-id",
                    name,
                    "--threads",
                    "1",
                    "--num-pages",
                    "2048",
                    "--load-report-interval-s",
                    "0.05",
                ],
                h.tmp,
            )
        side = [a if a != CLUSTER else SIDE_CLUSTER for a in common]
        h.procs["decode-q"] = _spawn(
            "decode-q",
            "services.decode",
            [
                *side,
                "--instance-id",
                "decode-q",
                "--threads",
                "1",
                "--num-pages",
                "2048",
                "--handoff-retries",
                "1",
                "--load-report-interval-s",
                "0.05",
                "--max-running-requests",
                "2",
                "--max-queued-requests",
                "4",
            ],
            h.tmp,
        )
        h.procs["prefill-odd"] = _spawn(
            "prefill-odd",
            "services.prefill",
            [*side, "--instance-id", "prefill-odd", "--threads", "1", "--num-pages", "512", "--page-size", "32"],
            h.tmp,
        )
        h.procs["gateway"] = _spawn(
            "gateway",
            "services.gateway",
            [*common, "--instance-id", "gateway", "--port", "0", "--request-retries", "2"],
            h.tmp,
        )
        wait_all_ready(list(h.procs.values()), READY_TIMEOUT_S)
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
    from shared.modelspec.sampling import SamplingParams

    cfg = resolve(
        "worker",
        ["--model", str(hung.model_dir), "--num-pages", "1024", "--threads", "1", "--dtype", "float32"],
        env={},
    )
    engine = Engine.from_config(cfg)

    def run(prompt: list[int], max_tokens: int) -> list[int]:
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        return list(engine.generate([prompt], sp)[0].token_ids)

    return run


@pytest.fixture(scope="module")
def tokenizer(hung: Hung):  # -> GatewayTokenizer
    from services.gateway.text.tokenizer import GatewayTokenizer

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


def _prompt(seed: int) -> list[int]:
    """40 token ids in the tiny model's vocabulary (512), distinct per seed."""
    return [(seed * 41 + k * 13) % 500 + 5 for k in range(40)]


def _target(h: Hung, name: str, *, address: str | None = None, epoch: int | None = None) -> worker_pb2.PrefillTarget:
    ready = h.procs[name].ready
    assert ready is not None
    return worker_pb2.PrefillTarget(
        instance_id=name, grpc_address=address or ready.grpc, epoch=ready.epoch if epoch is None else epoch
    )


def _grpc(h: Hung, name: str) -> str:
    ready = h.procs[name].ready
    assert ready is not None
    return ready.grpc


async def test_stale_prefill_choice_is_not_handed_off_to(hung: Hung, reference) -> None:
    prompt = _prompt(1)
    # Epochs come from one counter per cluster, so the prefill that registered first may hold epoch 1, below which
    # no older incarnation can exist: the test takes the prefill with the higher epoch (at least 2) as the choice.
    chosen = max(("prefill-1", "prefill-2"), key=lambda n: _target(hung, n).epoch)
    epoch = _target(hung, chosen).epoch
    assert epoch >= 2, f"two prefills registered, one of them has epoch >= 2: {chosen} has {epoch}"
    # The gateway saw the chosen prefill one epoch ago, on a port where nothing listens any more (its old
    # incarnation). On a busy box decode's own view of it can lag for a moment (a lease renewed late): then it trusts
    # the gateway, as it should, and the request is served by the alternate; a later try finds the view current
    # (within 20 s: the full suite on two cores has seen the view lag for more than three).
    stale = _target(hung, chosen, address="127.0.0.1:9", epoch=epoch - 1)
    served_by: list[str] = []
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline:
        i = len(served_by)
        res = await generate(_grpc(hung, "decode-1"), f"stale-epoch-{i}", prompt, prefill=stale, max_tokens=8)
        assert res.tokens == reference(prompt, 8)
        served_by.append(res.prefill_instance_id)
        if res.prefill_instance_id == chosen:
            break
        await asyncio.sleep(1.0)
    assert served_by[-1] == chosen, f"the current incarnation of the chosen prefill {chosen} serves it: {served_by}"
    log = hung.procs["decode-1"].log()
    assert "chosen by the gateway is stale" in log
    assert f"hand-off of stale-epoch-{len(served_by) - 1}" not in log, "no hand-off to the stale address was tried"


async def test_decode_queues_beyond_max_running_and_refuses_only_a_full_queue(hung: Hung, reference) -> None:
    d = _grpc(hung, "decode-q")
    target = _target(hung, "prefill-1")
    prompts = [_prompt(10 + i) for i in range(8)]
    n = 120  # long enough that no slot frees while the burst arrives

    async def one(i: int) -> list[int] | int:
        try:
            return (await generate(d, f"queue-{i}", prompts[i], prefill=target, max_tokens=n)).tokens
        except grpc.aio.AioRpcError as e:
            err = error_from_rpc(e)
            return err.code if err is not None else -1

    # 2 running + 4 waiting: all six are served (before the queue existed, four were refused)
    got = await asyncio.gather(*(one(i) for i in range(6)))
    assert got == [reference(p, n) for p in prompts[:6]]
    # 2 running + 4 waiting + 2 more: only those find the queue full (OVERLOADED: 429 at the gateway)
    got = await asyncio.gather(*(one(i) for i in range(8)))
    refused = [g for g in got if isinstance(g, int)]
    assert refused and all(c == common_pb2.ERROR_CODE_OVERLOADED for c in refused), got
    assert len(refused) <= 2, f"{len(refused)} refused: the queue holds 4 behind 2 running"
    for i, g in enumerate(got):
        if not isinstance(g, int):
            assert g == reference(prompts[i], n)


async def test_a_refused_ticket_frees_its_pages_at_once(hung: Hung) -> None:
    bus = await Bus(hung.nats.url, name="test").connect()
    loads = await LoadTable().subscribe(bus, SIDE_CLUSTER)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await generate(
                _grpc(hung, "decode-q"), "refused-1", _prompt(30), prefill=_target(hung, "prefill-odd"), max_tokens=4
            )
        err = error_from_rpc(e.value)
        assert err is not None and err.code == common_pb2.ERROR_CODE_LAYOUT_MISMATCH, err
        t0 = time.monotonic()

        def all_free() -> bool:
            r = loads.fresh(0.5).get("decode-q")
            return r is not None and r.load.running == 0 and r.load.free_pages == r.load.total_pages

        await _until(all_free, 3.0, "decode-q's pages free after a refused ticket (no 30 s quarantine)")
        assert time.monotonic() - t0 < 3.0
    finally:
        await loads.close()
        await bus.close()


async def test_hung_prefill_costs_a_short_deadline_then_leaves_rotation(hung: Hung, reference) -> None:
    d = _grpc(hung, "decode-2")
    warm = _prompt(40)
    assert (await generate(d, "warm-p1", warm, prefill=_target(hung, "prefill-1"), max_tokens=4)).tokens == reference(
        warm, 4
    )  # a measured hand-off: deadlines now follow the prompt
    hung_target = _target(hung, "prefill-2")
    victim = hung.procs["prefill-2"].proc
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        took: list[float] = []
        for i in range(3):
            prompt = _prompt(50 + i)
            t0 = time.monotonic()
            res = await generate(d, f"hung-prefill-{i}", prompt, prefill=hung_target, max_tokens=4)
            took.append(time.monotonic() - t0)
            assert res.tokens == reference(prompt, 4)
            assert res.prefill_instance_id == "prefill-1"
        # two hand-offs wait the prompt's deadline (seconds, not the 30 s --handoff-timeout-s), then the breaker
        # of prefill-2 is open on decode-2 and the third goes straight to prefill-1
        assert all(t < 10 for t in took[:2]), took
        assert took[2] < 2.0, took
        assert "hand-off deadline" in hung.procs["decode-2"].log()
    finally:
        os.kill(victim.pid, signal.SIGCONT)


async def test_sigterm_to_a_prefill_while_it_writes_loses_nothing(hung: Hung, reference) -> None:
    bus = await Bus(hung.nats.url, name="test").connect()
    loads = await LoadTable().subscribe(bus, CLUSTER)
    try:
        # prefill-2 was stopped by the previous test: wait until it reports again (it is the alternate here)
        await _until(lambda: "prefill-2" in loads.fresh(0.5), 30, "prefill-2 back")
        d, victim = _grpc(hung, "decode-1"), hung.procs["prefill-1"].proc
        prompts = [[(s * 31 + k * 7) % 500 + 5 for k in range(600)] for s in range(12)]  # 38 pages each
        target = _target(hung, "prefill-1")

        async def one(i: int) -> list[int]:
            return (await generate(d, f"drain-{i}", prompts[i], prefill=target, max_tokens=6)).tokens

        tasks = [asyncio.create_task(one(i)) for i in range(len(prompts))]
        # SIGTERM once prefill-1 works on them (its queue is the twelve tickets)
        await _until(
            lambda: (r := loads.fresh(0.5).get("prefill-1")) is not None and r.load.running + r.load.queued > 0,
            20,
            "hand-offs running on prefill-1",
        )
        os.kill(victim.pid, signal.SIGTERM)
        got = await asyncio.gather(*tasks)
        assert got == [reference(p, 6) for p in prompts]
        assert await asyncio.to_thread(victim.wait, 30) == 0, hung.logs("prefill-1")
        log = hung.procs["prefill-1"].log()
        in_flight = [ln for ln in log.splitlines() if "draining (" in ln]
        assert in_flight and " 0 in flight" not in in_flight[0], f"SIGTERM did not land mid-hand-off: {in_flight}"

        def all_free() -> bool:
            r = loads.fresh(0.5).get("decode-1")
            return r is not None and r.load.running == 0 and r.load.free_pages == r.load.total_pages

        await _until(all_free, 15, "decode-1's pages all free again")
    finally:
        await loads.close()
        await bus.close()
