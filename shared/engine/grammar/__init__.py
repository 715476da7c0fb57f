"""Grammar-constrained decoding with xgrammar: per-request matchers and the per-step token bitmask."""

from shared.engine.grammar.backend import GrammarBackend, RequestGrammar
from shared.engine.grammar.mask import MaskFiller, PendingMask

__all__ = ["GrammarBackend", "MaskFiller", "PendingMask", "RequestGrammar"]
