"""The formats models write tool calls in (--tool-call-parser), each read the same three ways:

    start(text)   where the calls begin (the content before it streams to the client), or -1: not (yet) seen
    held(text)    how many characters at the end to hold back: they could still become the start
    items(text)   the JSON objects of the calls from start on; `partial`: the output was cut (max_tokens), so
                  keep the objects that are complete and drop the unfinished one. None: not calls after all

    hermes   <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>       (one block per call)
    llama3   <|python_tag|>{"name": "f", "parameters": {...}}; {...}              (the tag is optional)
    mistral  [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]                 (or [TOOL_CALLS]f[ARGS]{...})
    qwen3_coder, deepseekv3, deepseekv31: formats_tagged.py

`<|python_tag|>` and `[TOOL_CALLS]` are special tokens, which the detokenizer drops unless the request sends
skip_special_tokens=false: so llama3 and mistral calls are also recognised without them, as a JSON object (an
array) that is the whole output.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from services.gateway.openai.tools.formats_tagged import DeepSeekV3, GptOss, Qwen3Coder
from services.gateway.openai.tools.json_text import TaggedBlocks, json_items, tag_prefix
from shared.config.choices import ToolCallParser


def json_value(text: str, partial: bool) -> list[Any] | None:
    """A constrained output (tool_choice required / named): one call object, or an array of them."""
    body = text.strip()
    if body.startswith("["):
        found = json_items(body, 1, partial, until="]")
        if found is None or (not partial and found[1] != len(body)):
            return None
        return found[0]
    found = json_items(body, 0, partial)
    return None if found is None or len(found[0]) != 1 else found[0]


class ToolFormat(Protocol):
    def start(self, text: str) -> int: ...
    def held(self, text: str) -> int: ...
    def items(self, text: str, partial: bool) -> list[Any] | None: ...


class Hermes(TaggedBlocks):
    TAG, END = "<tool_call>", "</tool_call>"

    def parse(self, body: str) -> Any | None:
        try:
            return json.loads(body)
        except ValueError:
            return None


class _BareJson:
    """llama3 and mistral: a marker, or (the marker dropped as a special token) JSON as the whole output."""

    TAG = ""
    OPENER = ""  # the first character of the bare JSON

    def start(self, text: str) -> int:
        at = text.find(self.TAG)
        if at >= 0:
            return at
        head = text.lstrip()
        return len(text) - len(head) if head.startswith(self.OPENER) else -1

    def held(self, text: str) -> int:
        return len(text) if not text.strip() else tag_prefix(text, self.TAG)


class Llama3(_BareJson):
    TAG, OPENER = "<|python_tag|>", "{"

    def items(self, text: str, partial: bool) -> list[Any] | None:
        found = json_items(text.replace(self.TAG, " "), 0, partial)
        return None if found is None else found[0]


class Mistral(_BareJson):
    TAG, OPENER, ARGS = "[TOOL_CALLS]", "[", "[ARGS]"

    def items(self, text: str, partial: bool) -> list[Any] | None:
        out: list[Any] = []
        for part in (p.strip() for p in text.split(self.TAG)):
            if not part:
                continue
            if self.ARGS in part:  # the v11+ tokenizers' form: name[ARGS]{...}
                name, _, args = part.partition(self.ARGS)
                found = json_items(args, 0, partial)
                if found is None or len(found[0]) > 1:
                    return None
                out += [{"name": name.strip(), "arguments": a} for a in found[0]]
                continue
            found = json_items(part, 1, partial, until="]") if part.startswith("[") else None
            if found is None:
                return None
            out += found[0]
        return out


def _formats() -> dict[ToolCallParser, ToolFormat]:
    deepseek = DeepSeekV3()  # reads V3's fenced form and V3.1's bare one
    return {
        ToolCallParser.HERMES: Hermes(),
        ToolCallParser.LLAMA3: Llama3(),
        ToolCallParser.MISTRAL: Mistral(),
        ToolCallParser.QWEN3_CODER: Qwen3Coder(),
        ToolCallParser.DEEPSEEK_V3: deepseek,
        ToolCallParser.DEEPSEEK_V31: deepseek,
        ToolCallParser.GPT_OSS: GptOss(),
    }


FORMATS = _formats()


def format_for_template(template: str | None) -> ToolCallParser:
    """The parser a chat template's own tool section implies. A template that says nothing recognisable (or none:
    the gateway then renders tools itself, in Hermes' words, see render.py) gets hermes."""
    t = template if isinstance(template, str) else ""  # a dict of named templates: none recognised
    if "[TOOL_CALLS]" in t:
        return ToolCallParser.MISTRAL
    if "<|channel|>" in t and "to=functions." in t:  # gpt-oss (harmony)
        return ToolCallParser.GPT_OSS
    if "<function=" in t and "<parameter=" in t:  # Qwen3-Coder's XML calls
        return ToolCallParser.QWEN3_CODER
    if "tool▁call▁begin" in t:  # DeepSeek V3 fences the arguments as ```json; V3.1 writes them bare
        return ToolCallParser.DEEPSEEK_V3 if "```json" in t else ToolCallParser.DEEPSEEK_V31
    if "<|python_tag|>" in t or "ipython" in t:  # Llama 3.1+: tool results come back as role "ipython"
        return ToolCallParser.LLAMA3
    return ToolCallParser.HERMES
