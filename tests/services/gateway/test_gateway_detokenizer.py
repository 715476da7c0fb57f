"""Incremental detokenization: UTF-8 safety with characters split across tokens, stop strings across chunks."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.gateway.text.detokenizer import IncrementalDetokenizer, _WindowDecoder
from services.gateway.text.stop_strings import StopStringMatcher
from services.gateway.text.tokenizer import GatewayTokenizer
from tests.services.gateway.sse_client import byte_token_ids

MULTIBYTE = "Héllo wörld: 你好, emoji 🙂👍🏽 and ∑ ok"
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def chunked(ids: list[int], cuts: list[int]) -> list[list[int]]:
    """Split ids at the given (sorted, deduplicated) positions."""
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(ids)}), len(ids)]
    return [ids[a:b] for a, b in zip(bounds, bounds[1:])]


def stream(tok: GatewayTokenizer, chunks: list[list[int]], **kw: object) -> tuple[list[str], IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(tok.fast, **kw)  # type: ignore[arg-type]
    pieces = []
    for c in chunks:
        scan = detok.step(c)
        pieces.append(scan.text)
        if scan.matched is not None:
            return pieces, detok
    pieces.append(detok.finish())
    return pieces, detok


def test_byte_tokens_reproduce_the_text(tiny_tokenizer: GatewayTokenizer) -> None:
    # The helper's token ids are one byte each; the tokenizer's own full decode must give the text back.
    ids = byte_token_ids(tiny_tokenizer, MULTIBYTE.encode())
    assert len(ids) == len(MULTIBYTE.encode())
    assert tiny_tokenizer.decode(ids) == MULTIBYTE
    assert b"".join(tiny_tokenizer.token_bytes(i) for i in ids) == MULTIBYTE.encode()


def test_split_characters_are_never_emitted_broken(tiny_tokenizer: GatewayTokenizer) -> None:
    ids = byte_token_ids(tiny_tokenizer, MULTIBYTE.encode())
    pieces, _ = stream(tiny_tokenizer, [[i] for i in ids])
    assert "".join(pieces) == MULTIBYTE
    assert all("\ufffd" not in p for p in pieces)
    # Each piece is whole characters: the 4-byte emoji arrives in one piece, after its 4th byte.
    assert "🙂" in pieces


@SETTINGS
@given(cuts=st.lists(st.integers(min_value=0, max_value=80), max_size=30))
def test_any_chunking_of_byte_tokens_gives_the_text(tiny_tokenizer: GatewayTokenizer, cuts: list[int]) -> None:
    ids = byte_token_ids(tiny_tokenizer, MULTIBYTE.encode())
    pieces, _ = stream(tiny_tokenizer, chunked(ids, cuts))
    assert "".join(pieces) == MULTIBYTE
    assert all("\ufffd" not in p for p in pieces)


@SETTINGS
@given(
    text=st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=20),
)
def test_real_tokenization_round_trips(tiny_tokenizer: GatewayTokenizer, text: str, cuts: list[int]) -> None:
    ids = tiny_tokenizer.encode_text(text, add_special_tokens=False)
    pieces, _ = stream(tiny_tokenizer, chunked(ids, cuts))
    assert "".join(pieces) == tiny_tokenizer.decode(ids)
    assert all("\ufffd" not in p for p in pieces)


def test_character_cut_by_max_tokens_is_dropped_not_replaced(tiny_tokenizer: GatewayTokenizer) -> None:
    data = "ab🙂".encode()
    ids = byte_token_ids(tiny_tokenizer, data)[:-1]  # the emoji's last byte never comes
    pieces, _ = stream(tiny_tokenizer, [[i] for i in ids])
    assert "".join(pieces) == "ab"


def test_special_tokens_are_skipped_unless_asked(tiny_tokenizer: GatewayTokenizer) -> None:
    eos = tiny_tokenizer.eos_token_ids[0]
    ids = [*tiny_tokenizer.encode_text("hi", add_special_tokens=False), eos]
    assert "".join(stream(tiny_tokenizer, [ids])[0]) == "hi"
    kept = "".join(stream(tiny_tokenizer, [ids], skip_special_tokens=False)[0])
    assert kept == "hi" + tiny_tokenizer.token_text(eos)


def test_prompt_context_keeps_first_token_spacing(tiny_tokenizer: GatewayTokenizer) -> None:
    prompt = tiny_tokenizer.encode_text("The capital of France is", add_special_tokens=False)
    out = tiny_tokenizer.encode_text(" Paris.", add_special_tokens=False)
    pieces, _ = stream(tiny_tokenizer, [[i] for i in out], prompt_token_ids=prompt)
    assert "".join(pieces) == " Paris."


# ---------------------------------------------------------------- stop strings


def reference_cut(text: str, stops: list[str], include: bool) -> tuple[str, str | None]:
    """The stop string that is complete first (earliest end, the longest at equal ends), found on the whole text
    at once."""
    hits = [(text.find(s) + len(s), -len(s), s) for s in stops if s in text]
    if not hits:
        return text, None
    end, _, s = min(hits)
    return text[:end] if include else text[: end - len(s)], s


@SETTINGS
@given(
    text=st.text(alphabet="ab c🙂é", max_size=30),
    stops=st.lists(st.text(alphabet="ab c🙂é", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=25),
    per_byte=st.booleans(),
    include=st.booleans(),
)
def test_stop_strings_across_chunks_match_the_reference(
    tiny_tokenizer: GatewayTokenizer, text: str, stops: list[str], cuts: list[int], per_byte: bool, include: bool
) -> None:
    ids = byte_token_ids(tiny_tokenizer, text.encode())
    chunks = [[i] for i in ids] if per_byte else chunked(ids, cuts)  # per byte: every stop spans chunks
    pieces, detok = stream(tiny_tokenizer, chunks, stop=stops, include_stop_str_in_output=include)
    want_text, want_stop = reference_cut(text, stops, include)
    assert "".join(pieces) == want_text
    assert detok.stopped == want_stop
    assert all("\ufffd" not in p for p in pieces)


def test_possible_stop_prefix_is_held_back_then_released() -> None:
    m = StopStringMatcher(["STOP"])
    assert m.feed("go ST").text == "go "  # "ST" might become "STOP"
    assert m.held_back == "ST"
    assert m.feed("O").text == ""
    assert m.feed("X more").text == "STOX more"
    assert m.feed("...S").text == "..."
    assert m.flush() == "S"  # the stream ended: what was held back is output after all


def test_stop_string_split_over_many_chunks_cuts_before_it() -> None:
    m = StopStringMatcher(["</answer>"])
    out = []
    for piece in ["The answer", " is 42<", "/ans", "wer", "> trailing"]:
        scan = m.feed(piece)
        out.append(scan.text)
        if scan.matched:
            break
    assert "".join(out) == "The answer is 42"
    assert scan.matched == "</answer>"


def test_empty_stop_string_is_rejected() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        StopStringMatcher(["ok", ""])


# ---------------------------------------------------------------- fallback window decoder and cost


def test_window_decoder_fallback_is_utf8_safe(tiny_tokenizer: GatewayTokenizer) -> None:
    ids = byte_token_ids(tiny_tokenizer, MULTIBYTE.encode())
    w = _WindowDecoder(tiny_tokenizer.fast, [], True)
    pieces = [w.step([i]) for i in ids]
    assert "".join(p for p in pieces if p) == MULTIBYTE
    assert all(p is None or "\ufffd" not in p for p in pieces)


def _cost_per_token(tok: GatewayTokenizer, ids: list[int]) -> float:
    best = float("inf")
    for _ in range(3):
        detok = IncrementalDetokenizer(tok.fast, stop=["never-seen-stop"])
        t0 = time.perf_counter()
        for i in ids:
            detok.step([i])
        best = min(best, (time.perf_counter() - t0) / len(ids))
    return best


def test_cost_per_token_does_not_grow_with_output_length(tiny_tokenizer: GatewayTokenizer) -> None:
    unit = tiny_tokenizer.encode_text(
        "Prefill computes the prompt; decode produces one token. ", add_special_tokens=False
    )
    short, long = unit * 10, unit * 160  # 16x longer: a quadratic detokenizer would cost ~16x more per token
    assert _cost_per_token(tiny_tokenizer, long) < 4 * _cost_per_token(tiny_tokenizer, short)


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(st.text(alphabet="abc", max_size=6), max_size=8),
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=6), min_size=1, max_size=3),
)
def test_held_back_tail_is_the_longest_partial_stop(pieces: list[str], stops: list[str]) -> None:
    m = StopStringMatcher(stops)
    emitted = ""
    for piece in pieces:
        scan = m.feed(piece)
        emitted += scan.text
        if scan.matched:
            return
        text = emitted + m.held_back
        # Brute force: every suffix of everything seen so far against every proper prefix of every stop.
        want = max(
            (k for k in range(1, len(text) + 1) for s in stops if k < len(s) and text.endswith(s[:k])), default=0
        )
        assert len(m.held_back) == want
