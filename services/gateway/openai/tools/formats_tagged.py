"""Tool-call formats whose calls are not JSON objects as a whole (formats.py has the JSON ones):

    qwen3_coder  <tool_call>\\n<function=f>\\n<parameter=city>\\nOslo\\n</parameter>\\n</function>\\n</tool_call>
    gpt-oss      <|channel|>commentary to=functions.f<|message|>{...}<|call|>     (as harmony.py leaves it)
    deepseekv3   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\\n```json\\n{...}\\n```<｜tool▁call▁end｜>...
                 (V3.1 and later drop "function" and the fence: <｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}<｜tool▁call▁end｜>)

Both produce the same items as the JSON formats: {"name": ..., "arguments": {...}}. Qwen3-Coder writes each
parameter's value as bare text, whose type only the tool's schema tells ("42" is a string for a string parameter,
a number for a number one): its values come out as XmlValue and parse.py types them against the schema. The
DeepSeek markers are added tokens of DeepSeek's tokenizers: where a tokenizer marks them special, the detokenizer
drops them unless the request sends skip_special_tokens=false (as with llama3's and mistral's tags).
"""

from __future__ import annotations

import json
import re
from typing import Any

from services.gateway.openai.tools.json_text import Tagged, TaggedBlocks, json_items, tag_prefix


class XmlValue(str):
    """A parameter value as the model wrote it, untyped until parse.py reads the tool's schema."""

    __slots__ = ()


_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(</function>|$)", re.DOTALL)
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


class Qwen3Coder(TaggedBlocks):
    TAG, END = "<tool_call>", "</tool_call>"

    def parse(self, body: str) -> Any | None:
        m = _FUNCTION.search(body)
        if m is None or m.group(3) != "</function>":
            return None
        args = {k.strip(): XmlValue(v) for k, v in _PARAM.findall(m.group(2))}
        return {"name": m.group(1).strip(), "arguments": args}


class DeepSeekV3:
    BEGIN, CALL, SEP, END = "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
    FENCE = re.compile(r"^\s*(\S+)\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)

    def start(self, text: str) -> int:
        at = text.find(self.BEGIN)
        return at if at >= 0 else text.find(self.CALL)

    def held(self, text: str) -> int:
        return max(tag_prefix(text, self.BEGIN), tag_prefix(text, self.CALL))

    def items(self, text: str, partial: bool) -> list[Any] | None:
        out: list[Any] = []
        for block in text.split(self.CALL)[1:]:
            body, closed, _ = block.partition(self.END)
            call = self._call(body) if closed else None
            if call is None:
                if partial and not closed:
                    break
                return None
            out.append(call)
        return out

    def _call(self, body: str) -> dict[str, Any] | None:
        head, sep, rest = body.partition(self.SEP)
        if not sep:
            return None
        if head.strip() == "function":  # V3: the name on the line after the separator, the arguments fenced
            m = self.FENCE.match(rest)
            if m is None:
                return None
            name, args = m.group(1), m.group(2)
        else:  # V3.1: the name before the separator, bare JSON after it
            name, args = head.strip(), rest
        found = json_items(args, 0, False)
        if found is None or len(found[0]) != 1:
            return None
        return {"name": name, "arguments": found[0][0]}


class GptOss(Tagged):
    """Calls as the gpt-oss channel splitter leaves them in the content (services/gateway/openai/harmony.py)."""

    TAG = "<|channel|>commentary to="
    CALL = re.compile(r"<\|channel\|>commentary to=([^<]*)<\|message\|>(.*?)(<\|call\|>|$)", re.DOTALL)

    def items(self, text: str, partial: bool) -> list[Any] | None:
        out: list[Any] = []
        for m in self.CALL.finditer(text):
            recipient, body, closed = m.groups()
            if not closed:
                if partial:
                    break
                return None
            found = json_items(body, 0, False)
            if not recipient.startswith("functions.") or found is None or len(found[0]) != 1:
                return None
            out.append({"name": recipient.removeprefix("functions."), "arguments": found[0][0]})
        return out


def typed(value: XmlValue, schema: Any) -> Any:
    """A Qwen3-Coder parameter's text as its schema's type: strings as written; numbers, booleans, objects and
    arrays read as JSON (what the model writes for them); text that does not read stays a string."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return str(value)
    try:
        return json.loads(value)
    except ValueError:
        return str(value)
