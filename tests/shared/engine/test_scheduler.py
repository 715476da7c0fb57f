"""Scheduler unit tests without a model: the fake runner (test_engine_fakes) checks every page it is handed."""

from __future__ import annotations

import pytest
from test_engine_fakes import FakeRunner, reference_greedy

from shared.config.groups import SchedulerConfig
from shared.engine.errors import InvalidRequest, QueueFull
from shared.engine.page_allocator import PageAllocator
from shared.engine.radix_cache import RadixCache
from shared.engine.request import RequestOutput
from shared.engine.scheduler import Scheduler
from shared.engine.types import SchedulerOutput
from shared.modelspec.sampling import SamplingParams

P = 4


def make(
    num_pages: int = 64, *, prefix_cache: bool = True, max_model_len: int = 4096, **sched
) -> tuple[Scheduler, FakeRunner]:
    runner = FakeRunner(num_pages, P)
    alloc = PageAllocator(num_pages)
    cache = RadixCache(alloc, P, enabled=prefix_cache)
    return Scheduler(
        allocator=alloc,
        cache=cache,
        page_size=P,
        max_model_len=max_model_len,
        config=SchedulerConfig(**sched),
        vocab_size=runner.vocab_size,
    ), runner


def step(s: Scheduler, r: FakeRunner) -> tuple[SchedulerOutput, list[RequestOutput]]:
    out = s.schedule()
    toks = r.forward(out).argmax(-1).tolist() if out.seqs else []
    return out, s.update_from_output(out, toks)


def drain(s: Scheduler, r: FakeRunner, max_steps: int = 10_000) -> dict[str, list[int]]:
    toks: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not s.has_work():
            return toks
        for d in step(s, r)[1]:
            toks.setdefault(d.req_id, []).extend(d.new_token_ids)
    raise AssertionError("scheduler did not finish")


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def assert_no_leak(s: Scheduler) -> None:
    """Every used page belongs to the prefix cache, unlocked (evictable), with the cache's reference only."""
    a, c = s.kv.allocator, s.kv.cache
    c.check_invariants()
    assert a.num_used == c.num_pages == c.num_evictable
    refs = a.refcounts()
    assert refs.max(initial=0) <= 1
    assert not s.running and not len(s.waiting) and not s.requests


def test_long_prompt_is_chunked_and_only_the_last_chunk_samples():
    s, r = make(max_prefill_tokens=4)
    prompt = list(range(1, 11))
    s.add_request("a", prompt, greedy(3))
    outs = [step(s, r)[0] for _ in range(3)]
    assert [(o.seqs[0].start_pos, len(o.seqs[0].token_ids), o.seqs[0].need_logits) for o in outs] == [
        (0, 4, False),
        (4, 4, False),
        (8, 2, True),
    ]
    assert drain(s, r) == {"a": reference_greedy(prompt, 3)[1:]}
    assert_no_leak(s)


def test_prefill_chunks_mix_with_running_decodes():
    s, r = make(max_prefill_tokens=6)
    s.add_request("a", [1, 2, 3], greedy(10))
    step(s, r)  # a's prefill
    s.add_request("b", list(range(20, 40)), greedy(2))
    out, _ = step(s, r)
    shape = {q.req_id: len(q.token_ids) for q in out.seqs}
    assert shape == {"a": 1, "b": 5}  # the decode goes first, the chunk takes the rest of the budget
    toks = drain(s, r)
    assert toks["b"] == reference_greedy(list(range(20, 40)), 2)
    assert_no_leak(s)


def test_admission_waits_for_pages_with_output_headroom():
    # each request: 8 prompt tokens + all 8 output tokens reserved (ratio 1) = 4 pages; the pool has 10
    s, r = make(10, new_token_ratio=1.0, prefix_cache=False)
    for i in range(3):
        s.add_request(f"r{i}", [i + 1] * 8, greedy(8))
    out, _ = step(s, r)
    assert {q.req_id for q in out.seqs} == {"r0", "r1"} and s.num_waiting == 1
    while "r2" not in {q.req_id for q in step(s, r)[0].seqs}:
        assert s.num_running <= 2
    assert s.kv.cache.num_pages == 0
    assert drain(s, r) and s.kv.allocator.num_used == 0


def test_max_running_requests_caps_the_batch():
    s, r = make(max_running_requests=2)
    for i in range(5):
        s.add_request(f"r{i}", [i + 1, 2, 3], greedy(4))
    seen = 0
    while s.has_work():
        out, _ = step(s, r)
        assert len(out.seqs) <= 2
        seen = max(seen, s.num_running)
    assert seen == 2


def test_preemption_by_recompute_keeps_outputs_exact():
    # ratio 0 admits everything that fits now; growth then runs the pool dry and forces preemption
    s, r = make(12, new_token_ratio=0.0)
    prompts = {f"r{i}": [i + 1, i + 2, i + 3, i + 4, i + 5] for i in range(4)}
    for rid, p in prompts.items():
        s.add_request(rid, p, greedy(12))
    toks = drain(s, r)
    assert s.counters.num_preemptions > 0
    assert toks == {rid: reference_greedy(p, 12) for rid, p in prompts.items()}
    assert_no_leak(s)


def test_newest_request_is_preempted_first():
    s, r = make(6, new_token_ratio=0.0)
    s.add_request("old", [1, 2, 3, 4, 5], greedy(20))
    s.add_request("new", [6, 7, 8, 9, 10], greedy(20))
    preempted: list[str] = []
    while s.has_work():
        out, _ = step(s, r)
        preempted += out.preempted
    assert preempted and preempted[0] == "new" and "old" not in preempted[:1]


def test_priority_policy_orders_waiting_and_preempts_lower_priority():
    s, r = make(schedule_policy="priority", max_running_requests=1)
    s.add_request("low", [1, 2, 3], greedy(50), priority=5)
    step(s, r)
    s.add_request("mid", [4, 5, 6], greedy(2), priority=3)
    s.add_request("high", [7, 8, 9], greedy(2), priority=0)
    out, _ = step(s, r)
    assert out.preempted == ("low",) and [q.req_id for q in out.seqs] == ["high"]
    order: list[str] = []
    while s.has_work():
        out, deltas = step(s, r)
        order += [d.req_id for d in deltas if d.finished]
    assert order == ["high", "mid", "low"]
    assert_no_leak(s)


def test_fcfs_never_preempts_for_a_waiting_request():
    s, r = make(schedule_policy="fcfs", max_running_requests=1)
    s.add_request("first", [1, 2, 3], greedy(5), priority=9)
    step(s, r)
    s.add_request("second", [4, 5, 6], greedy(2), priority=0)
    out, _ = step(s, r)
    assert out.preempted == () and [q.req_id for q in out.seqs] == ["first"]


def test_prefix_is_reused_and_reported():
    s, r = make()
    shared = list(range(1, 13))  # 3 full pages
    s.add_request("a", shared + [50], greedy(2))
    drain(s, r)
    s.add_request("b", shared + [60, 61], greedy(3))
    out, deltas = step(s, r)
    assert out.seqs[0].start_pos == 12 and out.seqs[0].token_ids == (60, 61)
    assert deltas[0].num_cached_tokens == 12
    assert drain(s, r)["b"] == reference_greedy(shared + [60, 61], 3)[1:]
    # a prompt that is entirely cached still computes its last token (its logits give the first output)
    s.add_request("c", shared, greedy(1))
    out, deltas = step(s, r)
    assert out.seqs[0].start_pos == 8 and deltas[0].new_token_ids == tuple(reference_greedy(shared, 1))
    assert_no_leak(s)


def test_abort_at_every_stage_frees_everything():
    s, r = make(max_prefill_tokens=4)
    deltas: list[RequestOutput] = []
    finished: list[str] = []

    def run() -> None:
        out, d = step(s, r)
        deltas.extend(d)
        finished.extend(out.finished)

    s.add_request("waiting", [1, 2, 3], greedy(5))
    assert s.abort("waiting") and not s.abort("waiting") and not s.abort("never-added")
    s.add_request("prefilling", list(range(1, 11)), greedy(5))
    run()  # first chunk only
    assert s.abort("prefilling")
    s.add_request("decoding", [7, 7, 7], greedy(50))
    run()
    run()
    assert s.abort("decoding")
    s.add_request("in-flight", [8, 8, 8], greedy(50))
    run()
    out = s.schedule()
    finished.extend(out.finished)
    assert s.abort("in-flight")  # between schedule() and update_from_output()
    deltas += s.update_from_output(out, r.forward(out).argmax(-1).tolist())
    run()
    names = {"waiting", "prefilling", "decoding", "in-flight"}
    finals = [d for d in deltas if d.finished]
    assert sorted(d.req_id for d in finals) == sorted(names)
    assert all(d.finish_reason == "abort" and not d.new_token_ids for d in finals)
    # in-flight got its first token from its prefill step; the token of the aborted step is dropped
    assert sum(len(d.new_token_ids) for d in deltas if d.req_id == "in-flight") == 1
    assert sorted(finished) == sorted(names)
    assert_no_leak(s)


def test_finish_reasons_and_stop_tokens():
    s, r = make()
    prompt = [3, 1, 4]
    ref = reference_greedy(prompt, 8)
    s.add_request("len", prompt, greedy(8))
    s.add_request("stop", prompt, SamplingParams(max_tokens=8, temperature=0, stop_token_ids=(ref[2],)))
    finals: dict[str, RequestOutput] = {}
    while s.has_work():
        for d in step(s, r)[1]:
            if d.finished:
                finals[d.req_id] = d
    assert finals["len"].finish_reason == "length" and finals["len"].num_output_tokens == 8
    cut = ref.index(ref[2]) + 1
    assert finals["stop"].finish_reason == "stop" and finals["stop"].stop_reason == ref[2]
    assert finals["stop"].num_output_tokens == cut


def test_context_length_ends_a_request_with_length():
    s, r = make(max_model_len=10)
    s.add_request("a", [1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=None, temperature=0, ignore_eos=True))
    assert len(drain(s, r)["a"]) == 4


def test_bad_requests_are_refused_with_typed_errors():
    s, r = make(max_model_len=32, max_queued_requests=2)
    with pytest.raises(InvalidRequest, match="32"):
        s.add_request("long", list(range(1, 40)), greedy(1))
    with pytest.raises(InvalidRequest, match="empty"):
        s.add_request("empty", [], greedy(1))
    with pytest.raises(InvalidRequest, match="vocabulary"):
        s.add_request("oov", [1, 10_000], greedy(1))
    with pytest.raises(InvalidRequest, match="max_tokens"):
        s.add_request("zero", [1], SamplingParams(max_tokens=0))
    with pytest.raises(InvalidRequest, match="tokenizer"):
        s.add_request("stopstr", [1], SamplingParams(stop=("x",)))
    s.add_request("ok1", [1, 2], greedy(2))
    with pytest.raises(InvalidRequest, match="already in use"):
        s.add_request("ok1", [1, 2], greedy(2))
    s.add_request("ok2", [1, 2], greedy(2))
    with pytest.raises(QueueFull, match="max_queued_requests"):
        s.add_request("ok3", [1, 2], greedy(2))
    assert set(drain(s, r)) == {"ok1", "ok2"}


def test_pool_smaller_than_the_context_caps_requests():
    s, r = make(4, max_model_len=4096)  # 16 tokens fit in the pool
    assert s.max_model_len == 16
    s.add_request("a", [1, 2, 3], SamplingParams(max_tokens=None, temperature=0, ignore_eos=True))
    assert len(drain(s, r)["a"]) == 13
