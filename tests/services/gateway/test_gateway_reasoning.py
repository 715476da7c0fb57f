"""--reasoning-parser: <think> text goes to reasoning_content, never to content, streamed (tags split across
chunks) and not, alone and before tool calls; the official openai client reads both fields."""

from __future__ import annotations

import json

import pytest

from services.gateway.openai.output_parsers import OutputParsers
from services.gateway.openai.reasoning import ReasoningSplitter, split_reasoning
from shared.config.choices import ReasoningParser
from tests.services.gateway.scripted import openai_client, script, stream_chat, wide

QWEN3, R1 = ReasoningParser.QWEN3, ReasoningParser.DEEPSEEK_R1
QWEN3_ANSWER = "<think>\nThe user asks 2+2. That is 4.\n</think>\n\nThe answer is 4."

CASES = [
    (QWEN3, QWEN3_ANSWER, "The user asks 2+2. That is 4.", "The answer is 4."),
    (QWEN3, "The answer is 4.", None, "The answer is 4."),  # thinking off: no tags
    (QWEN3, "  <think>a</think>b", "a", "b"),
    (QWEN3, "<think>\n\n</think>\n\nok", None, "ok"),  # an empty think block
    (QWEN3, "<think>cut by max_tokens", "cut by max_tokens", ""),
    (QWEN3, "A <think> later is content", None, "A <think> later is content"),
    (R1, "The user asks 2+2.\n</think>\n\nIt is 4.", "The user asks 2+2.", "It is 4."),
    (R1, "<think>opened anyway</think>x", "opened anyway", "x"),
    (R1, "never closed", "never closed", ""),
    (R1, "a </thin k> b </think>c", "a </thin k> b", "c"),
]


@pytest.mark.parametrize("style,text,reasoning,content", CASES)
def test_split_and_every_streamed_split_agree(style, text, reasoning, content):
    assert split_reasoning(text, style) == (reasoning, content)
    for step in (1, 2, 3, 5):  # every tag split at every position for step 1
        s = ReasoningSplitter(style)
        r, c = "", ""
        for i in range(0, len(text), step):
            dr, dc = s.feed(text[i : i + step])
            r, c = r + dr, c + dc
            assert "<think>" not in dc and "</think>" not in dc
        dr, dc = s.finish()
        assert ((r + dr) or None, c + dc) == (reasoning, content)


@pytest.fixture
def reasoning_app(make_app, tiny_tokenizer):
    return make_app(tokenizer=wide(tiny_tokenizer), parsers=OutputParsers(reasoning=QWEN3))


async def test_qwen3_answer_with_the_openai_client(reasoning_app, backend, tiny_tokenizer):
    script(backend, tiny_tokenizer, QWEN3_ANSWER)
    client = openai_client(reasoning_app)
    messages = [{"role": "user", "content": "2+2?"}]
    whole = await client.chat.completions.create(model="tiny", messages=messages)
    msg = whole.choices[0].message
    assert msg.reasoning_content == "The user asks 2+2. That is 4."
    assert msg.content == "The answer is 4."
    assert whole.choices[0].finish_reason == "stop"
    for per_chunk in (1, 3):  # one token per chunk splits "<think>" / "</think>" across chunks
        backend.tokens_per_chunk = per_chunk
        streamed = await stream_chat(client, messages=messages)
        assert (streamed.reasoning, streamed.content) == (msg.reasoning_content, msg.content)
        assert not any("think>" in p for p in streamed.content_pieces)
        assert streamed.finish_reason == "stop"


async def test_deepseek_r1_answer_without_an_opening_tag(make_app, backend, tiny_tokenizer):
    app = make_app(parsers=OutputParsers(reasoning=R1))
    script(backend, tiny_tokenizer, "Two and two.\n</think>\n\nFour.")
    client = openai_client(app)
    messages = [{"role": "user", "content": "2+2?"}]
    msg = (await client.chat.completions.create(model="tiny", messages=messages)).choices[0].message
    assert (msg.reasoning_content, msg.content) == ("Two and two.", "Four.")
    streamed = await stream_chat(client, messages=messages)
    assert (streamed.reasoning, streamed.content) == ("Two and two.", "Four.")


async def test_without_a_parser_the_tags_stay_content(app, backend, tiny_tokenizer):
    script(backend, tiny_tokenizer, QWEN3_ANSWER)
    client = openai_client(app)
    msg = (
        (await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "q"}]))
        .choices[0]
        .message
    )
    assert msg.content == QWEN3_ANSWER
    assert getattr(msg, "reasoning_content", None) is None


async def test_cut_while_thinking_is_all_reasoning(reasoning_app, backend, tiny_tokenizer):
    n = script(backend, tiny_tokenizer, "<think>\nStill thinking about it", eos=False)
    client = openai_client(reasoning_app)
    kw = {"messages": [{"role": "user", "content": "q"}], "max_tokens": n}
    whole = await client.chat.completions.create(model="tiny", **kw)
    assert whole.choices[0].finish_reason == "length"
    assert (whole.choices[0].message.reasoning_content, whole.choices[0].message.content) == (
        "Still thinking about it",
        None,
    )
    streamed = await stream_chat(client, **kw)
    assert (streamed.reasoning, streamed.content, streamed.finish_reason) == ("Still thinking about it", "", "length")


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


async def test_reasoning_then_tool_calls(reasoning_app, backend, tiny_tokenizer):
    """The calls are read from the answer after the thinking; a call written inside <think> is only thought."""
    script(
        backend,
        tiny_tokenizer,
        '<think>Maybe <tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>? '
        'No, Oslo.</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    )
    client = openai_client(reasoning_app)
    kw = {"messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER]}
    whole = await client.chat.completions.create(model="tiny", **kw)
    msg = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls"
    assert msg.reasoning_content.startswith("Maybe <tool_call>") and msg.reasoning_content.endswith("No, Oslo.")
    assert msg.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [
        ("get_weather", {"city": "Oslo"})
    ]
    streamed = await stream_chat(client, **kw)
    assert streamed.reasoning == msg.reasoning_content and streamed.content == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed.calls.values()] == [
        ("get_weather", {"city": "Oslo"})
    ]
    assert streamed.finish_reason == "tool_calls"


async def test_a_grammar_answer_is_not_split(make_app, backend, tiny_tokenizer):
    """deepseek-r1 would call an answer without </think> all reasoning: a grammar-constrained answer has none."""
    app = make_app(parsers=OutputParsers(reasoning=R1))
    script(backend, tiny_tokenizer, '{"a": 1}')
    client = openai_client(app)
    whole = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "json"}], response_format={"type": "json_object"}
    )
    assert whole.choices[0].message.content == '{"a": 1}'


async def test_each_of_n_choices_is_split(reasoning_app, backend, tiny_tokenizer):
    script(backend, tiny_tokenizer, QWEN3_ANSWER)
    client = openai_client(reasoning_app)
    kw = {"messages": [{"role": "user", "content": "2+2?"}], "n": 2}
    whole = await client.chat.completions.create(model="tiny", **kw)
    assert [(c.message.reasoning_content, c.message.content) for c in whole.choices] == [
        ("The user asks 2+2. That is 4.", "The answer is 4.")
    ] * 2
    parts: dict[int, list[str]] = {0: ["", ""], 1: ["", ""]}
    async for chunk in await client.chat.completions.create(model="tiny", stream=True, **kw):
        for c in chunk.choices:
            parts[c.index][0] += getattr(c.delta, "reasoning_content", None) or ""
            parts[c.index][1] += c.delta.content or ""
    assert parts[0] == parts[1] == ["The user asks 2+2. That is 4.", "The answer is 4."]
