"""Workloads for the serving benchmark: `random`, `shared-prefix` and `multi-turn`, seeded and exact in length.

Text prompts are built from whole words that are single tokens with a leading space (`" the"`, `" model"`):
a byte-level or SentencePiece tokenizer splits text at spaces before merging, so a string of k such words
encodes to exactly k tokens, and prompts concatenate without merging across the seam (system prompt + question
keeps S + Q tokens). Every prompt is checked by encoding it; the rare tokenizer where a word list does not
round-trip gets the vLLM treatment (re-encode, cut or pad, repeat) and records the length it really has.
Token-id prompts (completions only) are uniform over the vocabulary without special tokens.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATASETS = ("random", "shared-prefix", "multi-turn", "random-mm")
_MIN_WORDS = 64  # fewer single-token words than this: the tokenizer is not one we can build text for


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload.

    prompt: text, or token ids (only for /v1/completions). For multi-turn it is the new user message of this
    turn; earlier turns and answers are prepended at send time. system: a system prompt (shared-prefix), sent
    as a system message to chat endpoints and prepended to the prompt for completions.
    prompt_len: tokens of system + prompt as this tokenizer counts them (no chat template, no history).
    """

    prompt: str | tuple[int, ...]
    prompt_len: int
    output_len: int
    system: str | None = None
    conversation: int | None = None
    turn: int = 0
    images: tuple[str, ...] = ()  # image URLs (data: URIs) sent before the text (random-mm, chat only)


class BenchTokenizer:
    """The served model's tokenizer (the Rust `tokenizers` one; no transformers import in the client)."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        decoder = tok.get_added_tokens_decoder()  # id -> AddedToken
        self.special_ids = frozenset(i for i, t in decoder.items() if t.special)
        self.vocab_size = int(tok.get_vocab_size(with_added_tokens=True))
        self._words: tuple[str, ...] | None = None
        self._plain_ids: tuple[int, ...] | None = None

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> BenchTokenizer:
        from tokenizers import Tokenizer

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise ValueError(
                f"--tokenizer {model_dir}: no tokenizer.json there; pass the served model's directory "
                f"(a Hugging Face model dir with a fast tokenizer)"
            )
        return cls(Tokenizer.from_file(str(path)))

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids)

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=True))

    @property
    def plain_ids(self) -> tuple[int, ...]:
        """Every token id that is not a special token (random token-id prompts draw from these)."""
        if self._plain_ids is None:
            self._plain_ids = tuple(i for i in range(self.vocab_size) if i not in self.special_ids)
        return self._plain_ids

    @property
    def words(self) -> tuple[str, ...]:
        """Words (with their leading space) that encode to exactly one token, in id order."""
        if self._words is None:
            cands: list[tuple[int, str]] = []
            for i in self.plain_ids:
                piece = self.tok.id_to_token(i) or ""
                if piece[:1] in ("Ġ", "▁"):  # byte-level BPE / SentencePiece word-start markers
                    word = piece[1:]
                    if len(word) >= 2 and word.isascii() and word.isalpha():
                        cands.append((i, " " + word))
            encoded = self.tok.encode_batch([w for _, w in cands], add_special_tokens=False)
            self._words = tuple(w for (i, w), e in zip(cands, encoded) if list(e.ids) == [i])
            if len(self._words) < _MIN_WORDS:
                raise ValueError(
                    f"the tokenizer has only {len(self._words)} single-token words; text prompts need "
                    f"a byte-level BPE or SentencePiece tokenizer (or use --random-prompt-format ids)"
                )
        return self._words


def exact_text(tok: BenchTokenizer, rng: random.Random, n_tokens: int) -> tuple[str, int]:
    """Text of `n_tokens` tokens (and its real length, which equals n_tokens for the tokenizers we know)."""
    if n_tokens <= 0:
        return "", 0
    words = tok.words
    text = "".join(rng.choice(words) for _ in range(n_tokens))
    for _ in range(8):  # vLLM-style repair when the words did not round-trip one token each
        ids = tok.encode(text)
        if len(ids) == n_tokens:
            return text, n_tokens
        if len(ids) > n_tokens:
            text = tok.decode(ids[:n_tokens])
        else:
            text += "".join(rng.choice(words) for _ in range(n_tokens - len(ids)))
    return text, tok.count(text)


def _lengths(rng: random.Random, n: int, base: int, range_ratio: float) -> list[int]:
    """vLLM's --random-range-ratio: uniform integers in [base*(1-r), base*(1+r)], at least 1."""
    if range_ratio == 0:
        return [base] * n
    lo, hi = max(1, math.floor(base * (1 - range_ratio))), max(1, math.ceil(base * (1 + range_ratio)))
    return [rng.randint(lo, hi) for _ in range(n)]


def _check(name: str, value: int, minimum: int = 1) -> None:
    if value < minimum:
        raise ValueError(f"--{name} must be >= {minimum} (got {value})")


def random_dataset(
    tok: BenchTokenizer,
    *,
    num_prompts: int,
    input_len: int,
    output_len: int,
    seed: int,
    range_ratio: float = 0.0,
    token_ids: bool = False,
) -> list[BenchRequest]:
    """`random`: independent prompts of input_len tokens (text, or token ids), each asking for output_len."""
    _check("num-prompts", num_prompts)
    _check("random-input-len", input_len)
    _check("random-output-len", output_len)
    if not 0 <= range_ratio < 1:
        raise ValueError(f"--random-range-ratio must be in [0, 1) (got {range_ratio})")
    rng = random.Random(seed)
    in_lens = _lengths(rng, num_prompts, input_len, range_ratio)
    out_lens = _lengths(rng, num_prompts, output_len, range_ratio)
    out: list[BenchRequest] = []
    for n_in, n_out in zip(in_lens, out_lens):
        if token_ids:
            plain = tok.plain_ids
            out.append(BenchRequest(tuple(rng.choice(plain) for _ in range(n_in)), n_in, n_out))
        else:
            text, real = exact_text(tok, rng, n_in)
            out.append(BenchRequest(text, real, n_out))
    return out


def shared_prefix_dataset(
    tok: BenchTokenizer,
    *,
    groups: int,
    prompts_per_group: int,
    system_len: int,
    question_len: int,
    output_len: int,
    seed: int,
) -> list[BenchRequest]:
    """`shared-prefix`: `groups` system prompts of system_len tokens, each followed by prompts_per_group
    questions of question_len tokens; shuffled (seeded), so consecutive requests rarely share a prefix and a
    prefix-aware router has something to do."""
    _check("shared-prefix-groups", groups)
    _check("shared-prefix-prompts-per-group", prompts_per_group)
    _check("shared-prefix-system-len", system_len)
    _check("random-input-len", question_len)
    _check("random-output-len", output_len)
    rng = random.Random(seed)
    out: list[BenchRequest] = []
    for _ in range(groups):
        system, s_len = exact_text(tok, rng, system_len)
        for _ in range(prompts_per_group):
            question, q_len = exact_text(tok, rng, question_len)
            out.append(BenchRequest(question, s_len + q_len, output_len, system=system))
    rng.shuffle(out)
    return out


def multi_turn_dataset(
    tok: BenchTokenizer, *, num_prompts: int, turns: int, user_len: int, output_len: int, seed: int
) -> list[BenchRequest]:
    """`multi-turn`: ceil(num_prompts / turns) conversations of `turns` user messages (user_len tokens each);
    turn k is sent after the answer to turn k-1, with the whole conversation so far. The list is in arrival
    order: round-robin over conversations (turn 0 of all, then turn 1 of all, ...), cut at num_prompts."""
    _check("num-prompts", num_prompts)
    _check("multi-turn-turns", turns)
    _check("random-input-len", user_len)
    _check("random-output-len", output_len)
    rng = random.Random(seed)
    n_conv = math.ceil(num_prompts / turns)
    texts = [[exact_text(tok, rng, user_len) for _ in range(turns)] for _ in range(n_conv)]
    out = [
        BenchRequest(texts[c][t][0], texts[c][t][1], output_len, conversation=c, turn=t)
        for t in range(turns)
        for c in range(n_conv)
    ]
    return out[:num_prompts]
