"""Structured outputs in the engine: every completion of the schema corpus (tests/helpers/schema_corpus.py) parses
and validates against its schema, on the bundled model (greedy) and on a random-weight model (sampled), which
writes garbage without the grammar. Constrained and free requests share each batch."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.engine import Engine
from shared.engine.model_runner import ModelRunner
from shared.grammar.spec import GrammarKind, StructuredSpec
from shared.modelspec.sampling import SamplingParams
from tests.helpers.schema_corpus import MAX_TOKENS, SCHEMAS
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401  (session fixture)


def _spec(schema: dict) -> StructuredSpec:
    return StructuredSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema))


def _engine(model_dir: Path) -> tuple[Engine, object]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    runner = ModelRunner(model_dir, num_pages=1024, page_size=16)
    return Engine(
        runner,
        cache=CacheConfig(page_size=16),
        scheduler=SchedulerConfig(max_running_requests=64, max_prefill_tokens=2048),
        tokenizer=tok,
    ), tok


def test_corpus_is_large_and_every_schema_is_valid():
    assert len(SCHEMAS) >= 50
    for s in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(s)


@pytest.mark.slow
def test_corpus_validates_on_the_bundled_model(bundled_model_dir: Path):
    engine, tok = _engine(bundled_model_dir)
    # One short prompt for all (prefix-cached): the grammar, not the prompt, has to make the answer valid.
    msgs = [{"role": "user", "content": "Describe something as a JSON value."}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    prompts = [list(ids["input_ids"]) if not isinstance(ids, list) else ids] * len(SCHEMAS)
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, structured=_spec(s)) for s in SCHEMAS]
    free = SamplingParams(max_tokens=8, temperature=0.0)  # an unconstrained request in the same batches
    got = engine.generate(prompts + [prompts[0]], params + [free])
    for i, (schema, c) in enumerate(zip(SCHEMAS, got, strict=False)):
        assert c.finish_reason == "stop", f"schema {i} {schema}: truncated ({c.finish_reason}): {c.text!r}"
        jsonschema.validate(json.loads(c.text), schema)
    assert got[-1].finish_reason == "length" and len(got[-1].token_ids) == 8


def test_corpus_validates_on_a_random_weight_model(tiny_llama_dir: Path):
    engine, tok = _engine(tiny_llama_dir)
    prompt = tok.encode("Numbers: 0 1 2 { } [ ]")
    free = engine.generate([prompt] * 4, SamplingParams(max_tokens=40, temperature=1.0, seed=1), prefix="free")
    garbage = 0
    for c in free:
        try:
            json.loads(c.text)
        except ValueError:
            garbage += 1
    assert garbage == len(free), "the random model wrote valid JSON unconstrained: it proves nothing"
    for seed in (0, 1):
        params = [
            SamplingParams(max_tokens=MAX_TOKENS * 2, temperature=1.0, seed=seed + i, structured=_spec(s))
            for i, s in enumerate(SCHEMAS)
        ]
        got = engine.generate([prompt] * len(SCHEMAS), params, prefix=f"s{seed}")
        for i, (schema, c) in enumerate(zip(SCHEMAS, got, strict=True)):
            assert c.finish_reason == "stop", f"schema {i} {schema}: truncated ({c.finish_reason}): {c.text!r}"
            jsonschema.validate(json.loads(c.text), schema)
