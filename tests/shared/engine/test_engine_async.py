"""AsyncEngine over a fake runner: streaming, typed errors before the first delta, cancellation aborts, the event
loop stays free while steps run, a failing step aborts only its requests."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from test_engine_fakes import FakeRunner, reference_greedy

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.async_engine import AsyncEngine
from shared.engine.engine import Engine, EngineStepError
from shared.engine.errors import EngineError, InvalidRequest, QueueFull, RankLost
from shared.engine.request import RequestOutput
from shared.engine.types import SchedulerOutput
from shared.modelspec.sampling import SamplingParams

P = 4


class SlowRunner(FakeRunner):
    """Each forward holds the engine thread (not the event loop) for a few milliseconds, like real compute."""

    def forward(self, out: SchedulerOutput) -> torch.Tensor:
        time.sleep(0.005)
        return super().forward(out)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


@pytest.fixture
def aengine():
    engines: list[AsyncEngine] = []

    def make(runner: FakeRunner | None = None, **sched) -> AsyncEngine:
        e = AsyncEngine(
            Engine(runner or SlowRunner(64, P), cache=CacheConfig(page_size=P), scheduler=SchedulerConfig(**sched))
        )
        engines.append(e)
        return e

    yield make
    for e in engines:
        e.shutdown()


async def collect(ae: AsyncEngine, rid: str, prompt: list[int], params: SamplingParams) -> list[RequestOutput]:
    return [o async for o in ae.generate(rid, prompt, params)]


async def test_concurrent_streams_are_exact_and_the_loop_stays_free(aengine):
    ae = aengine()
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.002)

    t = asyncio.create_task(ticker())
    prompts = {f"r{i}": [i + 1, i + 2, i + 3] for i in range(6)}
    started = time.perf_counter()
    results = await asyncio.gather(*(collect(ae, rid, p, greedy(20)) for rid, p in prompts.items()))
    elapsed = time.perf_counter() - started
    stop.set()
    await t
    for (rid, p), outs in zip(prompts.items(), results, strict=True):
        assert [x for o in outs for x in o.new_token_ids] == reference_greedy(p, 20)
        assert outs[-1].finished and outs[-1].finish_reason == "length" and not any(o.finished for o in outs[:-1])
    # >= 20 steps of >= 5 ms ran on the engine thread; the loop kept ticking meanwhile (a blocked loop: ~0 ticks)
    assert elapsed > 0.1 and ticks > elapsed / 0.002 / 4


async def test_invalid_requests_raise_before_streaming(aengine):
    ae = aengine(max_queued_requests=1)
    with pytest.raises(InvalidRequest, match="max_tokens"):
        await collect(ae, "bad", [1, 2], SamplingParams(max_tokens=0))
    first = ae.generate("a", [1, 2, 3], greedy(200))
    second = ae.generate("b", [1, 2, 3], greedy(200))
    got_a = await first.__anext__()
    assert got_a.req_id == "a"
    outs = await collect(ae, "ok", [4, 5], greedy(3))  # the engine still serves
    assert [x for o in outs for x in o.new_token_ids] == reference_greedy([4, 5], 3)
    await first.aclose()
    await second.aclose()
    ae2 = aengine(max_queued_requests=1)
    ae2.engine.add_request("filler", [1], greedy(1))  # the engine thread is idle until woken: queue is full
    with pytest.raises(QueueFull):
        await collect(ae2, "x", [1, 2], greedy(3))


async def test_cancelling_the_consumer_aborts_the_request(aengine):
    ae = aengine()
    seen = asyncio.Event()

    async def consume() -> None:
        async for _ in ae.generate("long", [1, 2, 3], greedy(10_000)):
            seen.set()

    task = asyncio.create_task(consume())
    await seen.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if not ae.engine.has_work():
            break
        await asyncio.sleep(0.01)
    assert not ae.engine.has_work() and "long" not in ae.engine.scheduler.requests
    e = ae.engine
    assert e.allocator.num_used == e.cache.num_pages == e.cache.num_evictable


async def test_abort_ends_a_stream_with_an_abort_delta(aengine):
    ae = aengine()
    gen = ae.generate("x", [1, 2, 3], greedy(10_000))
    first = await gen.__anext__()
    assert not first.finished
    ae.abort("x")
    rest = [o async for o in gen]
    assert rest[-1].finished and rest[-1].finish_reason == "abort"


async def test_a_failing_step_fails_its_requests_only(aengine):
    ae = aengine(SlowRunner(64, P, fail_on_token=66))
    ok = asyncio.create_task(collect(ae, "ok", [1, 2, 3], greedy(5)))
    with pytest.raises(EngineStepError):
        await collect(ae, "boom", [66, 2, 3], greedy(5))
    # "ok" may have shared the failing step (then it fails too); a new request is served normally afterwards
    try:
        await ok
    except EngineStepError:
        pass
    outs = await collect(ae, "after", [7, 8], greedy(4))
    assert [x for o in outs for x in o.new_token_ids] == reference_greedy([7, 8], 4)


def test_sync_engine_step_error_aborts_the_step_and_keeps_going():
    engine = Engine(FakeRunner(32, P, fail_on_token=66), cache=CacheConfig(page_size=P), scheduler=SchedulerConfig())
    engine.add_request("boom", [66, 1], greedy(3))
    with pytest.raises(EngineStepError) as e:
        engine.step()
    assert e.value.req_ids == ("boom",)
    engine.add_request("fine", [1, 2], greedy(3))
    outs = []
    while engine.has_work():
        outs += engine.step()
    assert [o.finish_reason for o in outs if o.finished] == ["abort", "length"]
    assert engine.allocator.num_used == engine.cache.num_pages == engine.cache.num_evictable


async def test_a_slow_consumer_gets_several_tokens_per_delta_and_the_same_stream(aengine):
    ae = aengine()
    prompt = [3, 4, 5]
    outs = []
    async for o in ae.generate("slow", prompt, greedy(24)):
        outs.append(o)
        await asyncio.sleep(0.03)  # ~6 engine steps of 5 ms pile up behind each delta
    assert [x for o in outs for x in o.new_token_ids] == reference_greedy(prompt, 24)
    assert outs[-1].finished and outs[-1].num_output_tokens == 24 and not any(o.finished for o in outs[:-1])
    assert len(outs) < 24 and max(len(o.new_token_ids) for o in outs) > 1  # coalesced, not one message per token


def test_merged_deltas_concatenate_and_keep_the_later_status() -> None:
    from shared.engine.async_engine import merge_deltas
    from shared.engine.request import TokenLogprobs

    lp = TokenLogprobs(token_id=1, logprob=-0.5)
    a = RequestOutput("r", (1, 2), "ab", None, num_prompt_tokens=3, num_output_tokens=2)
    b = RequestOutput(
        "r", (3,), "c", None, finished=True, finish_reason="length", num_prompt_tokens=3, num_output_tokens=3
    )
    m = merge_deltas(a, b)
    assert (m.new_token_ids, m.new_text, m.new_logprobs) == ((1, 2, 3), "abc", None)
    assert (m.finished, m.finish_reason, m.num_output_tokens) == (True, "length", 3)
    with_lp = merge_deltas(RequestOutput("r", (1,), new_logprobs=(lp,)), RequestOutput("r", (2,), new_logprobs=(lp,)))
    assert with_lp.new_logprobs == (lp, lp)
    # the prompt logprobs come on a request's first delta only: merging it into a later one must keep them
    first = RequestOutput("r", (1,), prompt_logprobs=(lp,))
    assert merge_deltas(first, RequestOutput("r", (2,))).prompt_logprobs == (lp,)


async def test_coalescing_keeps_the_samples_of_one_queue_apart() -> None:
    from shared.engine.async_engine import _coalesce

    q: asyncio.Queue = asyncio.Queue()
    for item in (
        RequestOutput("b", (2,)),
        RequestOutput("a", (3,)),
        RequestOutput("b", (4,), finished=True),
        RequestOutput("b", (5,)),
        RequestOutput("a", (6,)),
    ):
        q.put_nowait(item)
    out = _coalesce(RequestOutput("a", (1,)), q)
    assert [(o.req_id, o.new_token_ids, o.finished) for o in out] == [
        ("a", (1, 3, 6), False),
        ("b", (2, 4), True),
        ("b", (5,), False),
    ]  # never merged into a finished delta
    assert q.empty()


async def test_build_makes_the_engine_on_the_engine_thread_and_serves_from_it() -> None:
    # One thread runs every torch op of the engine, loading included (one OpenMP team: see async_engine)
    built_on: list[str] = []

    def factory() -> Engine:
        import threading

        built_on.append(threading.current_thread().name)
        return Engine(SlowRunner(64, P), cache=CacheConfig(page_size=P), scheduler=SchedulerConfig())

    ae = await AsyncEngine.build(factory)
    try:
        assert built_on == ["pdrelay-engine"] and ae.engine is not None
        outs = await collect(ae, "b", [5, 6], greedy(4))
        assert [x for o in outs for x in o.new_token_ids] == reference_greedy([5, 6], 4)
    finally:
        ae.shutdown()


async def test_build_raises_what_the_factory_raised_and_ends_the_thread() -> None:
    def factory() -> Engine:
        raise FileNotFoundError("no weights in /nowhere")

    with pytest.raises(FileNotFoundError, match="no weights"):
        await AsyncEngine.build(factory)


async def test_stream_interval_sends_the_first_token_at_once_then_groups_and_the_same_tokens() -> None:
    ae = AsyncEngine(_engine(), stream_interval=3)
    try:
        prompt = [3, 4, 5]
        outs = await collect(ae, "si", prompt, greedy(11))
        assert [x for o in outs for x in o.new_token_ids] == reference_greedy(prompt, 11)
        sizes = [len(o.new_token_ids) for o in outs]
        # 1 at once (TTFT), then groups of 3 (a slow consumer may merge whole groups), the last 1 with the finish
        assert sizes[0] == 1 and sizes[-1] == 1 and all(s % 3 == 0 for s in sizes[1:-1]), sizes
        assert outs[-1].finished and outs[-1].num_output_tokens == 11 and not any(o.finished for o in outs[:-1])
        # an abort sends what was held back with it: nothing generated is lost
        gen = ae.generate("si-abort", prompt, greedy(10_000))
        got = [await gen.__anext__()]
        got.append(await gen.__anext__())
        ae.abort("si-abort")
        got += [o async for o in gen]
        assert got[-1].finish_reason == "abort"
        assert sum(len(o.new_token_ids) for o in got) == got[-1].num_output_tokens
        assert [x for o in got for x in o.new_token_ids] == reference_greedy(prompt, got[-1].num_output_tokens)
        assert not ae._held  # nothing left behind for finished requests
    finally:
        ae.shutdown()


def test_stream_interval_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="stream_interval"):
        AsyncEngine(_engine(), stream_interval=0)


def _engine() -> Engine:
    return Engine(SlowRunner(64, P), cache=CacheConfig(page_size=P), scheduler=SchedulerConfig())


class LosesARank(SlowRunner):
    """A tensor-parallel runner whose other rank dies once a step holds token 66 (shared/engine/parallel)."""

    def forward(self, out: SchedulerOutput) -> torch.Tensor:
        if any(66 in s.token_ids for s in out.seqs):
            raise RankLost("tensor-parallel rank 1 of 2 (pid 1) exited with code -9")
        return super().forward(out)


async def test_a_lost_rank_ends_every_stream_and_stops_the_engine(aengine):
    ae = aengine(LosesARank(64, P))
    long = asyncio.ensure_future(collect(ae, "long", [1, 2], greedy(200)))
    await asyncio.sleep(0.05)  # "long" is decoding when the rank dies
    with pytest.raises(EngineStepError) as boom:
        await collect(ae, "boom", [66, 1], greedy(3))
    assert isinstance(boom.value.__cause__, RankLost)
    with pytest.raises((EngineStepError, RankLost)) as other:  # in the failed step, or ended after it
        await long
    assert "rank 1 of 2" in str(other.value)
    with pytest.raises(EngineError, match="shut down"):  # no step can run without the rank: refused, not hung
        await collect(ae, "later", [3, 4], greedy(2))
