"""n > 1 in the engine: one prefill, the other samples fork from the prompt's KV (shared full pages, a copied
partial page). Greedy samples equal the n = 1 output; seeded sample i equals an n = 1 request with seed + i (so
the forked KV is exactly the prefilled one); the prompt is computed once; the decode role forks after a hand-off."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.engine import Engine
from shared.engine.model_runner import ModelRunner
from shared.modelspec.sampling import SamplingParams
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401  (session fixture)

PAGE = 16


@pytest.fixture(scope="module")
def runner(tiny_llama_dir: Path) -> ModelRunner:
    return ModelRunner(tiny_llama_dir, num_pages=256, page_size=PAGE)


def _engine(runner: ModelRunner) -> Engine:
    runner.kv.buffer.zero_()
    return Engine(runner, cache=CacheConfig(page_size=PAGE), scheduler=SchedulerConfig(max_running_requests=16))


def _run(engine: Engine, req_id: str, prompt: list[int], params: SamplingParams) -> dict[int, list[int]]:
    engine.add_request(req_id, prompt, params)
    out: dict[int, list[int]] = defaultdict(list)
    done = 0
    while done < params.n:
        for o in engine.step():
            out[o.index].extend(o.new_token_ids)
            done += o.finished
    return dict(out)


@pytest.mark.parametrize("prompt_len", [21, 17, 16], ids=["partial-page", "full-pages", "one-page"])
def test_greedy_samples_equal_the_single_sample(runner: ModelRunner, prompt_len: int):
    prompt = [(7 * i + 3) % 500 for i in range(prompt_len)]
    engine = _engine(runner)
    one = _run(engine, "one", prompt, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))[0]
    engine = _engine(runner)
    many = _run(engine, "many", prompt, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, n=4))
    assert [many[i] for i in range(4)] == [one] * 4
    s = engine.stats
    assert s.num_prompt_tokens == prompt_len  # counted once
    # one prefill of the prompt + one token per fork (position L-1) + the decode steps of all four samples
    assert s.totals.num_tokens == prompt_len + 3 + 4 * 19


def test_seeded_samples_are_distinct_and_each_is_its_own_seed(runner: ModelRunner):
    prompt = [(5 * i + 1) % 500 for i in range(37)]
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=11, ignore_eos=True, n=3)
    a = _run(_engine(runner), "a", prompt, params)
    b = _run(_engine(runner), "b", prompt, params)
    assert a == b  # reproducible
    assert len({tuple(v) for v in a.values()}) == 3  # distinct
    for i in range(3):
        single = _run(
            _engine(runner),
            f"s{i}",
            prompt,
            SamplingParams(max_tokens=12, temperature=1.0, seed=11 + i, ignore_eos=True),
        )[0]
        assert a[i] == single


def test_decode_role_forks_after_the_hand_off(runner: ModelRunner):
    prompt = [(3 * i + 2) % 500 for i in range(29)]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    ref = _run(_engine(runner), "ref", prompt, params)[0]
    # "prefill": compute the prompt in one engine, copy its pages into the reserved pages of another
    src = _engine(runner)
    src.add_request("p", prompt, SamplingParams(max_tokens=1, temperature=0.0), hold_pages=True)
    first = None
    while first is None:
        for o in src.step():
            first = o.new_token_ids[0]
    pages = src.held_pages("p")
    saved = runner.kv.buffer[list(pages)].clone()
    dst = Engine(runner, cache=CacheConfig(page_size=PAGE), scheduler=SchedulerConfig(max_running_requests=16))
    res = dst.reserve_remote("d", prompt, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, n=3))
    runner.kv.buffer[list(res.page_ids)] = saved
    out: dict[int, list[int]] = defaultdict(list)
    for o in dst.activate_remote("d", first):
        out[o.index].extend(o.new_token_ids)
    done = 0
    while done < 3:
        for o in dst.step():
            out[o.index].extend(o.new_token_ids)
            done += o.finished
    assert [out[i] for i in range(3)] == [ref] * 3


def test_aborting_sample_zero_aborts_all(runner: ModelRunner):
    engine = _engine(runner)
    engine.add_request("x", [1, 2, 3, 4, 5], SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True, n=3))
    engine.step()
    engine.step()
    engine.abort("x")
    reasons = {}
    while engine.has_work():
        for o in engine.step():
            if o.finished:
                reasons[o.index] = o.finish_reason
    assert reasons == {0: "abort", 1: "abort", 2: "abort"}
    assert engine.allocator.num_free + engine.cache.num_evictable == engine.allocator.capacity


def test_seeded_sampling_after_a_hand_off_continues_the_seed(runner: ModelRunner):
    """Decode skips the draw prefill made for the first token, so a seeded request gives the same tokens
    disaggregated as colocated."""
    prompt = [(11 * i + 4) % 500 for i in range(23)]
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=5, ignore_eos=True)
    ref = _run(_engine(runner), "ref", prompt, params)[0]
    src = _engine(runner)
    src.add_request("p", prompt, SamplingParams(max_tokens=1, temperature=1.0, seed=5), hold_pages=True)
    first = None
    while first is None:
        for o in src.step():
            first = o.new_token_ids[0]
    saved = runner.kv.buffer[list(src.held_pages("p"))].clone()
    dst = Engine(runner, cache=CacheConfig(page_size=PAGE), scheduler=SchedulerConfig(max_running_requests=16))
    res = dst.reserve_remote("d", prompt, params)
    runner.kv.buffer[list(res.page_ids)] = saved
    got = [t for o in dst.activate_remote("d", first) for t in o.new_token_ids]
    while dst.has_work():
        for o in dst.step():
            got.extend(o.new_token_ids)
    assert got == ref
