"""The two ends of a KV hand-off inside the engine (shared/engine/scheduler/handoff_pages.py), without a model.

Two Engines over FakeRunner (its "KV" is the token ids written into page slots, and its next token hashes the
context read back from the pages): a prefill engine computes a prompt with hold_pages, the test copies the
written pages into the pages decode reserved, decode activates and continues. Any page mix-up (wrong page,
page freed early, a skipped prefix misaligned) changes the output, which is compared with `reference_greedy`
computed from the true token sequence. Page accounting is checked after every hand-off.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections import Counter

import pytest
from test_engine_fakes import FakeRunner, reference_greedy

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.async_engine import AsyncEngine
from shared.engine.engine import Engine
from shared.engine.errors import InvalidRequest, QueueFull, UnknownRequest
from shared.modelspec.sampling import SamplingParams

P = 4
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def make_engine(
    num_pages: int = 64,
    *,
    max_running_requests: int | None = None,  # type: ignore[no-untyped-def]
    **kw,
) -> Engine:
    sched = SchedulerConfig(max_prefill_tokens=64)
    if max_running_requests is not None:
        sched = dataclasses.replace(sched, max_running_requests=max_running_requests)
    return Engine(FakeRunner(num_pages, P), cache=CacheConfig(page_size=P), scheduler=sched, **kw)


def prefill(pre: Engine, rid: str, prompt: list[int], params: SamplingParams = GREEDY) -> tuple[int, tuple[int, ...]]:
    """Run the prompt on the prefill engine with its pages held; (first token, held page ids)."""
    pre.add_request(rid, prompt, dataclasses.replace(params, max_tokens=1), hold_pages=True)
    first = None
    while pre.has_work():
        for o in pre.step():
            if o.req_id == rid and o.finished:
                assert o.finish_reason == "length"
                first = o.new_token_ids[0]
    assert first is not None
    return first, pre.held_pages(rid)


def copy_pages(pre: Engine, dec: Engine, src: tuple[int, ...], dst: tuple[int, ...]) -> None:
    """What the transfer backend does: whole pages, src[i] -> dst[i]."""
    assert len(src) == len(dst)
    dec.runner.kv[list(dst)] = pre.runner.kv[list(src)]  # type: ignore[attr-defined]


def run_to_end(dec: Engine, rid: str, first: list[int]) -> list[int]:
    toks = list(first)
    while dec.has_work():
        for o in dec.step():
            if o.req_id == rid:
                toks.extend(o.new_token_ids)
    return toks


def handoff(pre: Engine, dec: Engine, rid: str, prompt: list[int], params: SamplingParams = GREEDY) -> list[int]:
    """One complete hand-off; returns decode's output tokens."""
    res = dec.reserve_remote(rid, prompt, params)
    assert len(res.page_ids) == -(-len(prompt) // P) and res.skip_tokens % P == 0
    first, held = prefill(pre, rid, prompt, params)
    skip = res.skip_tokens // P
    copy_pages(pre, dec, held[skip:], res.page_ids[skip:])
    assert pre.release_held(rid)
    outs = dec.activate_remote(rid, first)
    assert outs[0].new_token_ids == (first,)
    return run_to_end(dec, rid, [first])


def check_accounting(e: Engine) -> None:
    """Every page reference belongs to a running/reserved/held request or to the cache (quarantine excluded)."""
    s = e.scheduler
    expect: Counter[int] = Counter()
    for req in [*s.running, *s.handoff.remote.values(), *s.handoff.held.values()]:
        expect.update(req.page_ids)
    expect.update(s.kv.cache.page_ids())
    for _, pages in s.handoff._quarantine:
        expect.update(pages)
    refs = s.kv.allocator.refcounts()
    assert all(refs[p] == n for p, n in expect.items()), "refcount differs from holders"
    assert int(refs.sum()) == sum(expect.values()), "a page is referenced by nobody we know (leak)"


def idle_and_clean(e: Engine) -> bool:
    s = e.scheduler
    return (
        not s.running
        and not s.handoff.remote
        and not s.handoff.held
        and s.handoff.num_quarantined_pages == 0
        and e.allocator.num_used == e.cache.num_pages == e.cache.num_evictable
    )


# ---- the whole round trip -----------------------------------------------------------------------------------------
def test_handoffs_match_reference_with_prefix_hits_on_both_sides():
    rng = random.Random(7)
    pre, dec = make_engine(), make_engine()
    shared = [rng.randrange(1, 97) for _ in range(13)]
    prompts = [
        shared[: rng.choice([0, 4, 8, 13])] + [rng.randrange(1, 97) for _ in range(rng.randrange(1, 20))]
        for _ in range(12)
    ]
    prompts.append(list(prompts[3]))  # the very same prompt again: decode's cache covers all its full pages
    skips = []
    for i, p in enumerate(prompts):
        out = handoff(pre, dec, f"r{i}", p)
        assert out == reference_greedy(p, GREEDY.max_tokens), f"prompt {i} ({len(p)} tokens)"
        skips.append(dec.stats.num_cached_prompt_tokens)
        check_accounting(pre)
        check_accounting(dec)
    assert dec.stats.num_cached_prompt_tokens > 0, "decode's own prefix cache was meant to be hit"
    assert pre.stats.num_cached_prompt_tokens > 0, "prefill's prefix cache was meant to be hit"
    assert idle_and_clean(pre) and idle_and_clean(dec)


def test_reserve_skips_pages_decode_already_caches():
    pre, dec = make_engine(), make_engine()
    prompt = list(range(1, 19))  # 18 tokens: 4 full pages + 2
    handoff(pre, dec, "a", prompt)
    cached = dict(zip(dec.cache.page_ids(), dec.cache.page_ids(), strict=True))
    res = dec.reserve_remote("b", prompt + [50, 51, 52], GREEDY)
    assert res.skip_tokens == 4 * P  # the 4 full pages of "a" (the match leaves one token to compute)
    assert all(p in cached for p in res.page_ids[:4])
    assert not any(p in cached for p in res.page_ids[4:])
    assert dec.cancel_remote("b", 0.0)
    check_accounting(dec)


def test_first_token_can_end_the_request_at_activation():
    pre, dec = make_engine(), make_engine()
    prompt = [5, 6, 7, 8, 9]
    one = dataclasses.replace(GREEDY, max_tokens=1)
    out = handoff(pre, dec, "one", prompt, one)
    assert out == reference_greedy(prompt, 1)
    assert idle_and_clean(dec)
    # EOS as the first token: reference's first token declared as EOS ends it with "stop"
    eos = reference_greedy(prompt, 1)[0]
    dec2 = Engine(
        FakeRunner(32, P, eos_token_ids=(eos,)),
        cache=CacheConfig(page_size=P),
        scheduler=SchedulerConfig(max_prefill_tokens=64),
    )
    res = dec2.reserve_remote("e", prompt, SamplingParams(max_tokens=5, temperature=0.0))
    first, held = prefill(pre, "e", prompt)
    copy_pages(pre, dec2, held, res.page_ids)
    pre.release_held("e")
    (o,) = dec2.activate_remote("e", first)
    assert o.finished and o.finish_reason == "stop"
    assert not dec2.has_work() and idle_and_clean(dec2)


# ---- decode side: errors and cancellation -------------------------------------------------------------------------
def test_reserve_refuses_bad_input_without_taking_pages():
    dec = make_engine(num_pages=8, max_running_requests=2)
    free = dec.allocator.num_free
    with pytest.raises(InvalidRequest, match="empty"):
        dec.reserve_remote("x", [], GREEDY)
    with pytest.raises(InvalidRequest, match="context"):
        dec.reserve_remote("x", list(range(1, 40)), GREEDY)  # 8 pages of 4 = 32 tokens of context
    with pytest.raises(InvalidRequest, match="vocabulary"):
        dec.reserve_remote("x", [1, 2, 500], GREEDY)
    dec.reserve_remote("a", [1, 2, 3], GREEDY)
    with pytest.raises(InvalidRequest, match="already in use"):
        dec.reserve_remote("a", [1, 2, 3], GREEDY)
    dec.add_request("w", [4, 5], GREEDY)
    with pytest.raises(InvalidRequest, match="already in use"):
        dec.reserve_remote("w", [1, 2, 3], GREEDY)
    dec.reserve_remote("b", [1, 2, 3], GREEDY)
    with pytest.raises(QueueFull, match="max_running_requests"):
        dec.reserve_remote("c", [1, 2, 3], GREEDY)  # 2 arriving already
    assert dec.allocator.num_free == free - 2
    check_accounting(dec)


def test_reserve_without_enough_pages_is_queue_full_and_unlocks_the_prefix():
    pre, dec = make_engine(), make_engine(num_pages=8)
    handoff(pre, dec, "a", list(range(1, 10)))  # 2 full pages cached on decode
    dec.reserve_remote("hog", list(range(60, 73)), GREEDY)  # 4 pages; the cached 2 stay evictable
    before = (dec.allocator.num_free, dec.cache.num_evictable)
    with pytest.raises(QueueFull, match="not enough free KV pages"):
        dec.reserve_remote("big", list(range(1, 9)) + list(range(30, 50)), GREEDY)  # hits 2 pages, needs 5 more
    assert (dec.allocator.num_free, dec.cache.num_evictable) == before, "the failed reservation kept pages"
    check_accounting(dec)


def test_activate_unknown_or_cancelled_request_is_a_typed_error():
    dec = make_engine()
    with pytest.raises(UnknownRequest, match="never"):
        dec.activate_remote("nope", 3)
    dec.reserve_remote("a", [1, 2, 3, 4, 5], GREEDY)
    assert dec.cancel_remote("a", 0.0)
    with pytest.raises(UnknownRequest):
        dec.activate_remote("a", 3)
    assert not dec.cancel_remote("a", 0.0) and not dec.cancel_remote("nope", 0.0)
    assert isinstance(UnknownRequest("x"), KeyError)
    assert idle_and_clean(dec)


def test_cancel_quarantines_written_pages_and_unlocks_cached_ones_at_once():
    pre, dec = make_engine(), make_engine(num_pages=16)
    prompt = list(range(1, 10))
    handoff(pre, dec, "a", prompt)  # decode caches 2 full pages
    res = dec.reserve_remote("b", prompt + [40, 41, 42, 43, 44], GREEDY)
    assert res.skip_tokens == 2 * P
    own = set(res.page_ids[2:])
    free_before = dec.allocator.num_free
    t0 = time.monotonic()
    assert dec.cancel_remote("b", 5.0)
    assert dec.scheduler.handoff.num_quarantined_pages == len(own)
    assert dec.allocator.num_free == free_before, "quarantined pages must stay allocated"
    assert dec.cache.num_evictable == dec.cache.num_pages, "the cached prefix must be unlocked at once"
    check_accounting(dec)
    # new reservations never get quarantined pages, even when that means evicting the cache
    others = dec.reserve_remote("c", list(range(60, 60 + 4 * P)), GREEDY)
    assert not own & set(others.page_ids)
    dec.cancel_remote("c", 0.0)
    assert dec.scheduler.handoff.release_expired(now=t0 + 4.9) == 0
    assert dec.scheduler.handoff.release_expired(now=t0 + 5.1) == len(own)
    assert idle_and_clean(dec)


def test_abort_of_a_reserved_request_keeps_its_pages_quarantined():
    # A cancel from the gateway (NATS) may arrive while prefill is still writing into the reserved pages:
    # freeing them at once would let another request's KV be overwritten.
    dec = make_engine(num_pages=16, handoff_quarantine_s=30.0)
    res = dec.reserve_remote("a", list(range(1, 12)), GREEDY)
    assert dec.abort("a")
    assert dec.scheduler.handoff.num_quarantined_pages == len(res.page_ids)
    assert dec.allocator.num_free == 16 - len(res.page_ids)
    with pytest.raises(UnknownRequest):
        dec.activate_remote("a", 1)


async def test_idle_async_engine_frees_expired_quarantine():
    # Load reports say free_pages == total_pages once quarantine is over, also when no request comes after it.
    eng = make_engine(num_pages=16)
    a = AsyncEngine(eng)
    try:
        await a.call(lambda: eng.reserve_remote("a", list(range(1, 12)), GREEDY))
        await a.call(lambda: eng.cancel_remote("a", 0.3))
        assert a.stats().num_free_pages == 16 - 3
        for _ in range(100):
            if a.stats().num_free_pages == 16:
                break
            await asyncio.sleep(0.02)
        assert a.stats().num_free_pages == 16, "expired quarantine not freed while the engine is idle"
    finally:
        a.shutdown()


# ---- prefill side: held pages --------------------------------------------------------------------------------------
def test_held_pages_stay_until_released_and_then_feed_the_prefix_cache():
    pre = make_engine(num_pages=16)
    prompt = list(range(1, 11))  # 2 full pages + 2 tokens
    first, held = prefill(pre, "h", prompt)
    assert first == reference_greedy(prompt, 1)[0]
    assert len(held) == 3
    assert pre.allocator.num_free == 16 - 3 and pre.cache.num_evictable == 0, "held pages must not be evictable"
    assert pre.scheduler.kv.available_pages == 13
    check_accounting(pre)
    assert pre.release_held("h") and not pre.release_held("h")
    with pytest.raises(UnknownRequest, match="holds no pages"):
        pre.held_pages("h")
    assert pre.cache.num_pages == 2 and idle_and_clean(pre)
    # an aborted hold_pages request holds nothing
    pre.add_request("x", prompt + [3, 3, 3], GREEDY, hold_pages=True)
    pre.abort("x")
    while pre.has_work():
        pre.step()
    with pytest.raises(UnknownRequest):
        pre.held_pages("x")
    assert idle_and_clean(pre)


# ---- AsyncEngine: a caller that goes away mid-command ---------------------------------------------------------------
async def _busy(a: AsyncEngine, seconds: float) -> asyncio.Task[None]:
    """Keep the engine thread inside one command for `seconds`, so the next commands queue behind it."""
    started = asyncio.Event()
    loop = asyncio.get_running_loop()

    def block() -> None:
        loop.call_soon_threadsafe(started.set)
        time.sleep(seconds)

    task = asyncio.ensure_future(a.call(block))
    await started.wait()
    return task


async def test_cancelled_call_leaves_the_engine_thread_running():
    # decode killed while prefill awaits engine.held_pages(): the RPC task is cancelled mid-call
    eng = make_engine()
    a = AsyncEngine(eng)
    try:
        busy = await _busy(a, 0.2)
        t = asyncio.ensure_future(a.call(lambda: 42))
        await asyncio.sleep(0.01)
        t.cancel()
        await busy
        assert await asyncio.wait_for(a.call(lambda: 7), 5) == 7, "engine thread died"
    finally:
        a.shutdown()


async def test_generate_cancelled_before_admission_holds_nothing():
    # a hold_pages request whose caller is gone before the engine took it: it must not run and hold pages
    eng = make_engine(num_pages=16)
    a = AsyncEngine(eng)

    async def consume() -> None:
        async for _ in a.generate("h", list(range(1, 11)), dataclasses.replace(GREEDY, max_tokens=1), hold_pages=True):
            pass

    try:
        busy = await _busy(a, 0.2)
        t = asyncio.ensure_future(consume())
        await asyncio.sleep(0.01)
        t.cancel()
        await busy
        await asyncio.sleep(0.1)
        assert await asyncio.wait_for(a.call(lambda: eng.release_held("h")), 5) is False
        assert await a.call(lambda: idle_and_clean(eng) and eng.allocator.num_free == 16)
    finally:
        a.shutdown()
