from __future__ import annotations

import math

import pytest
import torch

from shared.engine.errors import InvalidRequest
from shared.engine.request import Request
from shared.engine.sampler import Sampler, StopChecker
from shared.engine.sampler.penalties import apply_penalties
from shared.engine.sampler.text_window import TextWindow
from shared.modelspec.sampling import SamplingParams


def req(params: SamplingParams, prompt=(1,), output=(), rid="r") -> Request:
    r = Request(rid, tuple(prompt), params)
    for t in output:
        r.append_output(t)
    return r


def draw(probs: list[float], n: int, **kw) -> torch.Tensor:
    """n independent draws from the distribution `probs` through the sampler (one row per draw)."""
    torch.manual_seed(0)
    logits = torch.log(torch.tensor(probs)).repeat(n, 1)
    reqs = [req(SamplingParams(**kw)) for _ in range(n)]
    return torch.tensor(Sampler().sample(logits, reqs).token_ids)


def assert_frequencies(tokens: torch.Tensor, expected: list[float]) -> None:
    """Each observed frequency within 5 standard errors of its expected probability; impossible tokens never."""
    n = tokens.numel()
    counts = torch.bincount(tokens, minlength=len(expected)).tolist()
    for tok, (c, p) in enumerate(zip(counts, expected, strict=True)):
        if p == 0:
            assert c == 0, f"token {tok} has probability 0 but was drawn {c} times"
        else:
            se = math.sqrt(p * (1 - p) / n)
            assert abs(c / n - p) < 5 * se + 1e-9, f"token {tok}: {c / n:.4f} vs {p:.4f}"


BASE = [0.5, 0.3, 0.15, 0.05]


def test_plain_sampling_follows_the_distribution():
    assert_frequencies(draw(BASE, 8000), BASE)


def test_temperature_flattens_the_distribution():
    t = 2.0
    w = [p ** (1 / t) for p in BASE]
    assert_frequencies(draw(BASE, 8000, temperature=t), [x / sum(w) for x in w])


def test_top_k_keeps_the_k_most_likely():
    assert_frequencies(draw(BASE, 8000, top_k=2), [0.5 / 0.8, 0.3 / 0.8, 0, 0])


def test_top_p_keeps_the_smallest_set_reaching_p():
    # 0.5 + 0.3 reaches 0.8: the third token is cut; 0.81 would keep it
    assert_frequencies(draw(BASE, 8000, top_p=0.8), [0.5 / 0.8, 0.3 / 0.8, 0, 0])
    assert_frequencies(draw(BASE, 8000, top_p=0.81), [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0])


def test_min_p_drops_tokens_below_a_share_of_the_top():
    # threshold 0.3 * 0.5 = 0.15: the 0.15 token stays, 0.05 goes
    assert_frequencies(draw(BASE, 8000, min_p=0.3), [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0])


def test_greedy_rows_take_the_argmax_in_a_mixed_batch():
    torch.manual_seed(1)
    logits = torch.randn(6, 50)
    reqs = [req(SamplingParams(temperature=0.0 if i % 2 == 0 else 1.0)) for i in range(6)]
    toks = Sampler().sample(logits.clone(), reqs).token_ids
    assert [toks[i] for i in (0, 2, 4)] == logits[[0, 2, 4]].argmax(-1).tolist()


def test_seeded_requests_do_not_depend_on_the_batch():
    logits = torch.randn(1, 200, generator=torch.Generator().manual_seed(5))

    def run(batch_size: int, row: int, seed: int) -> list[int]:
        r = req(SamplingParams(seed=seed))
        others = [req(SamplingParams(seed=None if i % 2 else 99 + i)) for i in range(batch_size - 1)]
        out = []
        for _ in range(20):
            rows = others[:row] + [r] + others[row:]
            noise = torch.randn(batch_size, 200)
            lg = noise.clone()
            lg[row] = logits[0]
            out.append(Sampler().sample(lg, rows).token_ids[row])
        return out

    alone = run(1, 0, seed=42)
    assert run(5, 3, seed=42) == alone and run(3, 0, seed=42) == alone
    assert run(1, 0, seed=43) != alone


def test_repetition_frequency_presence_penalties_match_their_definitions():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]])
    p = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    r = req(p, prompt=(0,), output=(1, 3, 3))
    apply_penalties(logits, [r], [0])
    # by hand: seen = {0 (prompt), 1, 3}; counts in output: 1 -> 1, 3 -> 2
    expect = [2.0 / 2, -1.0 * 2 - 0.5 * 1 - 0.25, 0.5, 3.0 / 2 - 0.5 * 2 - 0.25, -2.0]
    assert logits[0].tolist() == pytest.approx(expect)


def test_penalties_only_touch_the_rows_that_ask():
    logits = torch.ones(3, 4)
    rs = [
        req(SamplingParams(), output=(1,)),
        req(SamplingParams(presence_penalty=1.0), output=(1,)),
        req(SamplingParams(), output=(2,)),
    ]
    apply_penalties(logits, rs, [1])
    assert logits[0].tolist() == [1.0] * 4 and logits[2].tolist() == [1.0] * 4
    assert logits[1].tolist() == [1.0, 0.0, 1.0, 1.0]


def test_logprobs_are_the_raw_log_softmax():
    torch.manual_seed(3)
    logits = torch.randn(3, 30)
    reqs = [
        req(SamplingParams(temperature=0.0, logprobs=5, repetition_penalty=1.5), output=(0, 1)),
        req(SamplingParams(temperature=0.7)),
        req(SamplingParams(temperature=1.0, logprobs=0)),
    ]
    out = Sampler().sample(logits.clone(), reqs)
    lsm = torch.log_softmax(logits, -1)
    assert out.logprobs is not None and out.logprobs[1] is None
    a, c = out.logprobs[0], out.logprobs[2]
    assert a.token_id == out.token_ids[0] and a.logprob == pytest.approx(lsm[0, a.token_id].item(), abs=1e-5)
    top_vals, top_ids = lsm[0].topk(5)
    assert [t for t, _ in a.top] == top_ids.tolist()
    assert [v for _, v in a.top] == pytest.approx(top_vals.tolist(), abs=1e-5)
    assert c.top == () and c.logprob == pytest.approx(lsm[2, c.token_id].item(), abs=1e-5)


def test_min_tokens_masks_eos_and_stop_tokens():
    logits = torch.tensor([[0.0, 10.0, 9.0, 1.0]])
    s = Sampler(eos_token_ids=(1,))
    early = req(SamplingParams(temperature=0, min_tokens=2, stop_token_ids=(2,)), output=(3,))
    assert s.sample(logits.clone(), [early]).token_ids == [3]
    late = req(SamplingParams(temperature=0, min_tokens=1, stop_token_ids=(2,)), output=(3,))
    assert s.sample(logits.clone(), [late]).token_ids == [1]


# ---- stop strings and detokenization -------------------------------------------------------------------------
PIECES = {0: "Hel", 1: "lo", 2: " wor", 3: "ld", 4: "!", 5: " a", 6: "b", 7: "c"}


def decode(ids) -> str:
    return "".join(PIECES[i] for i in ids)


def run_stop(params: SamplingParams, tokens: list[int]) -> tuple[str, list[str], str | None, int]:
    chk = StopChecker(max_model_len=1000, decode_fn=decode)
    r = req(params, prompt=(7,))
    deltas = []
    for t in tokens:
        r.append_output(t)
        res = chk.check(r)
        deltas.append(res.new_text)
        if res.finish_reason:
            return "".join(deltas), deltas, res.stop_reason, r.num_output_tokens
    return "".join(deltas), deltas, None, r.num_output_tokens


def test_stop_string_spanning_tokens_stops_and_is_cut():
    text, deltas, stop, n = run_stop(SamplingParams(stop=("lo wo",)), [0, 1, 2, 3, 4])
    assert (text, stop, n) == ("Hel", "lo wo", 3)
    # "Hel" + "lo" could still grow into "lo wo": it must not be emitted before the match is decided
    assert all("lo" not in d for d in deltas)


def test_stop_string_can_be_kept_and_the_earliest_match_wins():
    text, _, stop, _ = run_stop(SamplingParams(stop=("ld", "o w"), include_stop_str_in_output=True), [0, 1, 2, 3])
    assert (text, stop) == ("Hello w", "o w")


def test_text_without_a_stop_flows_out_in_full():
    text, deltas, stop, n = run_stop(SamplingParams(stop=("zzz",), max_tokens=5), [0, 1, 2, 3, 4])
    assert (text, stop, n) == ("Hello world!", None, 5) and len(deltas) == 5


def test_detokenizer_waits_for_a_whole_utf8_character():
    byte_pieces = {0: b"caf", 1: b"\xc3", 2: b"\xa9", 3: b"!"}
    dec = TextWindow(lambda ids: b"".join(byte_pieces[i] for i in ids).decode("utf-8", "replace"))
    assert [dec.step(t) for t in (0, 1, 2, 3)] == ["caf", "", "\u00e9", "!"]


# ---- validation ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"n": 65}, "n"),
        ({"logprobs": 21}, "logprobs"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"frequency_penalty": 3.0}, "frequency_penalty"),
        ({"presence_penalty": -2.5}, "presence_penalty"),
        ({"seed": -1}, "seed"),
        ({"stop": ("",)}, "stop"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ],
)
def test_invalid_values_raise_typed_errors_naming_the_field(kw, field):
    with pytest.raises(InvalidRequest, match=field) as e:
        SamplingParams(**kw).validate()
    assert e.value.field == field and isinstance(e.value, ValueError)


def test_top_k_and_stop_ids_are_checked_against_the_vocabulary():
    with pytest.raises(InvalidRequest, match="vocabulary"):
        SamplingParams(top_k=100).validate(vocab_size=50)
    with pytest.raises(InvalidRequest, match="stop_token_ids"):
        SamplingParams(stop_token_ids=[50]).validate(vocab_size=50)
    p = SamplingParams(stop="x", stop_token_ids=[1, 2]).validate(vocab_size=50)
    assert p.stop == ("x",) and p.stop_token_ids == (1, 2) and hash(p)
