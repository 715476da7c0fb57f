"""OpenAI tool calling at the gateway: request tools -> prompt and grammar, model output -> tool_calls."""

from services.gateway.openai.tools.spec import ToolChoiceMode, ToolPlan, plan_tools

__all__ = ["ToolChoiceMode", "ToolPlan", "plan_tools"]
