"""tools / tool_choice / parallel_tool_calls -> a ToolPlan: which mode, which functions, and for `required` and a
named function the JSON schema the whole output is constrained to (so the call is always valid).

Constrained output shapes (parsed back by parse.py):
    named function f        {"name": "f", "arguments": {...f's parameters...}}
    required, parallel      [{"name": ..., "arguments": {...}}, ...]   (1 to max_calls calls)
    required, not parallel  {"name": ..., "arguments": {...}}          (anyOf over the functions)
`auto` is not constrained: the model writes calls in its own format (formats.py), or plain text.

max_calls bounds the calls of one answer: without it a small model under `required` can repeat calls until
max_tokens. It is the grammar's maxItems (so the model must close the array) and, in auto mode, how many of the
calls written are kept. The gateway's --max-parallel-tool-calls sets it; a request may raise (or lower) it with
the extension field max_parallel_tool_calls, up to MAX_PARALLEL_CALLS (a bigger maxItems makes a bigger grammar).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from services.gateway.openai.errors import bad_request
from shared.grammar.spec import GrammarKind, StructuredSpec

DEFAULT_PARALLEL_CALLS = 8  # --max-parallel-tool-calls
MAX_PARALLEL_CALLS = 128  # the most a request or the flag may ask for


class ToolChoiceMode(enum.Enum):
    NONE = "none"
    AUTO = "auto"
    REQUIRED = "required"
    NAMED = "named"


@dataclass(frozen=True)
class Function:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolPlan:
    mode: ToolChoiceMode
    functions: tuple[Function, ...]
    parallel: bool
    named: str | None = None
    max_calls: int = DEFAULT_PARALLEL_CALLS  # most calls in one answer (when parallel)

    @property
    def constrained(self) -> bool:
        return self.mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.NAMED)

    def openai_tools(self) -> list[dict[str, Any]]:
        """The tools as OpenAI sends them (what chat templates with a tools section expect)."""
        return [
            {"type": "function", "function": {"name": f.name, "description": f.description, "parameters": f.parameters}}
            for f in self.functions
        ]

    def grammar(self) -> StructuredSpec | None:
        if not self.constrained:
            return None

        def call(f: Function) -> dict[str, Any]:
            return {
                "type": "object",
                "properties": {"name": {"const": f.name}, "arguments": f.parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }

        if self.mode is ToolChoiceMode.NAMED:
            schema = call(next(f for f in self.functions if f.name == self.named))
        else:
            one = {"anyOf": [call(f) for f in self.functions]} if len(self.functions) > 1 else call(self.functions[0])
            schema = (
                {"type": "array", "items": one, "minItems": 1, "maxItems": self.max_calls} if self.parallel else one
            )
        return StructuredSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema, sort_keys=True))


def _function(i: int, tool: Any) -> Function:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise bad_request(f'{where} must be an object with type "function"', "tools")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise bad_request(f'{where}.function is required: {{"name": ..., "parameters": {{...}}}}', "tools")
    name = fn.get("name")
    if not isinstance(name, str) or not name or len(name) > 64:
        raise bad_request(f"{where}.function.name must be a string of 1 to 64 characters", "tools")
    params = fn.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise bad_request(f"{where}.function.parameters must be a JSON schema object", "tools")
    desc = fn.get("description") or ""
    if not isinstance(desc, str):
        raise bad_request(f"{where}.function.description must be a string", "tools")
    return Function(name, desc, params)


def plan_tools(
    tools: list[Any] | None,
    tool_choice: Any,
    parallel_tool_calls: bool | None,
    max_calls: int | None = None,
    default_max_calls: int = DEFAULT_PARALLEL_CALLS,
) -> ToolPlan | None:
    """None: the request has no tools (or tool_choice "none" with none given). Raises ApiError (400).
    max_calls: the request's max_parallel_tool_calls (None: default_max_calls, the gateway's flag)."""
    if max_calls is not None and not 1 <= max_calls <= MAX_PARALLEL_CALLS:
        raise bad_request(
            f"max_parallel_tool_calls must be in [1, {MAX_PARALLEL_CALLS}] (got {max_calls})",
            "max_parallel_tool_calls",
        )
    functions = tuple(_function(i, t) for i, t in enumerate(tools or ()))
    names = [f.name for f in functions]
    if len(set(names)) != len(names):
        raise bad_request(f"tools: function names must be unique (got {names})", "tools")
    parallel = True if parallel_tool_calls is None else bool(parallel_tool_calls)
    if tool_choice is None:
        mode = ToolChoiceMode.AUTO if functions else ToolChoiceMode.NONE
        named = None
    elif isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise bad_request(
                f'tool_choice must be "none", "auto", "required" or a named function (got {tool_choice!r})',
                "tool_choice",
            )
        mode, named = ToolChoiceMode(tool_choice), None
    elif isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        named = tool_choice["function"].get("name")
        if named not in names:
            raise bad_request(f"tool_choice names function {named!r}, which is not in tools ({names})", "tool_choice")
        mode = ToolChoiceMode.NAMED
    else:
        raise bad_request(
            'tool_choice must be a string or {"type": "function", "function": {"name": ...}}', "tool_choice"
        )
    if mode in (ToolChoiceMode.AUTO, ToolChoiceMode.REQUIRED) and not functions:
        raise bad_request(f"tool_choice {mode.value!r} needs at least one tool in tools", "tool_choice")
    if not functions:
        return None
    return ToolPlan(mode, functions, parallel, named, max_calls or default_max_calls)
