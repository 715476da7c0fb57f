"""Tool calling at the gateway, without a model: tool plans and their grammars, the default rendering of tools
into a template without a tools section, Hermes-style parsing, and streamed tool-call deltas that reassemble into
the same calls as the whole response."""

from __future__ import annotations

import json

import jsonschema
import msgspec
import pytest

from services.gateway.http.tool_formatter import ToolChatFormatter
from services.gateway.openai.errors import ApiError
from services.gateway.openai.responses import Usage
from services.gateway.openai.tools.parse import parse_output
from services.gateway.openai.tools.render import render_messages
from services.gateway.openai.tools.spec import ToolChoiceMode, plan_tools
from services.gateway.text.generation import Delta
from shared.grammar.check import build_grammar

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
    },
}


def test_plans_and_their_grammars():
    assert plan_tools(None, None, None) is None
    auto = plan_tools([WEATHER], None, None)
    assert auto is not None and auto.mode is ToolChoiceMode.AUTO and auto.grammar() is None
    named = plan_tools([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}}, None)
    assert named is not None and named.mode is ToolChoiceMode.NAMED
    schema = json.loads(named.grammar().spec)
    jsonschema.validate({"name": "get_time", "arguments": {"tz": "UTC"}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_weather", "arguments": {"city": "x"}}, schema)
    req = plan_tools([WEATHER, TIME], "required", True)
    schema = json.loads(req.grammar().spec)
    jsonschema.validate([{"name": "get_weather", "arguments": {"city": "Oslo"}}], schema)
    for p in (named, req, plan_tools([WEATHER], "required", False)):
        build_grammar(p.grammar())  # compiles


@pytest.mark.parametrize(
    "tools,choice,param",
    [
        ([{"type": "function"}], None, "tools"),
        ([WEATHER, WEATHER], None, "tools"),
        ([WEATHER], "sometimes", "tool_choice"),
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
        (None, "required", "tool_choice"),
    ],
)
def test_bad_tool_requests_name_the_parameter(tools, choice, param):
    with pytest.raises(ApiError) as e:
        plan_tools(tools, choice, None)
    assert e.value.status == 400 and e.value.param == param


def test_default_rendering_for_a_template_without_tools():
    plan = plan_tools([WEATHER], "auto", None)
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "-3 C"},
    ]
    msgs, kw = render_messages(history, plan, "{% for m in messages %}{{ m.content }}{% endfor %}")
    assert kw == {}
    assert msgs[0]["role"] == "system" and msgs[0]["content"].startswith("Be brief.")
    assert "<tools>" in msgs[0]["content"] and '"get_weather"' in msgs[0]["content"]
    assert msgs[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    }
    assert msgs[3] == {"role": "user", "content": "<tool_response>\n-3 C\n</tool_response>"}
    same, kw = render_messages(history, plan, "{% if tools %}{{ tools }}{% endif %}")  # template knows tools
    assert same is history and kw["tools"][0]["function"]["name"] == "get_weather"


def test_hermes_parsing():
    plan = plan_tools([WEATHER, TIME], "auto", None)
    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {"tz": "CET"}}</tool_call>'
    )
    content, calls = parse_output(text, plan)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_time", {"tz": "CET"}),
    ]
    assert parse_output("no calls here", plan) == ("no calls here", [])
    bad = '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>'
    assert parse_output(bad, plan) == (bad, [])
    single = plan_tools([WEATHER, TIME], "auto", False)
    assert len(parse_output(text, single)[1]) == 1


def _deltas(text: str, step: int = 3) -> list[Delta]:
    parts = [text[i : i + step] for i in range(0, len(text), step)]
    return [Delta(p, None, 0) for p in parts[:-1]] + [Delta(parts[-1], None, 0, "stop")]


def _reassemble(stream: bytes) -> tuple[str, dict[int, dict], str | None]:
    content, calls, finish = "", {}, None
    for line in stream.split(b"\n\n"):
        if not line.startswith(b"data: "):
            continue
        choice = msgspec.json.decode(line[6:])["choices"][0]
        delta = choice["delta"]
        content += delta.get("content", "")
        for tc in delta.get("tool_calls", ()):
            call = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
            call["id"] = tc.get("id", call.get("id"))
            fn = tc.get("function", {})
            call["name"] += fn.get("name", "")
            call["arguments"] += fn.get("arguments", "")
        finish = choice["finish_reason"] or finish
    return content, calls, finish


@pytest.mark.parametrize(
    "choice,text",
    [
        ("auto", 'Checking<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'),
        ("required", '[{"name": "get_weather", "arguments": {"city": "Rome"}}]'),
    ],
)
def test_streamed_deltas_reassemble_to_the_calls(tiny_tokenizer, choice, text):
    plan = plan_tools([WEATHER], choice, None)
    fmt = ToolChatFormatter(tiny_tokenizer, "chatcmpl-1", 0, "m", False, False, plan=plan)
    stream = b"".join(fmt.chunk(d) for d in _deltas(text))
    content, calls, finish = _reassemble(stream)
    assert finish == "tool_calls"
    assert content == ("Checking" if choice == "auto" else "")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [("get_weather", {"city": "Rome"})]
    whole = msgspec.json.decode(
        ToolChatFormatter(tiny_tokenizer, "x", 0, "m", False, False, plan=plan).response(
            _deltas(text), msgspec.convert({"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}, Usage)
        )
    )
    msg = whole["choices"][0]["message"]
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"city": "Rome"}


def test_plain_text_streams_through_auto_mode(tiny_tokenizer):
    plan = plan_tools([WEATHER], "auto", None)
    fmt = ToolChatFormatter(tiny_tokenizer, "chatcmpl-1", 0, "m", False, False, plan=plan)
    text = "It is sunny <tool but no call>"
    content, calls, finish = _reassemble(b"".join(fmt.chunk(d) for d in _deltas(text)))
    assert (content, calls, finish) == (text, {}, "stop")
