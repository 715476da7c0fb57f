"""ChatFormatter for requests with tools: text deltas in, content and OpenAI tool-call deltas out.

Streaming: with a reasoning parser, the thinking streams first as reasoning_content and only the answer after it
is read for calls. Auto mode streams content until the calls begin (formats.py says where: "<tool_call>",
"[TOOL_CALLS]", a JSON object as the whole answer, ...; text that could be that start is held back); from there,
and for constrained modes from the start, output is held until the request ends, then each call goes out as two
deltas (id + type + name with empty arguments, then the arguments), and the last chunk says finish_reason
"tool_calls". Clients (the openai library included) concatenate the deltas by index. An answer cut by max_tokens
keeps the calls it completed, with finish_reason "length".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from services.gateway.http.formatters import ChatFormatter
from services.gateway.openai.reasoning import split_reasoning
from services.gateway.openai.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionResponse,
    ChatDelta,
    DeltaFunctionCall,
    DeltaToolCall,
    FinishReasonOut,
    FunctionCall,
    ToolCall,
    Usage,
)
from services.gateway.openai.tools.formats import FORMATS
from services.gateway.openai.tools.parse import ParsedCall, parse_output
from services.gateway.openai.tools.spec import ToolPlan
from services.gateway.text.generation import Delta
from shared.config.choices import ToolCallParser

_ENC = msgspec.json.Encoder()


def _calls_of(
    text: str, plan: ToolPlan, parser: ToolCallParser, finish: str | None
) -> tuple[str | None, list[ParsedCall]]:
    """(content, calls) of an ended answer: calls only from one that stopped or was cut by max_tokens."""
    if finish not in ("stop", "length"):
        return text, []
    return parse_output(text, plan, parser, partial=finish == "length")


class ToolChatFormatter(ChatFormatter):
    def __init__(self, *args: Any, plan: ToolPlan, parser: ToolCallParser = ToolCallParser.HERMES, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.plan = plan
        self.parser = parser
        self._text = ""  # the answer so far (the reasoning split off)
        self._sent = 0  # characters of _text already streamed as content
        self._holding = plan.constrained  # from here on, text waits for the end

    def chunk(self, d: Delta) -> bytes:
        reasoning, content = self.split(d)
        self._text += content
        out = b""
        lp = self.logprobs(d.logprobs)  # sent with the first piece this delta produces
        if reasoning:
            out += self._chunk(ChatChunkChoice(index=0, delta=ChatDelta(reasoning_content=reasoning), logprobs=lp))
            lp = None
        if not self._holding:
            fmt = FORMATS[self.parser]
            at = fmt.start(self._text)
            if at >= 0:
                upto, self._holding = at, True
            else:
                upto = len(self._text) - (0 if d.finish_reason else fmt.held(self._text))
            if self._holding or not d.finish_reason:  # whitespace waits: it may be all that precedes the calls
                upto = len(self._text[:upto].rstrip())
            if upto > self._sent:
                piece = ChatChunkChoice(index=0, delta=ChatDelta(content=self._text[self._sent : upto]), logprobs=lp)
                out += self._chunk(piece)
                self._sent = upto
        if d.finish_reason is None:
            return out
        _, calls = _calls_of(self._text, self.plan, self.parser, d.finish_reason)
        if not calls:  # nothing parsed: the held text is content after all
            if len(self._text) > self._sent:
                out += self._chunk(ChatChunkChoice(index=0, delta=ChatDelta(content=self._text[self._sent :])))
            return out + self._chunk(
                ChatChunkChoice(index=0, delta=ChatDelta(), finish_reason=d.finish_reason, stop_reason=d.stop_reason)
            )
        for i, c in enumerate(calls):
            head = DeltaToolCall(
                index=i, id=c.id, type="function", function=DeltaFunctionCall(name=c.name, arguments="")
            )
            out += self._chunk(ChatChunkChoice(index=0, delta=ChatDelta(tool_calls=[head])))
            body = DeltaToolCall(index=i, function=DeltaFunctionCall(arguments=c.arguments))
            out += self._chunk(ChatChunkChoice(index=0, delta=ChatDelta(tool_calls=[body])))
        return out + self._chunk(ChatChunkChoice(index=0, delta=ChatDelta(), finish_reason=_finish(d.finish_reason)))

    def response(self, deltas: Sequence[Delta], u: Usage) -> bytes:
        last = deltas[-1]
        text = "".join(d.text for d in deltas)
        reasoning = None
        if self.reasoning is not None:
            reasoning, text = split_reasoning(text, self.reasoning)
        content, calls = _calls_of(text, self.plan, self.parser, last.finish_reason)
        thought: str | None | msgspec.UnsetType = msgspec.UNSET if self.reasoning is None else reasoning
        entries = [e for d in deltas if d.logprobs is not None for e in d.logprobs]
        logprobs = self.logprobs(entries) if self.want_logprobs else None
        if calls:
            msg = AssistantMessage(
                "assistant", content, tool_calls=[_tool_call(c) for c in calls], reasoning_content=thought
            )
            choice = ChatChoice(index=0, message=msg, logprobs=logprobs, finish_reason=_finish(last.finish_reason))
        else:
            choice = ChatChoice(
                index=0,
                message=AssistantMessage(
                    "assistant", text if self.reasoning is None else text or None, reasoning_content=thought
                ),
                logprobs=logprobs,
                finish_reason=last.finish_reason,
                stop_reason=last.stop_reason,
            )
        return _ENC.encode(
            ChatCompletionResponse(
                id=self.id,
                created=self.created,
                model=self.model,
                choices=[choice],
                usage=u,
                prompt_logprobs=self.prompt_logprobs(deltas),
            )
        )


def _finish(finish: str | None) -> FinishReasonOut:
    """An answer with calls: "tool_calls", or "length" when max_tokens cut it (the calls it completed came)."""
    return "length" if finish == "length" else "tool_calls"


def _tool_call(c: ParsedCall) -> ToolCall:
    return ToolCall(id=c.id, function=FunctionCall(c.name, c.arguments))
