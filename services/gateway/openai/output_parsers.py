"""How the gateway reads a chat answer's text: the reasoning split off (--reasoning-parser) and the tool-call format
(--tool-call-parser, else the one the chat template implies), and the bound on calls per answer."""

from __future__ import annotations

from dataclasses import dataclass

from services.gateway.openai.tools.formats import format_for_template
from services.gateway.openai.tools.spec import DEFAULT_PARALLEL_CALLS
from shared.config.choices import ReasoningParser, ToolCallParser


@dataclass(frozen=True)
class OutputParsers:
    reasoning: ReasoningParser | None = None  # None: no split, all text is content
    tool_call: ToolCallParser = ToolCallParser.HERMES
    max_parallel_tool_calls: int = DEFAULT_PARALLEL_CALLS

    @property
    def keeps_special_tokens(self) -> bool:
        """gpt-oss's channels and calls are marked by special tokens: chat answers are decoded with them kept, and its
        channel splitter (harmony.py) takes them out of what the client sees."""
        return self.reasoning is ReasoningParser.GPT_OSS

    @classmethod
    def resolve(
        cls,
        *,
        reasoning: ReasoningParser | None,
        tool_call: ToolCallParser | None,
        max_parallel_tool_calls: int,
        template: str | None,
    ) -> OutputParsers:
        """The flags' values; an unset tool-call parser comes from the served chat template."""
        parser = tool_call if tool_call is not None else format_for_template(template)
        return cls(reasoning, parser, max_parallel_tool_calls)
