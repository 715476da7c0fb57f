"""The gateway's cached byte-level BPE encoder gives exactly the ids of the Rust `tokenizers` pipeline: on
random words, on Unicode, whitespace runs and special tokens (property-based), with a warm cache, across cache
clears, and for the Llama 3 style Split + ByteLevel pipeline; pipelines it cannot reproduce are declined."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, normalizers, processors

from services.gateway.text import fast_encode
from services.gateway.text.fast_encode import ByteLevelEncoder
from services.gateway.text.tokenizer import GatewayTokenizer

# Llama 3's pre-tokenization pattern (Split, Isolated), for the Sequence[Split, ByteLevel] shape.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
PIECES = (
    "hello",
    " world",
    "Paris",
    "'s",
    "'ll",
    "don't",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\t",
    " \n ",
    "123",
    "4567",
    "3.14",
    ",",
    "!?",
    "...",
    "é",
    "e\u0301",
    "中文",
    "🙂",
    "👍🏽",
    "²",
    "Ⅻ",
    "\u00a0",
    "\u3000",
    "\u2028",
    "\u0085",
    "ﬁ",
    "ß",
    "İ",
    "<|im_sta",
    "|>",
    "<",
    *SPECIALS,
    "\U0003f575",
    "\u209e",
)  # unassigned in some Unicode versions (Oniguruma and `regex` differ on them)
TEXTS = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)), max_size=24).map("".join)


@pytest.fixture(scope="module")
def bundled_tokenizer(bundled_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(Path(bundled_model_dir) / "tokenizer.json"))


@pytest.fixture(scope="module")
def warm(bundled_tokenizer: Tokenizer) -> ByteLevelEncoder:
    enc = ByteLevelEncoder.of(bundled_tokenizer)
    assert enc is not None
    return enc


def _with(tok: Tokenizer, **changes: object) -> Tokenizer:
    spec = json.loads(tok.to_str())
    spec.update(changes)
    return Tokenizer.from_str(json.dumps(spec))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXTS)
def test_ids_match_the_rust_pipeline(bundled_tokenizer: Tokenizer, warm: ByteLevelEncoder, text: str) -> None:
    want = bundled_tokenizer.encode(text).ids
    assert warm.encode(text) == want  # cache shared across examples
    assert warm.encode(text) == want  # now every word and chunk is cached
    fresh = ByteLevelEncoder(bundled_tokenizer, fast_encode.GPT2_PATTERN, warm._added)  # cold caches
    assert fresh.encode(text) == want


def test_random_word_prompts_match(bundled_tokenizer: Tokenizer, warm: ByteLevelEncoder) -> None:
    from bench.serve.datasets import BenchTokenizer, random_dataset

    bench_tok = BenchTokenizer(bundled_tokenizer)
    for req in random_dataset(bench_tok, num_prompts=40, input_len=200, output_len=1, seed=3):
        assert isinstance(req.prompt, str)
        for text in (req.prompt, req.prompt.strip(), req.prompt.replace(" ", "  ", 3), req.prompt + "\n"):
            assert warm.encode(text) == bundled_tokenizer.encode(text).ids


def test_characters_unicode_versions_disagree_on_go_to_the_rust_pipeline(
    bundled_tokenizer: Tokenizer, warm: ByteLevelEncoder
) -> None:
    for text in ("\U0003f575's", "a \u209e'll b", "\U000e0080x"):
        assert warm.encode(text) == bundled_tokenizer.encode(text).ids


def test_cache_clears_stay_exact(bundled_tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast_encode, "_CACHE_LIMIT", 5)
    enc = ByteLevelEncoder.of(bundled_tokenizer)
    assert enc is not None
    texts = ["The quick brown fox jumps over the lazy dog.", " a b c d e f g h", "x\ny  z", "hello world hello"]
    for text in texts * 3:
        assert enc.encode(text) == bundled_tokenizer.encode(text).ids
    assert len(enc._cache) <= 5 and len(enc._chunk_cache) <= 5


@pytest.fixture(scope="module")
def split_pipeline(bundled_tokenizer: Tokenizer) -> tuple[Tokenizer, ByteLevelEncoder]:
    pre = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ],
    }
    tok = _with(bundled_tokenizer, pre_tokenizer=pre)
    enc = ByteLevelEncoder.of(tok)
    assert enc is not None
    return tok, enc


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXTS)
def test_split_then_byte_level_pipeline_matches(split_pipeline: tuple[Tokenizer, ByteLevelEncoder], text: str) -> None:
    tok, enc = split_pipeline
    assert enc.encode(text) == tok.encode(text).ids


def test_pipelines_it_cannot_reproduce_are_declined(bundled_tokenizer: Tokenizer) -> None:
    tok = Tokenizer.from_str(bundled_tokenizer.to_str())
    tok.normalizer = normalizers.NFC()
    assert ByteLevelEncoder.of(tok) is None
    tok = Tokenizer.from_str(bundled_tokenizer.to_str())
    tok.add_tokens([AddedToken("<tool>", lstrip=True)])
    assert ByteLevelEncoder.of(tok) is None
    with_prefix = json.loads(bundled_tokenizer.to_str())["pre_tokenizer"] | {"add_prefix_space": True}
    assert ByteLevelEncoder.of(_with(bundled_tokenizer, pre_tokenizer=with_prefix)) is None


def test_a_post_processor_bos_is_left_to_the_rust_path(bundled_model_dir: Path, tmp_path: Path) -> None:
    """A tokenizer that adds BOS to plain text (Llama 3 style): chat prompts (whose template writes its own
    special tokens) still use the encoder; text with add_special_tokens gets the BOS from the Rust path."""
    for name in ("tokenizer_config.json", "config.json", "chat_template.jinja"):
        src = Path(bundled_model_dir) / name
        if src.exists():
            (tmp_path / name).write_bytes(src.read_bytes())
    spec = json.loads((Path(bundled_model_dir) / "tokenizer.json").read_text())
    spec["post_processor"] = json.loads(
        processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]).__getstate__()
    )
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    tok = GatewayTokenizer.from_dir(tmp_path)
    assert tok._encoder is not None and tok._post_adds
    text = "Hello there, world"
    want = tok.fast.encode(text).ids
    assert want[0] == 0 and tok.encode_text(text) == want
    assert tok.encode_text(text, add_special_tokens=False) == tok.fast.encode(text, add_special_tokens=False).ids
    messages = [{"role": "user", "content": "Name a colour."}]
    rendered = tok.render_chat(messages)
    assert tok.encode_chat(messages) == tok.fast.encode(rendered, add_special_tokens=False).ids


def test_gateway_tokenizer_uses_it_and_agrees_with_transformers(bundled_model_dir: Path) -> None:
    tok = GatewayTokenizer.from_dir(bundled_model_dir)
    assert tok._encoder is not None
    for text in (
        "What is the capital of France?",
        " leading and trailing ",
        "tabs\tand\nlines  and  runs",
        "<|im_start|>user\nhi<|im_end|>",
        "naïve café 🙂 中文",
    ):
        assert tok.encode_text(text) == tok.hf(text)["input_ids"]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour.  Now!"}]
    want = tok.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tok.encode_chat(messages) == list(want)
