"""Non-ASCII text in a choice, a regex, an EBNF grammar and a JSON schema (enum, property names, bounded strings):
accepted by the gateway's check and followed by the engine, whose samples on a random-weight model land exactly on
the allowed words (garbage unless the byte-level matcher handles multi-byte characters)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from services.gateway.openai.requests import StructuredOutputs
from services.gateway.openai.structured import structured_spec
from shared.engine.engine import Engine
from shared.engine.model_runner import ModelRunner
from shared.grammar.spec import StructuredSpec
from shared.modelspec.sampling import SamplingParams
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401  (session fixture)

WORDS = ["café", "naïve", "日本", "😀"]
SCHEMA = {
    "type": "object",
    "properties": {"mot": {"enum": WORDS}, "名前": {"type": "string", "maxLength": 3}},
    "required": ["mot", "名前"],
    "additionalProperties": False,
}


def _spec(**field: object) -> StructuredSpec:
    spec = structured_spec(None, StructuredOutputs(**field))  # type: ignore[arg-type]  # the gateway's check
    assert spec is not None
    return spec


@pytest.fixture(scope="module")
def engine(tiny_llama_dir: Path) -> Engine:
    from transformers import AutoTokenizer

    from shared.config.groups import CacheConfig, SchedulerConfig

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    return Engine(
        ModelRunner(tiny_llama_dir, num_pages=128, page_size=16),
        cache=CacheConfig(page_size=16),
        scheduler=SchedulerConfig(),
        tokenizer=tok,
    )


@pytest.mark.parametrize(
    "field,check",
    [
        ({"choice": WORDS}, lambda t: t in WORDS),
        ({"regex": "(café|naïve|日本|😀)[à-ü]"}, lambda t: t[:-1] in WORDS and "à" <= t[-1] <= "ü"),
        (
            {"grammar": 'root ::= ("café" | "日本") " " [à-ü]'},
            lambda t: t[:-2] in ("café", "日本") and "à" <= t[-1] <= "ü",
        ),
        ({"json": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
    ],
)
def test_non_ascii_constraints_are_accepted_and_followed(engine: Engine, field: dict, check) -> None:  # type: ignore[no-untyped-def]
    spec = _spec(**field)
    params = [SamplingParams(max_tokens=40, temperature=1.0, seed=s, structured=spec) for s in range(4)]
    for c in engine.generate([[1, 2, 3, 4]] * 4, params):
        assert c.finish_reason == "stop" and check(c.text), (field, c.text)
