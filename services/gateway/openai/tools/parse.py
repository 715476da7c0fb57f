"""Model output -> tool calls: the calls a model wrote in its format (auto; formats.py), or the JSON a constrained
request produced (required / named; shapes in spec.py).

An output cut by max_tokens (`partial`) keeps the calls it completed: a weak model under tool_choice="required"
can repeat calls until it runs out of tokens, and the client should still get the calls, with finish_reason
"length", rather than the raw JSON as content.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from services.gateway.openai.tools.formats import FORMATS, ToolFormat, json_value
from services.gateway.openai.tools.formats_tagged import XmlValue, typed
from services.gateway.openai.tools.spec import Function, ToolChoiceMode, ToolPlan
from shared.config.choices import ToolCallParser


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text (OpenAI's format)


def _call(obj: Any, functions: dict[str, Function]) -> ParsedCall | None:
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string, as OpenAI sends them
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(name, str) or name not in functions or not isinstance(args, dict):
        return None
    props = functions[name].parameters.get("properties")
    props = props if isinstance(props, dict) else {}
    args = {k: typed(v, props.get(k)) if isinstance(v, XmlValue) else v for k, v in args.items()}
    return ParsedCall(f"call_{uuid.uuid4().hex[:24]}", name, json.dumps(args, ensure_ascii=False))


def _calls(items: list[Any] | None, plan: ToolPlan) -> list[ParsedCall]:
    """Every item a call of a known function, or none at all (a malformed call: the client gets the text rather
    than half the calls). Bounded by the plan's parallel setting and its max_calls."""
    functions = {f.name: f for f in plan.functions}
    calls = [_call(v, functions) for v in items or ()]
    if not calls or any(c is None for c in calls):
        return []
    return [c for c in calls if c is not None][: plan.max_calls if plan.parallel else 1]


def parse_output(
    text: str, plan: ToolPlan, parser: ToolCallParser = ToolCallParser.HERMES, *, partial: bool = False
) -> tuple[str | None, list[ParsedCall]]:
    """-> (content left as text, calls). Text that does not parse as calls stays content."""
    if plan.constrained:
        calls = _calls(json_value(text, partial), plan)
        return (None, calls) if calls else (text, [])
    if plan.mode is not ToolChoiceMode.AUTO:
        return text, []
    fmt: ToolFormat = FORMATS[parser]
    at = fmt.start(text)
    if at < 0:
        return text, []
    calls = _calls(fmt.items(text[at:], partial), plan)
    if not calls:
        return text, []
    return text[:at].rstrip() or None, calls
