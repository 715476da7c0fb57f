"""Compiles structured-output specs against the engine's tokenizer (cached) and hands out one matcher per request.

A matcher is the request's position in its grammar: it accepts each output token after sampling and, before the
next sampling, says which tokens may follow (the bitmask, see mask.py). Disaggregated serving rebuilds it from the
spec on every instance: prefill samples the first token under a fresh matcher; decode builds its own from the same
spec and feeds it that first token (scheduler/handoff_pages.py), so both ends agree without shipping matcher state.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from shared.engine.errors import InvalidRequest
from shared.grammar.check import GrammarError, build_grammar
from shared.grammar.spec import StructuredSpec

log = logging.getLogger(__name__)

_CACHE_ENTRIES = 256  # compiled grammars kept (a schema compiles in ~1-10 ms; clients reuse a few schemas)


class RequestGrammar:
    """One request's matcher. `accept` after each sampled token; `fill` writes the allowed-next-token row."""

    __slots__ = ("matcher", "spec")

    def __init__(self, matcher: Any, spec: StructuredSpec) -> None:
        self.matcher = matcher
        self.spec = spec

    def accept(self, token_id: int) -> bool:
        """False when the grammar refuses the token (it was sampled without the mask: a bug, or a stop token
        after the structure ended)."""
        if self.matcher.is_terminated():
            return False
        return bool(self.matcher.accept_token(int(token_id)))

    @property
    def is_terminated(self) -> bool:
        return bool(self.matcher.is_terminated())

    def fill(self, bitmask: Any, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def fork(self) -> RequestGrammar:
        """An independent copy at the same position (n > 1: each sample continues on its own)."""
        return RequestGrammar(self.matcher.fork(), self.spec)


class GrammarBackend:
    """xgrammar over one tokenizer. Building the tokenizer info takes ~0.2 s, so it happens on first use."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self._compiler: Any = None
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()

    def _get_compiler(self) -> Any:
        if self._compiler is None:
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(
                self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids or None
            )
            self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        return self._compiler

    def compile(self, spec: StructuredSpec) -> Any:
        """-> xgrammar.CompiledGrammar. Raises InvalidRequest naming the part of the spec at fault."""
        key = spec.cache_key
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        try:
            grammar = build_grammar(spec)
            compiled = self._get_compiler().compile_grammar(grammar)
        except GrammarError as e:
            raise InvalidRequest(f"structured output ({spec.kind.value}): {e}", field="response_format") from None
        self._cache[key] = compiled
        if len(self._cache) > _CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return compiled

    def matcher(self, spec: StructuredSpec) -> RequestGrammar:
        """A matcher at the start of the output, advanced past spec.accepted (replayed tokens)."""
        import xgrammar as xgr

        g = RequestGrammar(xgr.GrammarMatcher(self.compile(spec)), spec)
        for i, t in enumerate(spec.accepted):
            if not g.accept(t):
                raise InvalidRequest(
                    f"structured output: already-generated token {t} (position {i}) does not follow the grammar",
                    field="response_format",
                )
        return g
