"""What a request's output must match: one grammar, typed once where the request enters.

The spec travels as text (a JSON schema, a regex, an EBNF grammar, a list of choices as JSON) so the same value
goes over HTTP, gRPC and the KV hand-off, and every process rebuilds the same matcher from it. `accepted` holds
output tokens the matcher must consume before the next one is sampled: a replayed attempt continues after the
tokens the client already has, and those are already part of the structure.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass


class GrammarKind(enum.Enum):
    JSON_OBJECT = "json_object"  # any JSON object (OpenAI's JSON mode)
    JSON_SCHEMA = "json_schema"  # a JSON schema (OpenAI's structured outputs, strict)
    REGEX = "regex"
    CHOICE = "choice"  # exactly one of a list of strings; spec is a JSON array of them
    GRAMMAR = "grammar"  # an EBNF grammar (xgrammar / GBNF dialect, root rule "root")


@dataclass(frozen=True)
class StructuredSpec:
    kind: GrammarKind
    spec: str = ""
    accepted: tuple[int, ...] = ()

    @property
    def cache_key(self) -> tuple[str, str]:
        return self.kind.value, self.spec

    def choices(self) -> list[str]:
        assert self.kind is GrammarKind.CHOICE
        return [str(c) for c in json.loads(self.spec)]
