"""--tool-call-parser hermes / llama3 / mistral / qwen3_coder / deepseekv3 / deepseekv31 with the official openai client, streamed and not; the parser a
chat template implies; and tool_choice="required" cut by max_tokens: the calls it completed, finish "length",
bounded by max_parallel_tool_calls."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from services.gateway.openai.output_parsers import OutputParsers
from services.gateway.openai.tools.formats import format_for_template
from services.gateway.openai.tools.parse import parse_output
from services.gateway.openai.tools.spec import plan_tools
from shared.config.choices import ToolCallParser
from tests.services.gateway.scripted import openai_client, script, stream_chat, wide

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
}
TWO_CALLS = [("get_weather", {"city": "Oslo"}), ("get_time", {"tz": "CET"})]

ANSWERS = {  # each parser: an answer with a preamble and two calls, as that model family writes it
    ToolCallParser.HERMES: (
        "Let me check.",
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>',
    ),
    ToolCallParser.LLAMA3: (
        "Let me check.",
        'Let me check.<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
        '{"name": "get_time", "parameters": {"tz": "CET"}}',
    ),
    ToolCallParser.MISTRAL: (
        "Let me check.",
        'Let me check.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
        '{"name": "get_time", "arguments": {"tz": "CET"}}]',
    ),
    ToolCallParser.QWEN3_CODER: (
        "Let me check.",
        "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n"
        "</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>\n</tool_call>",
    ),
    ToolCallParser.DEEPSEEK_V3: (
        "Let me check.",
        "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"city": "Oslo"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n'
        '{"tz": "CET"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    ),
    ToolCallParser.DEEPSEEK_V31: (
        "Let me check.",
        'Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Oslo"}'
        '<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"tz": "CET"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    ),
    ToolCallParser.GPT_OSS: (  # as the channel splitter leaves it (test_gateway_harmony.py has the whole path)
        "Let me check.",
        'Let me check.<|channel|>commentary to=functions.get_weather<|message|>{"city": "Oslo"}<|call|>'
        '<|channel|>commentary to=functions.get_time<|message|>{"tz": "CET"}<|call|>',
    ),
}


@pytest.mark.parametrize("parser", list(ToolCallParser))
async def test_each_parser_streamed_and_not(make_app, backend, tiny_tokenizer, parser):
    preamble, answer = ANSWERS[parser]
    app = make_app(tokenizer=wide(tiny_tokenizer), parsers=OutputParsers(tool_call=parser))
    script(backend, tiny_tokenizer, answer)
    client = openai_client(app)
    kw = {"messages": [{"role": "user", "content": "Weather and time?"}], "tools": [WEATHER, TIME]}
    whole = await client.chat.completions.create(model="tiny", **kw)
    msg = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls"
    assert msg.content == preamble
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == TWO_CALLS
    for per_chunk in (1, 4):
        backend.tokens_per_chunk = per_chunk
        streamed = await stream_chat(client, **kw)
        assert streamed.content == preamble and streamed.finish_reason == "tool_calls"
        assert [(c["name"], json.loads(c["arguments"])) for c in streamed.calls.values()] == TWO_CALLS
        assert all(c["id"].startswith("call_") for c in streamed.calls.values())


@pytest.mark.parametrize(
    "parser,text",
    [
        (ToolCallParser.LLAMA3, '{"name": "get_weather", "parameters": {"city": "Oslo"}}'),  # tag dropped (special)
        (ToolCallParser.LLAMA3, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}'),
        (ToolCallParser.MISTRAL, '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]'),  # tag dropped
        (ToolCallParser.MISTRAL, '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}'),  # v11+ tokenizers
        (ToolCallParser.HERMES, '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}'),
    ],
)
def test_format_variants(parser, text):
    plan = plan_tools([WEATHER, TIME], "auto", None)
    content, calls = parse_output(text, plan, parser)
    assert content is None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]


@pytest.mark.parametrize("parser", list(ToolCallParser))
def test_text_that_is_not_calls_stays_content(parser):
    plan = plan_tools([WEATHER], "auto", None)
    for text in ("Plain answer.", '{"not": "a call"}', "[1, 2] are numbers", '<tool_call>{"name": "nope"}'):
        assert parse_output(text, plan, parser) == (text, [])


UNITS = {
    "type": "function",
    "function": {
        "name": "convert",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string"},
                "amount": {"type": "number"},
                "exact": {"type": "boolean"},
                "units": {"type": "array", "items": {"type": "string"}},
                "note": {"type": ["string", "null"]},
            },
        },
    },
}


def test_qwen3_coder_values_take_their_schema_type():
    """A bare "42" is a string for a string parameter and a number for a number one; a value that does not read as
    its type stays the text the model wrote; an undeclared parameter is read as JSON where it can be."""
    plan = plan_tools([UNITS], "auto", None)
    params = {"code": "42", "amount": "2.5", "exact": "true", "units": '["m", "km"]', "note": "1", "extra": "[1"}
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    text = f"<tool_call>\n<function=convert>\n{body}</function>\n</tool_call>"
    content, calls = parse_output(text, plan, ToolCallParser.QWEN3_CODER)
    assert content is None and len(calls) == 1
    assert json.loads(calls[0].arguments) == {
        "code": "42",
        "amount": 2.5,
        "exact": True,
        "units": ["m", "km"],
        "note": "1",
        "extra": "[1",
    }
    multiline = (
        "<tool_call>\n<function=convert>\n<parameter=code>\nline 1\nline 2\n</parameter>\n</function>\n</tool_call>"
    )
    assert json.loads(parse_output(multiline, plan, ToolCallParser.QWEN3_CODER)[1][0].arguments) == {
        "code": "line 1\nline 2"
    }
    unclosed = "<tool_call>\n<function=convert>\n<parameter=code>\nx\n</parameter>\n</tool_call>"
    assert parse_output(unclosed, plan, ToolCallParser.QWEN3_CODER) == (unclosed, [])  # no </function>: text


def test_parser_from_the_chat_template():
    assert format_for_template(None) is ToolCallParser.HERMES  # the gateway renders tools Hermes-style itself
    assert format_for_template("{{ '<tool_call>' }}") is ToolCallParser.HERMES
    assert format_for_template("{{ '[AVAILABLE_TOOLS]' }}{{ '[TOOL_CALLS]' }}") is ToolCallParser.MISTRAL
    llama = "{% if message.role == 'ipython' %}{{ '<|python_tag|>' }}{% endif %}"
    assert format_for_template(llama) is ToolCallParser.LLAMA3
    assert format_for_template("{% for m in messages %}{{ m.content }}{% endfor %}") is ToolCallParser.HERMES
    coder = "{{ '<tool_call>\\n<function=' + name + '>' }}{{ '<parameter=' + k + '>' }}"
    assert format_for_template(coder) is ToolCallParser.QWEN3_CODER
    v3 = "{{'<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + name + '\\n```json\\n' + args + '\\n```' }}"
    assert format_for_template(v3) is ToolCallParser.DEEPSEEK_V3
    v31 = "{{'<｜tool▁call▁begin｜>' + name + '<｜tool▁sep｜>' + args + '<｜tool▁call▁end｜>' }}"
    assert format_for_template(v31) is ToolCallParser.DEEPSEEK_V31
    resolved = OutputParsers.resolve(reasoning=None, tool_call=None, max_parallel_tool_calls=8, template=llama)
    assert resolved.tool_call is ToolCallParser.LLAMA3
    forced = OutputParsers.resolve(
        reasoning=None, tool_call=ToolCallParser.MISTRAL, max_parallel_tool_calls=8, template=llama
    )
    assert forced.tool_call is ToolCallParser.MISTRAL


# ---------------------------------------------------------------- required, cut by max_tokens

REPEATING = (
    '[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}, '
    '{"name": "get_weather", "arguments": {"city": "Os'
)


async def test_required_cut_by_max_tokens_returns_the_completed_calls(make_app, backend, tiny_tokenizer):
    app = make_app(tokenizer=wide(tiny_tokenizer))
    n = script(backend, tiny_tokenizer, REPEATING, eos=False)
    client = openai_client(app)
    kw = {
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_tokens": n,
    }
    whole = await client.chat.completions.create(model="tiny", **kw)
    choice = whole.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("get_weather", {"city": "Oslo"})
    ] * 2
    streamed = await stream_chat(client, **kw)
    assert streamed.finish_reason == "length" and streamed.content == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed.calls.values()] == [
        ("get_weather", {"city": "Oslo"})
    ] * 2


async def test_cut_before_any_call_completed_is_text(make_app, backend, tiny_tokenizer):
    app = make_app(tokenizer=wide(tiny_tokenizer))
    n = script(backend, tiny_tokenizer, '[{"name": "get_weather", "argu', eos=False)
    whole = await openai_client(app).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=n,
    )
    assert whole.choices[0].finish_reason == "length" and whole.choices[0].message.tool_calls is None


@pytest.mark.parametrize("parser", list(ToolCallParser))
def test_auto_mode_cut_by_max_tokens_keeps_the_completed_calls(parser):
    _, answer = ANSWERS[parser]
    cut = answer[: answer.index("CET") + 1]  # inside the second call's arguments
    plan = plan_tools([WEATHER, TIME], "auto", None)
    assert parse_output(cut, plan, parser) == (cut, [])  # ended without being cut: a malformed answer is text
    content, calls = parse_output(cut, plan, parser, partial=True)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == TWO_CALLS[:1]


def test_parallel_calls_are_bounded():
    plan = plan_tools([WEATHER], "required", True)
    schema = json.loads(plan.grammar().spec)
    call = {"name": "get_weather", "arguments": {"city": "x"}}
    jsonschema.validate([call] * 8, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([call] * 9, schema)  # the default bound: the model must close the array
    raised = plan_tools([WEATHER], "required", True, max_calls=20)
    jsonschema.validate([call] * 20, json.loads(raised.grammar().spec))
    flag = plan_tools([WEATHER], "required", True, default_max_calls=2)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([call] * 3, json.loads(flag.grammar().spec))
    auto = plan_tools([WEATHER], "auto", True, max_calls=2)
    text = "".join(f"<tool_call>{json.dumps(call)}</tool_call>" for _ in range(5))
    assert len(parse_output(text, auto)[1]) == 2


@pytest.mark.parametrize("value", [0, 129])
async def test_max_parallel_tool_calls_out_of_range_is_a_400(app, value):
    with pytest.raises(openai.BadRequestError) as e:
        await openai_client(app).chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "q"}],
            tools=[WEATHER],
            extra_body={"max_parallel_tool_calls": value},
        )
    assert e.value.body["param"] == "max_parallel_tool_calls"


async def test_the_flag_and_the_request_field_reach_the_grammar(make_app, backend, tiny_tokenizer):
    app = make_app(tokenizer=wide(tiny_tokenizer), parsers=OutputParsers(max_parallel_tool_calls=3))
    script(backend, tiny_tokenizer, '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]')
    client = openai_client(app)
    kw = {"messages": [{"role": "user", "content": "q"}], "tools": [WEATHER], "tool_choice": "required"}
    await client.chat.completions.create(model="tiny", **kw)
    await client.chat.completions.create(model="tiny", extra_body={"max_parallel_tool_calls": 12}, **kw)
    limits = [json.loads(r.sampling.structured.spec)["maxItems"] for r in backend.requests]
    assert limits == [3, 12]


# ---------------------------------------------------------------- the gateway flags


def test_the_flags_reach_the_app(tiny_llama_dir, tiny_tokenizer, backend):
    from services.gateway.server import build_app
    from shared.config import ConfigError, PassContext, StaticProbe, resolve
    from shared.config.choices import ReasoningParser

    ctx = PassContext(probe=StaticProbe(memory_bytes=16 << 30))  # type: ignore[call-arg]
    argv = ["--model", str(tiny_llama_dir), "--reasoning-parser", "deepseek-r1", "--max-parallel-tool-calls", "16"]
    cfg = resolve("gateway", argv, env={}, ctx=ctx)
    app = build_app(cfg, backend, tokenizer=tiny_tokenizer)
    # no --tool-call-parser: the tiny model's ChatML template has no tool format of its own -> hermes
    assert app.parsers == OutputParsers(ReasoningParser.DEEPSEEK_R1, ToolCallParser.HERMES, 16)
    cfg = resolve("gateway", [*argv, "--tool-call-parser", "mistral"], env={}, ctx=ctx)
    assert build_app(cfg, backend, tokenizer=tiny_tokenizer).parsers.tool_call is ToolCallParser.MISTRAL
    with pytest.raises(ConfigError, match="--reasoning-parser"):
        resolve("gateway", ["--reasoning-parser", "qwen"], env={}, ctx=ctx)
    with pytest.raises(ConfigError, match="--max-parallel-tool-calls"):
        resolve("gateway", ["--max-parallel-tool-calls", "0"], env={}, ctx=ctx)
