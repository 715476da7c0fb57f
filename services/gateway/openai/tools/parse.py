"""Model output -> tool calls: Hermes-style <tool_call>{...}</tool_call> blocks (auto), or the JSON a constrained
request produced (required / named; shapes in spec.py)."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from services.gateway.openai.tools.spec import ToolChoiceMode, ToolPlan

START, END = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text (OpenAI's format)


def _call(obj: Any, names: set[str]) -> ParsedCall | None:
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(name, str) or name not in names or not isinstance(args, dict):
        return None
    return ParsedCall(f"call_{uuid.uuid4().hex[:24]}", name, json.dumps(args, ensure_ascii=False))


def parse_output(text: str, plan: ToolPlan) -> tuple[str | None, list[ParsedCall]]:
    """-> (content left as text, calls). Text that does not parse as a call stays content."""
    names = {f.name for f in plan.functions}
    if plan.constrained:
        try:
            value = json.loads(text)
        except ValueError:
            return text, []
        items = value if isinstance(value, list) else [value]
        calls = [c for c in (_call(v, names) for v in items) if c is not None]
        return (None, calls) if calls else (text, [])
    if plan.mode is not ToolChoiceMode.AUTO or START not in text:
        return text, []
    calls = []
    for m in _BLOCK.finditer(text):
        try:
            c = _call(json.loads(m.group(1)), names)
        except ValueError:
            c = None
        if c is None:
            return text, []  # a malformed block: give the client the text rather than half the calls
        calls.append(c)
    if not plan.parallel:
        calls = calls[:1]
    content = text[: text.index(START)].strip()
    return content or None, calls
