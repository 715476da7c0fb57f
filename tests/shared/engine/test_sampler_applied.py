"""Sampling parameters are applied, not only accepted: logit_bias moves the argmax and bans tokens, top_k / min_p
restrict what can be drawn, stop_token_ids end a request; grammar masks are filled on a helper thread while the
forward pass runs and leave unconstrained rows of the same batch alone."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.errors import InvalidRequest
from shared.engine.grammar.mask import MaskFiller
from shared.engine.request import Request
from shared.engine.sampler import Sampler
from shared.modelspec.sampling import SamplingParams

V = 64


def _req(i: int, **kw) -> Request:
    return Request(f"r{i}", (1, 2, 3), SamplingParams(**kw))


def test_logit_bias_moves_the_argmax_and_bans_tokens():
    logits = torch.zeros(2, V)
    logits[:, 5] = 3.0
    reqs = [_req(0, temperature=0.0, logit_bias={9: 10.0}), _req(1, temperature=0.0, logit_bias={5: -100.0})]
    out = Sampler().sample(logits.clone(), reqs)
    assert out.token_ids[0] == 9 and out.token_ids[1] != 5
    for seed in range(20):  # a banned token is never drawn
        r = _req(2, temperature=1.0, seed=seed, logit_bias={5: -100.0})
        assert Sampler().sample(logits[:1].clone(), [r]).token_ids[0] != 5


def test_logit_bias_is_range_checked():
    with pytest.raises(InvalidRequest, match="logit_bias"):
        SamplingParams(logit_bias={3: 101.0}).validate(vocab_size=V)
    with pytest.raises(InvalidRequest, match="logit_bias"):
        SamplingParams(logit_bias={V: 1.0}).validate(vocab_size=V)


def test_top_k_and_min_p_restrict_the_draw():
    logits = torch.linspace(0.0, 4.0, V).unsqueeze(0)  # token V-1 most likely
    drawn_k, drawn_p, drawn_free = set(), set(), set()
    for seed in range(200):
        drawn_k.add(Sampler().sample(logits.clone(), [_req(0, temperature=5.0, top_k=3, seed=seed)]).token_ids[0])
        drawn_p.add(Sampler().sample(logits.clone(), [_req(0, temperature=5.0, min_p=0.9, seed=seed)]).token_ids[0])
        drawn_free.add(Sampler().sample(logits.clone(), [_req(0, temperature=5.0, seed=seed)]).token_ids[0])
    assert drawn_k <= {V - 1, V - 2, V - 3} and len(drawn_k) > 1
    # min_p 0.9 at temperature 5: only tokens within a factor 0.9 of the best (a handful at the top)
    assert drawn_p and min(drawn_p) > V - 10
    assert len(drawn_free) > 20  # without them the draw spreads over the vocabulary


def test_stop_token_ids_end_the_request(tiny_engine_factory):
    engine = tiny_engine_factory()
    free = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))[0]
    stop = free.token_ids[4]
    got = engine.generate(
        [[5, 6, 7]], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, stop_token_ids=[stop]), prefix="s"
    )[0]
    k = free.token_ids.index(stop)
    assert got.token_ids == free.token_ids[: k + 1] and got.finish_reason == "stop" and got.stop_reason == stop


class _SlowGrammar:
    """Stands in for a matcher: records when and on which thread its mask row was filled."""

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed
        self.filled_at = 0.0
        self.thread = ""

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        time.sleep(0.3)
        bitmask[row] = 0
        bitmask[row, self.allowed // 32] = 1 << (self.allowed % 32)
        self.filled_at = time.monotonic()
        self.thread = threading.current_thread().name


def test_masks_are_filled_while_the_forward_runs_and_skip_free_rows():
    masks = MaskFiller(V)
    reqs = [_req(0, temperature=0.0), _req(1, temperature=0.0), _req(2, temperature=0.0)]
    g = _SlowGrammar(allowed=17)
    reqs[1].grammar = g  # type: ignore[assignment]
    pending = masks.start(reqs)
    started = time.monotonic()
    assert pending is not None and pending.rows == [1]
    assert not pending.done.done()  # start() does not wait for the fill: the forward pass runs meanwhile
    logits = torch.zeros(3, V)
    logits[:, 40] = 5.0
    out = Sampler().sample(logits, reqs, lambda x: masks.apply(pending, x))
    assert out.token_ids == [40, 17, 40]  # only the constrained row is masked
    assert g.filled_at >= started  # on the helper thread, or here if the helper never got to it
    pending = masks.start(reqs)
    time.sleep(0.1)  # "the forward pass": the helper thread takes the fill meanwhile
    out = Sampler().sample(torch.zeros(3, V), reqs, lambda x: masks.apply(pending, x))
    assert out.token_ids[1] == 17
    masks.close()


@pytest.fixture
def tiny_engine_factory(tiny_llama_dir):
    from shared.engine.engine import Engine
    from shared.engine.model_runner import ModelRunner

    def make() -> Engine:
        return Engine(
            ModelRunner(tiny_llama_dir, num_pages=64, page_size=16),
            cache=CacheConfig(page_size=16),
            scheduler=SchedulerConfig(),
        )

    return make


from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401  (session fixture)
