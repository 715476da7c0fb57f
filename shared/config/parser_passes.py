"""Resolution pass of the gateway's output parsers (--reasoning-parser, --tool-call-parser): pairs that only work
together."""

from __future__ import annotations

from shared.config.choices import ReasoningParser, ToolCallParser
from shared.config.context import PassContext
from shared.config.resolved import ResolvedConfig


def check_output_parsers(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """gpt-oss's tool calls are read from what its channel splitter leaves in the content: the one needs the other."""
    if not cfg.has("http") or cfg.http.tool_call_parser is not ToolCallParser.GPT_OSS:
        return cfg
    if cfg.http.reasoning_parser is ReasoningParser.GPT_OSS:
        return cfg
    raise cfg.origin("http.tool_call_parser").fail(
        "gpt-oss",
        "reads calls out of gpt-oss's channels, which only --reasoning-parser gpt-oss separates",
        "add --reasoning-parser gpt-oss",
    )
