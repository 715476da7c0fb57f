"""Workload generators: seeded, exact in length (checked by encoding again), shaped as documented."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.serve.datasets import BenchTokenizer, multi_turn_dataset, random_dataset, shared_prefix_dataset
from tests.helpers.tiny_models import train_tokenizer


@pytest.fixture(scope="module")
def tiny_tok() -> BenchTokenizer:
    return BenchTokenizer(train_tokenizer())


@pytest.fixture(scope="module")
def smollm_tok(bundled_model_dir: Path) -> BenchTokenizer:
    return BenchTokenizer.from_dir(bundled_model_dir)


@pytest.mark.parametrize("which", ["tiny", "smollm"])
def test_random_text_prompts_have_exact_token_lengths(which: str, request: pytest.FixtureRequest) -> None:
    tok: BenchTokenizer = request.getfixturevalue(f"{which}_tok")
    reqs = random_dataset(tok, num_prompts=30, input_len=97, output_len=5, seed=3)
    assert len(reqs) == 30
    for r in reqs:
        assert isinstance(r.prompt, str)
        assert len(tok.encode(r.prompt)) == 97 == r.prompt_len
        assert r.output_len == 5
    assert len({r.prompt for r in reqs}) == 30


def test_random_is_seeded(tiny_tok: BenchTokenizer) -> None:
    a = random_dataset(tiny_tok, num_prompts=5, input_len=20, output_len=4, seed=1)
    b = random_dataset(tiny_tok, num_prompts=5, input_len=20, output_len=4, seed=1)
    c = random_dataset(tiny_tok, num_prompts=5, input_len=20, output_len=4, seed=2)
    assert a == b
    assert [r.prompt for r in a] != [r.prompt for r in c]


def test_random_token_ids_avoid_special_tokens(tiny_tok: BenchTokenizer) -> None:
    reqs = random_dataset(tiny_tok, num_prompts=20, input_len=64, output_len=3, seed=0, token_ids=True)
    assert tiny_tok.special_ids == {0, 1, 2}  # the tiny tokenizer's <|endoftext|>, <|im_start|>, <|im_end|>
    for r in reqs:
        assert isinstance(r.prompt, tuple) and len(r.prompt) == 64 == r.prompt_len
        assert not set(r.prompt) & tiny_tok.special_ids
        assert all(0 <= t < tiny_tok.vocab_size for t in r.prompt)


def test_random_range_ratio_bounds(tiny_tok: BenchTokenizer) -> None:
    reqs = random_dataset(tiny_tok, num_prompts=200, input_len=40, output_len=10, seed=5, range_ratio=0.5)
    ins, outs = [r.prompt_len for r in reqs], [r.output_len for r in reqs]
    assert min(ins) >= 20 and max(ins) <= 60 and len(set(ins)) > 10
    assert min(outs) >= 5 and max(outs) <= 15 and len(set(outs)) > 5
    assert all(len(tiny_tok.encode(r.prompt)) == r.prompt_len for r in reqs)  # type: ignore[arg-type]


def test_shared_prefix_groups_and_lengths(smollm_tok: BenchTokenizer) -> None:
    reqs = shared_prefix_dataset(
        smollm_tok, groups=3, prompts_per_group=4, system_len=50, question_len=12, output_len=7, seed=0
    )
    assert len(reqs) == 12
    systems = {r.system for r in reqs}
    assert len(systems) == 3
    for s in systems:
        assert s is not None and len(smollm_tok.encode(s)) == 50
        assert sum(r.system == s for r in reqs) == 4
    for r in reqs:
        assert isinstance(r.prompt, str) and len(smollm_tok.encode(r.prompt)) == 12
        # the concatenation a completions request sends keeps its length (no merge across the seam)
        assert len(smollm_tok.encode((r.system or "") + r.prompt)) == 62 == r.prompt_len
    groups_in_order = [r.system for r in reqs]
    assert groups_in_order != sorted(groups_in_order, key=groups_in_order.index), "requests are not shuffled"


def test_multi_turn_order_and_cut(tiny_tok: BenchTokenizer) -> None:
    reqs = multi_turn_dataset(tiny_tok, num_prompts=10, turns=3, user_len=15, output_len=4, seed=0)
    assert len(reqs) == 10
    # 4 conversations, round-robin by turn: 4 x turn 0, 4 x turn 1, 2 x turn 2
    assert [(r.conversation, r.turn) for r in reqs] == [(c, t) for t in range(3) for c in range(4)][:10]
    assert all(len(tiny_tok.encode(r.prompt)) == 15 == r.prompt_len for r in reqs)  # type: ignore[arg-type]
    again = multi_turn_dataset(tiny_tok, num_prompts=10, turns=3, user_len=15, output_len=4, seed=0)
    assert again == reqs


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        (dict(num_prompts=0, input_len=5, output_len=5), "--num-prompts"),
        (dict(num_prompts=1, input_len=0, output_len=5), "--random-input-len"),
        (dict(num_prompts=1, input_len=5, output_len=0), "--random-output-len"),
        (dict(num_prompts=1, input_len=5, output_len=5, range_ratio=1.0), "--random-range-ratio"),
    ],
)
def test_bad_sizes_name_the_flag(tiny_tok: BenchTokenizer, kwargs: dict, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        random_dataset(tiny_tok, seed=0, **kwargs)


def test_missing_tokenizer_dir_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tokenizer.json"):
        BenchTokenizer.from_dir(tmp_path)
