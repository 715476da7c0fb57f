"""Page accounting under churn: 1,000 random requests sharing prefixes, random aborts, a pool small enough to
force preemption. Every step, every page's reference count must equal the requests holding it plus the cache;
at the end every used page belongs to the cache, unlocked. Outputs of requests that were not aborted must equal
the reference (any page mix-up would change them)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from test_engine_fakes import FakeRunner, reference_greedy

from shared.config.groups import SchedulerConfig
from shared.engine.page_allocator import PageAllocator
from shared.engine.radix_cache import RadixCache
from shared.engine.scheduler import Scheduler
from shared.modelspec.sampling import SamplingParams

P = 4
NUM_REQUESTS = 1000


def check_accounting(s: Scheduler) -> None:
    expect: Counter[int] = Counter()
    for req in s.running:
        expect.update(req.page_ids)
        assert len(req.page_ids) * P >= req.num_computed_tokens
    for req in s.waiting:
        assert not req.page_ids and not req.num_locked
    expect.update(s.kv.cache.page_ids())
    refs = s.kv.allocator.refcounts()
    assert all(refs[p] == n for p, n in expect.items()), "refcount differs from holders"
    assert int(refs.sum()) == sum(expect.values()), "a page is referenced by nobody we know (leak)"


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_random_requests_leak_no_pages(policy: str):
    rng = random.Random(1234 if policy == "fcfs" else 4321)
    runner = FakeRunner(40, P)
    alloc = PageAllocator(40)
    cache = RadixCache(alloc, P)
    s = Scheduler(
        allocator=alloc,
        cache=cache,
        page_size=P,
        max_model_len=4096,
        config=SchedulerConfig(
            max_running_requests=12, max_prefill_tokens=32, schedule_policy=policy, new_token_ratio=0.2
        ),
        vocab_size=runner.vocab_size,
    )
    prefixes = [[rng.randrange(1, 97) for _ in range(rng.randrange(0, 25))] for _ in range(8)]
    prompts: dict[str, list[int]] = {}
    max_toks: dict[str, int] = {}
    got: dict[str, list[int]] = {}
    aborted: set[str] = set()
    finished: set[str] = set()
    added = 0
    steps = 0
    while added < NUM_REQUESTS or s.has_work():
        for _ in range(rng.choice([0, 0, 1, 2, 3])):
            if added < NUM_REQUESTS:
                rid = f"r{added}"
                prompts[rid] = rng.choice(prefixes) + [rng.randrange(1, 97) for _ in range(rng.randrange(1, 17))]
                max_toks[rid] = rng.randrange(1, 17)
                s.add_request(
                    rid,
                    prompts[rid],
                    SamplingParams(max_tokens=max_toks[rid], temperature=0, ignore_eos=True),
                    priority=rng.randrange(3),
                )
                added += 1
        if s.requests and rng.random() < 0.08:
            rid = rng.choice(sorted(s.requests))
            assert s.abort(rid)
            aborted.add(rid)
        out = s.schedule()
        toks = runner.forward(out).argmax(-1).tolist() if out.seqs else []
        if out.seqs and rng.random() < 0.03:  # abort between schedule() and update_from_output()
            rid = rng.choice([q.req_id for q in out.seqs])
            if s.abort(rid):
                aborted.add(rid)
        for d in s.update_from_output(out, toks):
            got.setdefault(d.req_id, []).extend(d.new_token_ids)
            if d.finished:
                assert d.req_id not in finished
                finished.add(d.req_id)
                assert (d.finish_reason == "abort") == (d.req_id in aborted)
        check_accounting(s)
        steps += 1
        assert steps < 50_000
    assert finished == set(prompts)
    assert s.counters.num_preemptions > 0, "the pool was meant to force preemption"
    assert s.counters.num_cached_prompt_tokens > 0, "prompts were meant to share prefixes"
    for rid, p in prompts.items():
        if rid not in aborted:
            assert got[rid] == reference_greedy(p, max_toks[rid]), rid
    cache.check_invariants()
    assert alloc.num_used == cache.num_pages == cache.num_evictable
    assert alloc.refcounts().max() <= 1
    cache.evict(cache.num_pages)
    assert alloc.num_used == 0
