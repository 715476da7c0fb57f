"""--reasoning-parser gpt-oss (with --tool-call-parser gpt-oss): gpt-oss's harmony channels. The analysis channel is
reasoning_content, final is content, a commentary message with a recipient is a tool call; the markers are special
tokens, which the gateway keeps while decoding so the channels can be read, and which never reach the client."""

from __future__ import annotations

import json

import pytest

from services.gateway.mock.backend import MockBackend
from services.gateway.openai.harmony import HarmonySplitter
from services.gateway.openai.output_parsers import OutputParsers
from services.gateway.openai.reasoning import split_reasoning
from services.gateway.text.tokenizer import GatewayTokenizer
from shared.config.choices import ReasoningParser, ToolCallParser
from tests.services.gateway.conftest import MODEL
from tests.services.gateway.scripted import openai_client, script, stream_chat

GPT_OSS = ReasoningParser.GPT_OSS
MARKERS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"]
ANSWER = (
    "<|channel|>analysis<|message|>The user asks 2+2. That is 4.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>The answer is 4.<|return|>"
)
CALL = (
    "<|channel|>analysis<|message|>Need the weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"city": "Oslo"}<|call|>'
)

CASES = [
    (ANSWER, "The user asks 2+2. That is 4.", "The answer is 4."),
    ("<|channel|>final<|message|>Just the answer.<|return|>", None, "Just the answer."),
    ("No markers at all.", None, "No markers at all."),  # decoded without them: plain content
    ("<|channel|>analysis<|message|>cut by max_tok", "cut by max_tok", ""),
    (
        "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>b",
        "a",
        "Checking.b",
    ),
    (CALL, "Need the weather.", '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Oslo"}<|call|>'),
]


@pytest.mark.parametrize("text,reasoning,content", CASES)
def test_split_and_every_streamed_split_agree(text, reasoning, content):
    assert split_reasoning(text, GPT_OSS) == (reasoning, content)
    for step in (1, 2, 3, 7):  # every marker split at every position for step 1
        s = HarmonySplitter()
        r, c = "", ""
        for i in range(0, len(text), step):
            dr, dc = s.feed(text[i : i + step])
            r, c = r + dr, c + dc
            assert "<|message|>" not in dr and "analysis" not in dc
        dr, dc = s.finish()
        assert ((r + dr) or None, c + dc) == (reasoning, content)


@pytest.fixture
def harmony(tiny_tokenizer):
    """The tiny tokenizer with gpt-oss's markers as special tokens (as gpt-oss's own tokenizer has them)."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_tokenizer.hf.name_or_path)
    hf.add_special_tokens({"additional_special_tokens": MARKERS})
    tok = GatewayTokenizer(hf, context_length=4096)
    return tok, MockBackend([MODEL], vocab_size=tok.vocab_size)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


async def test_channels_with_the_openai_client(make_app, harmony):
    tok, backend = harmony
    app = make_app(tokenizer=tok, backend=backend, parsers=OutputParsers(reasoning=GPT_OSS))
    script(backend, tok, ANSWER)
    client = openai_client(app)
    messages = [{"role": "user", "content": "2+2?"}]
    whole = await client.chat.completions.create(model="tiny", messages=messages)
    msg = whole.choices[0].message
    assert (msg.reasoning_content, msg.content) == ("The user asks 2+2. That is 4.", "The answer is 4.")
    for per_chunk in (1, 3):
        backend.tokens_per_chunk = per_chunk
        streamed = await stream_chat(client, messages=messages)
        assert (streamed.reasoning, streamed.content) == ("The user asks 2+2. That is 4.", "The answer is 4.")
    # without the parser the special tokens are dropped as usual: the channel names run into the text
    plain = make_app(tokenizer=tok, backend=backend)
    text = (await openai_client(plain).chat.completions.create(model="tiny", messages=messages)).choices[0]
    assert text.message.content == "analysisThe user asks 2+2. That is 4.assistantfinalThe answer is 4."


async def test_a_tool_call_in_the_commentary_channel(make_app, harmony):
    tok, backend = harmony
    parsers = OutputParsers(reasoning=GPT_OSS, tool_call=ToolCallParser.GPT_OSS)
    app = make_app(tokenizer=tok, backend=backend, parsers=parsers)
    script(backend, tok, CALL)
    client = openai_client(app)
    kw = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": [WEATHER]}
    whole = await client.chat.completions.create(model="tiny", **kw)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.reasoning_content == "Need the weather."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("get_weather", {"city": "Oslo"})
    ]
    for per_chunk in (1, 4):
        backend.tokens_per_chunk = per_chunk
        streamed = await stream_chat(client, **kw)
        assert streamed.reasoning == "Need the weather." and streamed.content == ""
        assert streamed.finish_reason == "tool_calls"
        assert [(c["name"], json.loads(c["arguments"])) for c in streamed.calls.values()] == [
            ("get_weather", {"city": "Oslo"})
        ]


def test_the_gpt_oss_tool_parser_needs_the_gpt_oss_reasoning_parser():
    from shared.config.errors import ConfigError
    from shared.config.resolve import resolve

    with pytest.raises(ConfigError, match="--reasoning-parser gpt-oss"):
        resolve("gateway", ["--tool-call-parser", "gpt-oss"], {})
    cfg = resolve("gateway", ["--tool-call-parser", "gpt-oss", "--reasoning-parser", "gpt-oss"], {})
    assert cfg.http.tool_call_parser is ToolCallParser.GPT_OSS
