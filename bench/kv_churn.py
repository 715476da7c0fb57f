"""Where a hand-off's pages really sit: source and destination page ids from the engine's own PageAllocator after
a seeded churn of requests, for bench/transfer.py's `--layout allocator`.

The two sides allocate differently, as the scheduler does (shared/engine/scheduler/):
- prefill: a request's prompt pages come one chunk per step (chunked prefill), alongside the chunks of the other
  requests in prefill, each growing behind the request's last page (KVManager.allocate); a finished request
  keeps its pages for a few steps (the hand-off in flight) and then frees them;
- decode: a hand-off reserves the whole prompt in one call (HandoffPages.reserve_remote); running requests grow
  by a page every page_tokens generated tokens and free everything when they finish.
Requests of random lengths (1 page up to the largest measured batch) keep the pool at about `occupancy`, so the
free pages are fragmented the way a busy engine's are; the measured request arrives after `steps` steps. Not
modelled: prefix-cache hits (they shorten what is written, whose pages are then the request's new ones anyway).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from shared.engine.page_allocator import PageAllocator


@dataclass(frozen=True)
class Churn:
    pool_pages: int
    max_request_pages: int
    steps: int = 1500
    occupancy: float = 0.75  # admission keeps pages held + still to come under this share of the pool
    chunk_pages: int = 32  # prefill chunk: 512 tokens of 16-token pages, the CPU default chunked_prefill_size
    page_tokens: int = 16
    arrival_prob: float = 0.3  # a new request per step with this probability (when it fits)


@dataclass
class _Req:
    want: int  # pages it will hold in all
    pages: list[int] = field(default_factory=list)
    timer: int = 0  # prefill: steps its pages stay held after prefill; decode: tokens still to generate
    prompt: int = 0  # decode: prompt pages (reserved at once)
    generated: int = 0  # decode: tokens generated so far


def prefill_pages(c: Churn, n: int, seed: int) -> list[int]:
    """The n pages a prefill instance's allocator gives a request that arrives after c.steps steps of churn."""
    rng = random.Random(seed)
    a = PageAllocator(c.pool_pages)
    live: list[_Req] = []
    target: _Req | None = None
    step = 0
    while True:
        if step == c.steps:
            target = _Req(n)
            live.append(target)
        elif rng.random() < c.arrival_prob:
            r = _Req(rng.randint(1, c.max_request_pages), timer=rng.randint(1, 5))
            if sum(x.want for x in live) + r.want <= c.occupancy * c.pool_pages:
                live.append(r)
        for r in list(live):
            if len(r.pages) < r.want:  # one chunk per request per step
                k = min(c.chunk_pages, r.want - len(r.pages))
                got = a.alloc(k, after=r.pages[-1] if r.pages else None)
                assert got is not None, "admission keeps room for every admitted request"
                r.pages.extend(got)
                if r is target and len(r.pages) == n:
                    return r.pages
            elif r is not target:
                r.timer -= 1
                if r.timer <= 0:  # hand-off done: pages back
                    a.decref(r.pages)
                    live.remove(r)
        step += 1


def decode_pages(c: Churn, n: int, seed: int) -> list[int]:
    """The n pages a decode instance's allocator reserves for a hand-off after c.steps steps of churn."""
    rng = random.Random(seed)
    a = PageAllocator(c.pool_pages)
    live: list[_Req] = []
    for _ in range(c.steps):
        if rng.random() < c.arrival_prob:
            prompt = rng.randint(1, c.max_request_pages)
            out_tokens = rng.randint(1, max(1, c.max_request_pages // 2) * c.page_tokens)
            want = prompt + -(-out_tokens // c.page_tokens)
            if sum(x.want for x in live) + want <= c.occupancy * c.pool_pages:
                got = a.alloc(prompt)
                assert got is not None
                live.append(_Req(want, got, timer=out_tokens, prompt=prompt))
        for r in list(live):  # one token per running request per step
            r.timer -= 1
            r.generated += 1
            if r.timer <= 0:
                a.decref(r.pages)
                live.remove(r)
            elif len(r.pages) < r.prompt + -(-r.generated // c.page_tokens):  # a new page every page_tokens
                got = a.alloc(1, after=r.pages[-1])
                assert got is not None
                r.pages.extend(got)
    got = a.alloc(n)
    assert got is not None, "admission keeps room for the measured request"
    return got


def num_descriptors(src: list[int], dst: list[int]) -> int:
    """Descriptors a write of src[i] -> dst[i] becomes once pairs contiguous on both sides merge
    (what shared/transfer/plan.py does with the addresses of these pages)."""
    return 1 + sum(1 for i in range(1, len(src)) if not (src[i] == src[i - 1] + 1 and dst[i] == dst[i - 1] + 1))
