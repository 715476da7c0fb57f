"""Prompt encoding for byte-level BPE tokenizers without the Rust pipeline's per-call overhead.

`tokenizers.Tokenizer.encode` spends most of its time outside the BPE merges: the pre-tokenizer's Oniguruma
regex (~1.4 us per word), offsets, and building the Encoding. For a GPT-2 style pipeline (no normalizer,
byte-level pre-tokenizer, BPE) the same ids come from:

    split out added tokens (leftmost-longest, like the Rust AhoCorasick)
    -> split each remaining segment with the pre-tokenizer's regex (Python `regex`, ~0.3 us per word)
    -> map each word's UTF-8 bytes to the byte-level alphabet -> BPE, cached per word

The per-word cache is what makes it cheap: words repeat across prompts (system prompts, chat roles, common
words), so a warm cache turns a word into one dict lookup. A miss asks the Rust BPE model for that one word.
With the GPT-2 pattern, a segment whose words are separated by single spaces skips the regex: `str.split(" ")`
chunks are looked up whole (half the cost again).
`encode` gives the ids without the post-processor's special tokens (`add_special_tokens=False`); callers that
want them keep the Rust `encode` when `adds_special_tokens(tokenizer)`. `ByteLevelEncoder.of(tokenizer)` returns
None for any other pipeline shape; the caller then keeps the Rust `encode`. Tests compare the ids with the Rust pipeline on random text, Unicode and special tokens.
"""

from __future__ import annotations

import functools
import json
import sys
import unicodedata
from itertools import chain
from typing import Any

import regex

# The GPT-2 pre-tokenization pattern: what `pre_tokenizers.ByteLevel(use_regex=True)` splits with.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_CACHE_LIMIT = 200_000  # entries per cache (~30 MB at most); cleared wholesale when full (cold is only slower)


@functools.cache
def _unassigned_chars() -> regex.Pattern[str]:
    """Code points Python's Unicode database does not assign. The Rust pipeline's Oniguruma and the `regex`
    module each follow their own Unicode version, so a character assigned in between is a letter to one and
    unassigned to the other; text with such a character is left to the Rust pipeline. (~0.3 s, once.)"""
    ranges, start = [], None
    for cp in range(0x80, sys.maxunicode + 2):
        unassigned = cp <= sys.maxunicode and unicodedata.category(chr(cp)) == "Cn"
        if unassigned and start is None:
            start = cp
        elif not unassigned and start is not None:
            ranges.append(f"\\U{start:08x}-\\U{cp - 1:08x}")
            start = None
    return regex.compile("[" + "".join(ranges) + "]")


def adds_special_tokens(tokenizer: Any) -> bool:
    """Whether `encode(text, add_special_tokens=True)` adds tokens (BOS/EOS from the post-processor)."""
    post = tokenizer.post_processor
    return post is not None and post.num_special_tokens_to_add(False) > 0


def byte_to_char() -> list[str]:
    """GPT-2 byte-level alphabet: the printable character that stands for each byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def _split_pattern(pre: dict[str, Any] | None) -> str | None:
    """The regex the pre-tokenizer splits with, if it is one of the byte-level shapes we reproduce exactly."""
    if pre is None:
        return None
    if pre.get("type") == "ByteLevel":
        if pre.get("add_prefix_space") or not pre.get("use_regex", True):
            return None
        return GPT2_PATTERN
    if pre.get("type") == "Sequence":  # Llama 3 / Qwen: Split(regex, Isolated) then ByteLevel(use_regex=False)
        steps = pre.get("pretokenizers") or []
        if len(steps) != 2:
            return None
        split, byte_level = steps
        if (
            split.get("type") != "Split"
            or split.get("behavior") != "Isolated"
            or split.get("invert")
            or "Regex" not in (split.get("pattern") or {})
        ):
            return None
        if byte_level.get("type") != "ByteLevel" or byte_level.get("add_prefix_space") or byte_level.get("use_regex"):
            return None
        return str(split["pattern"]["Regex"])
    return None


class ByteLevelEncoder:
    """Exact, cached re-implementation of `Tokenizer.encode(text).ids` for byte-level BPE pipelines."""

    def __init__(self, tokenizer: Any, pattern: str, added: dict[str, int]) -> None:
        self._model = tokenizer.model  # tokenizers.models.BPE
        self._words = regex.compile(pattern)
        self._findall = self._words.groups == 0  # with capture groups findall returns groups, not matches
        self._bytes = byte_to_char()
        # Added tokens, longest first: at one position the alternation then takes the longest (leftmost-longest).
        contents = sorted(added, key=len, reverse=True)
        self._added = added
        self._added_re = regex.compile("|".join(regex.escape(c) for c in contents)) if contents else None
        self._cache: dict[str, tuple[int, ...]] = {}  # pre-tokenizer piece -> ids
        self._tokenizer = tokenizer
        self._unassigned = _unassigned_chars()
        self._chunks = pattern == GPT2_PATTERN  # space-led chunks split independently (see _encode_segment)
        self._chunk_cache: dict[str, tuple[int, ...]] = {}  # " word," -> ids of all its pieces

    @classmethod
    def of(cls, tokenizer: Any) -> ByteLevelEncoder | None:
        """An encoder for `tokenizer` (tokenizers.Tokenizer), or None when its pipeline is not a shape this
        module reproduces exactly (then use tokenizer.encode)."""
        try:
            spec = json.loads(tokenizer.to_str())
        except Exception:  # noqa: BLE001 - a tokenizer without a JSON form: use tokenizer.encode
            return None
        model = spec.get("model") or {}
        if (
            spec.get("normalizer") is not None
            or model.get("type") != "BPE"
            or model.get("dropout")
            or model.get("byte_fallback")
            or model.get("continuing_subword_prefix")
            or model.get("end_of_word_suffix")
        ):
            return None
        pattern = _split_pattern(spec.get("pre_tokenizer"))
        if pattern is None:
            return None
        added: dict[str, int] = {}
        for token_id, tok in tokenizer.get_added_tokens_decoder().items():
            if tok.lstrip or tok.rstrip or tok.single_word or not tok.content:
                return None  # whitespace-eating added tokens: not reproduced here
            added[tok.content] = token_id
        if getattr(tokenizer, "encode_special_tokens", False):
            return None  # special tokens encoded as plain text: not reproduced here
        try:
            return cls(tokenizer, pattern, added)
        except regex.error:  # an Oniguruma pattern Python's `regex` does not read
            return None

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        if self._added_re is None:
            self._encode_segment(text, out)
            return out
        start = 0
        for m in self._added_re.finditer(text):
            if m.start() > start:
                self._encode_segment(text[start : m.start()], out)
            out.append(self._added[m.group()])
            start = m.end()
        if start < len(text):
            self._encode_segment(text[start:], out)
        return out

    def _encode_segment(self, text: str, out: list[int]) -> None:
        if not text.isascii() and self._unassigned.search(text):
            out.extend(self._tokenizer.encode(text, add_special_tokens=False).ids)  # see _unassigned_chars
            return
        parts = text.split(" ")
        core = text[parts[0] == "" : len(text) - (parts[-1] == "")]  # one leading / trailing space may go
        if self._chunks and len(parts) > 1 and (core or len(parts) == 2) and " ".join(text.split()) == core:
            # Single spaces are the only whitespace (no runs, no tabs or newlines; one may lead or trail): under
            # the GPT-2 pattern no piece crosses a space except one that starts at it, so each space-led chunk
            # splits the same on its own as in the text, and its ids can be cached whole.
            keys = [" " + p for p in parts]
            keys[0] = parts[0]
            found: list[Any] = list(map(self._chunk_cache.get, keys))  # None where a chunk is not cached yet
            if None in found:
                found = self._fill_chunks(keys, found)
            out.extend(chain.from_iterable(found))
            return
        self._encode_words(text, out)

    def _fill_chunks(self, keys: list[str], found: list[tuple[int, ...] | None]) -> list[tuple[int, ...]]:
        """Encode the chunks the cache lacks (each on its own: the same ids, see _encode_segment) through the
        word cache, remember them, and return every chunk's ids."""
        out = []
        for k, ids in zip(keys, found):
            if ids is None:
                ids = self._chunk_cache.get(k)
                if ids is None:
                    buf: list[int] = []
                    self._encode_words(k, buf)
                    if len(self._chunk_cache) >= _CACHE_LIMIT:
                        self._chunk_cache.clear()
                    ids = self._chunk_cache[k] = tuple(buf)
            out.append(ids)
        return out

    def _encode_words(self, text: str, out: list[int]) -> None:
        words = self._words.findall(text) if self._findall else None
        if words is None or sum(map(len, words)) != len(text):
            words = self._isolated(text)  # the pattern skipped characters: they are pieces of their own
        found: list[Any] = list(map(self._cache.get, words))  # the warm path: one C-level pass, no Python loop
        if None in found:
            found = [ids if ids is not None else self._bpe(w) for w, ids in zip(words, found)]
        out.extend(chain.from_iterable(found))

    def _isolated(self, text: str) -> list[str]:
        """Split(Isolated): every match is a piece, and so is every gap between matches."""
        pieces, pos = [], 0
        for m in self._words.finditer(text):
            if m.start() > pos:
                pieces.append(text[pos : m.start()])
            if m.end() > m.start():
                pieces.append(m.group())
            pos = m.end()
        if pos < len(text):
            pieces.append(text[pos:])
        return pieces

    def _bpe(self, word: str) -> tuple[int, ...]:
        table = self._bytes
        mapped = "".join([table[b] for b in word.encode("utf-8")])
        ids = tuple(t.id for t in self._model.tokenize(mapped))
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[word] = ids
        return ids
