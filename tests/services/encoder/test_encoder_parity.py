"""The encoder's embeddings equal sentence-transformers' `encode(normalize_embeddings=True)` on the same model
(all-MiniLM-L6-v2, bundled) within 1e-5, for 100 varied sentences: empty-ish, long (cut at the model's 256
tokens, as sentence-transformers cuts them), non-ASCII; computed the way the service computes them (through the
dynamic batcher, length-grouped padded batches) and one at a time."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from services.encoder.batcher import EmbedBatcher
from services.encoder.embedding import SentenceEmbedder

pytestmark = pytest.mark.slow

_WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "serving",
    "latency",
    "prefill",
    "decode",
    "cache",
    "page",
    "token",
    "model",
    "embedding",
    "vector",
    "search",
    "ranking",
    "query",
    "document",
    "Paris",
    "France",
    "capital",
    "river",
    "mountain",
]
_FIXED = [
    "",
    " ",
    ".",
    "a",
    "!!!",
    "?",
    "\n\t",
    "0",
    "I",
    "OK",  # empty-ish
    "Hello, world!",
    "What is the capital of France?",
    "The capital of France is Paris.",
    "Ünïcödé àccents are déjà vu for the naïve café owner.",
    "東京は日本の首都です。",
    "Москва — столица России.",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "😀🚀 emoji only 🎉",
    "🙂",
    "Ελληνικά γράμματα αβγ",
    "한국어 문장입니다",
    "ไทย ภาษา",
    "mixed 中文 and English text",
    "C'est la vie, n'est-ce pas ?",
    "def f(x): return x ** 2  # code",
    "SELECT * FROM table WHERE id = 42;",
    "https://example.com/path?q=1&r=2",
    "3.14159 2.71828 1.41421 numbers",
    "UPPER CASE SHOUTING",
    "tabs\tand\nnewlines\r\ninside",
    "a " * 200,  # ~200 tokens
    "long " * 300,  # > 256 tokens: cut
    "antidisestablishmentarianism " * 80,  # many word pieces: cut
    " ".join(f"word{i}" for i in range(400)),  # cut
]


def sentences(n: int = 100) -> list[str]:
    rng = random.Random(16)
    out = list(_FIXED)
    while len(out) < n:
        k = rng.choice((1, 2, 3, 5, 8, 13, 21, 40, 80))
        out.append(" ".join(rng.choice(_WORDS) for _ in range(k)) + rng.choice(("", ".", "?", "!")))
    return out[:n]


@pytest.fixture(scope="module")
def reference(minilm_dir: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_dir), device="cpu")
    assert st.max_seq_length == 256
    return st.encode(sentences(), batch_size=32, normalize_embeddings=True, convert_to_numpy=True)


@pytest.fixture(scope="module")
def embedder(minilm_dir: Path) -> SentenceEmbedder:
    return SentenceEmbedder(minilm_dir, "all-minilm-l6-v2")


def test_batched_through_the_batcher_equals_sentence_transformers(
    embedder: SentenceEmbedder, reference: np.ndarray
) -> None:
    texts = sentences()
    ids = embedder.tokenize(texts, truncate_to=256)
    assert max(len(x) for x in ids) == 256 and min(len(x) for x in ids) == 2  # cut ones, and "" -> [CLS] [SEP]

    async def run() -> list[torch.Tensor]:
        batcher = EmbedBatcher(embedder.embed, max_batch_size=16, max_batch_tokens=2048, wait_s=0.005).start()
        try:
            # one request per sentence, concurrently: they share length-grouped forwards
            return await asyncio.gather(*(batcher.submit([x]) for x in ids))
        finally:
            assert batcher.batches < len(ids)  # batching happened
            await batcher.close()

    got = torch.cat(asyncio.run(run())).numpy()
    assert got.shape == reference.shape == (100, 384)
    err = np.abs(got - reference).max(axis=1)
    print(f"max abs error vs sentence-transformers: {err.max():.2e}")
    assert err.max() <= 1e-5, f"worst {err.max():.2e} at {texts[int(err.argmax())]!r}"
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_one_at_a_time_equals_sentence_transformers(embedder: SentenceEmbedder, reference: np.ndarray) -> None:
    texts = sentences()
    picks = [0, 3, 12, 14, 19, 33, 34, 35, 60, 99]
    for i in picks:
        got = embedder.embed(embedder.tokenize([texts[i]], truncate_to=256)).numpy()[0]
        assert np.abs(got - reference[i]).max() <= 1e-5, texts[i]


def test_over_long_input_is_refused_unless_truncating(embedder: SentenceEmbedder) -> None:
    from services.encoder.errors import EncoderError

    with pytest.raises(EncoderError, match=r"input\[1\] is \d+ tokens, but all-minilm-l6-v2 takes at most 256"):
        embedder.tokenize(["short", "long " * 300], truncate_to=0)
    assert len(embedder.tokenize(["long " * 300], truncate_to=256)[0]) == 256


def test_truncation_keeps_the_start_and_the_special_tokens_as_hugging_face_does(
    embedder: SentenceEmbedder, minilm_dir: Path
) -> None:
    from transformers import AutoTokenizer

    from services.encoder.errors import EncoderError

    hf = AutoTokenizer.from_pretrained(str(minilm_dir))
    texts = ["Ünïcödé words " * 40, "short"]
    for n in (3, 10, 256):
        assert embedder.tokenize(texts, truncate_to=n) == hf(texts, truncation=True, max_length=n)["input_ids"]
    assert embedder.check_token_inputs([[5, 6, 7, 8]], truncate_to=2) == [[5, 6]]
    for bad in (257, 2):
        with pytest.raises(EncoderError, match="truncate_prompt_tokens"):
            embedder.truncation_limit(bad)
    with pytest.raises(EncoderError, match="outside the vocabulary"):
        embedder.check_token_inputs([[1, 30522]])
