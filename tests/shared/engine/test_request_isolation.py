"""Every sampling parameter runs through the real engine (the forward pass hands back inference tensors, which the
sampler edits in place), and a request whose own processing fails is aborted alone: the other requests of its
batch get exactly the tokens they get without it, and the engine keeps serving.

The failing request is made by the request_poison fault (a stop string "pdrelay:poison[@N]" with the fault
injected), the same point a served cluster rehearses it with; the output-processing failure patches the stop
checker for one request id."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.async_engine import AsyncEngine
from shared.engine.engine import Engine
from shared.engine.errors import RequestFailed
from shared.engine.model_runner import ModelRunner
from shared.engine.sampler.sampler import POISON_STOP
from shared.modelspec.sampling import SamplingParams
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401  (session fixture)

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16], [17, 18], [19, 20, 21], [22, 23, 24, 25], [26, 27]]


def greedy(n: int = 8, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


@pytest.fixture
def make_engine(tiny_llama_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir, local_files_only=True)  # the poison marker is a stop string

    def make(poison: bool = False) -> Engine:
        return Engine(
            ModelRunner(tiny_llama_dir, num_pages=128, page_size=16),
            cache=CacheConfig(page_size=16),
            scheduler=SchedulerConfig(),
            tokenizer=tok,
            poison=poison,
        )

    return make


def test_every_sampling_parameter_runs_through_the_engine(make_engine):
    engine = make_engine()
    plain = engine.generate([PROMPTS[0]], greedy(12))[0].token_ids
    assert len(plain) == 12

    biased = engine.generate([PROMPTS[0]], greedy(12, logit_bias={77: 100.0}))[0]
    assert biased.token_ids == (77,) * 12

    banned = engine.generate([PROMPTS[0]], greedy(12, logit_bias={plain[0]: -100.0}))[0]
    assert plain[0] not in banned.token_ids

    rep = engine.generate([PROMPTS[0]], greedy(12, repetition_penalty=10.0))[0].token_ids
    assert not set(rep) & set(PROMPTS[0]) and len(set(rep)) == len(rep), rep  # seen tokens are pushed far down
    for kw in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        penalized = engine.generate([PROMPTS[0]], greedy(12, **kw))[0].token_ids
        assert max(Counter(penalized).values()) <= max(Counter(plain).values()), (kw, penalized, plain)

    stop_at = plain[3]
    stopped = engine.generate([PROMPTS[0]], greedy(12, stop_token_ids=[stop_at]))[0]
    assert stopped.token_ids == plain[: plain.index(stop_at) + 1] and stopped.finish_reason == "stop"
    eos = engine.runner.eos_token_ids
    kept = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=6, min_tokens=6, temperature=0.0))[0]
    assert len(kept.token_ids) == 6 and not set(kept.token_ids) & set(eos)

    seeded = SamplingParams(max_tokens=8, temperature=1.0, seed=1234, ignore_eos=True)
    alone = engine.generate([PROMPTS[1]], seeded)[0].token_ids
    batched = engine.generate([PROMPTS[0], PROMPTS[1], PROMPTS[2]], [greedy(8), seeded, greedy(8)])
    assert batched[1].token_ids == alone  # a seed's tokens do not depend on the rest of the batch


def test_a_poisoned_request_fails_alone_and_its_batch_is_untouched(make_engine):
    solo = [c.token_ids for c in make_engine().generate(PROMPTS[:6], greedy(8, logit_bias={40: 1.5}))]
    engine = make_engine(poison=True)
    for at in ("", "@0", "@3"):  # before its first token, and mid-stream
        params = [greedy(8, logit_bias={40: 1.5})] * 6 + [greedy(8, stop=[POISON_STOP + at])]
        done = engine.generate([*PROMPTS[:6], PROMPTS[6]], params, prefix=f"p{at}")
        assert [c.token_ids for c in done[:6]] == solo
        assert all(c.finish_reason == "length" for c in done[:6])
        assert done[6].finish_reason == "abort"
        assert len(done[6].token_ids) == (int(at[1:]) if at else 0)
    assert engine.stats.num_free_pages + engine.stats.num_evictable_pages == engine.stats.num_total_pages
    assert [c.token_ids for c in engine.generate(PROMPTS[:6], greedy(8, logit_bias={40: 1.5}))] == solo


def test_a_failure_in_one_requests_output_processing_aborts_only_it(make_engine, monkeypatch):
    engine = make_engine()
    solo = [c.token_ids for c in engine.generate(PROMPTS[:3], greedy(6))]
    checker = engine.scheduler.stop_checker
    real = checker.check

    def check(req):  # a detokenizer / stop check failing for one request only
        if req.req_id == "bad-1" and req.num_output_tokens == 2:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return real(req)

    monkeypatch.setattr(checker, "check", check)
    done = engine.generate(PROMPTS[:3], greedy(6), prefix="bad")
    assert done[1].finish_reason == "abort" and len(done[1].token_ids) == 1
    assert [done[0].token_ids, done[2].token_ids] == [solo[0], solo[2]]


async def test_a_failed_request_ends_its_stream_with_request_failed(make_engine):
    ae = AsyncEngine(make_engine(poison=True))
    try:

        async def run(rid: str, prompt: list[int], params: SamplingParams) -> list[int]:
            return [t async for o in ae.generate(rid, prompt, params) for t in o.new_token_ids]

        ordinary = [run(f"ok-{i}", PROMPTS[i], greedy(10)) for i in range(6)]
        bad = run("bad", PROMPTS[6], greedy(10, stop=[POISON_STOP + "@2"]))
        got = await asyncio.gather(*ordinary, bad, return_exceptions=True)
        assert isinstance(got[6], RequestFailed) and "fault injection request_poison" in str(got[6])
        assert all(isinstance(g, list) and len(g) == 10 for g in got[:6]), got
        assert ae.last_error is None  # no step failed
    finally:
        ae.shutdown()
