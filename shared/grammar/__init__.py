"""Structured-output specs shared by the gateway (validation) and the engine (constrained decoding)."""

from shared.grammar.spec import GrammarKind, StructuredSpec

__all__ = ["GrammarKind", "StructuredSpec"]
