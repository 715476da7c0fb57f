"""Tools and tool messages into the chat template.

A template that mentions `tools` gets them as the `tools` variable (and assistant `tool_calls` / `tool` messages as
they are): it knows its model's format. A template without a tools section (SmolLM2's, plain ChatML) gets the
default rendering, Hermes-style as Qwen2 / NousResearch models were trained on:

    system:    <the client's system prompt, if any>

               # Tools
               You may call one or more functions ... <tools>
               {"type": "function", "function": {...}}
               </tools>
               ... <tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>
    assistant: <tool_call>
               {"name": "f", "arguments": {...}}
               </tool_call>                         (one block per earlier call)
    user:      <tool_response>
               ...tool output...
               </tool_response>                     (a `tool` message)
"""

from __future__ import annotations

import json
from typing import Any

from services.gateway.openai.tools.spec import ToolChoiceMode, ToolPlan

_INSTRUCTIONS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def template_has_tools(template: str | None) -> bool:
    return template is not None and "tools" in template


def tools_prompt(plan: ToolPlan) -> str:
    return _INSTRUCTIONS.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in plan.openai_tools()))


def _call_block(call: Any) -> str:
    fn = call.get("function", {}) if isinstance(call, dict) else {}
    args = fn.get("arguments", "{}")
    try:
        args_value = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        args_value = args
    body = json.dumps({"name": fn.get("name", ""), "arguments": args_value}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def render_messages(
    messages: list[dict[str, Any]],
    plan: ToolPlan | None,
    template: str | None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """-> (messages for the template, extra template kwargs)."""
    if template_has_tools(template):
        kwargs = {"tools": plan.openai_tools()} if plan is not None and plan.mode is not ToolChoiceMode.NONE else {}
        return messages, kwargs
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            blocks = "\n".join(_call_block(c) for c in m["tool_calls"])
            out.append({"role": "assistant", "content": f"{content}\n{blocks}" if content else blocks})
        elif role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append({"role": role, "content": content})
    if plan is not None and plan.mode is not ToolChoiceMode.NONE:
        prompt = tools_prompt(plan)
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {"role": out[0]["role"], "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out, {}
