"""ChatFormatter for requests with tools: text deltas in, content and OpenAI tool-call deltas out.

Streaming: auto mode streams content until a "<tool_call>" opens (text that could be its start is held back);
from there, and for constrained modes from the start, output is held until the request ends, then each call goes
out as two deltas (id + type + name with empty arguments, then the arguments), and the last chunk says
finish_reason "tool_calls". Clients (the openai library included) concatenate the deltas by index.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from services.gateway.http.formatters import ChatFormatter
from services.gateway.openai.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionResponse,
    ChatDelta,
    DeltaFunctionCall,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
    Usage,
)
from services.gateway.openai.tools.parse import START, ParsedCall, parse_output
from services.gateway.openai.tools.spec import ToolPlan
from services.gateway.text.generation import Delta
from services.gateway.text.tokenizer import GatewayTokenizer

_ENC = msgspec.json.Encoder()


def _held_suffix(text: str) -> int:
    """Length of the longest end of text that could be the start of START."""
    for n in range(min(len(START) - 1, len(text)), 0, -1):
        if START.startswith(text[-n:]):
            return n
    return 0


class ToolChatFormatter(ChatFormatter):
    def __init__(
        self,
        tokenizer: GatewayTokenizer,
        response_id: str,
        created: int,
        model: str,
        include_usage: bool,
        want_logprobs: bool,
        plan: ToolPlan,
        want_prompt_logprobs: bool = False,
    ) -> None:
        super().__init__(
            tokenizer,
            response_id,
            created,
            model,
            include_usage,
            want_logprobs,
            want_prompt_logprobs=want_prompt_logprobs,
        )
        self.plan = plan
        self._text = ""  # everything generated so far
        self._sent = 0  # characters of _text already streamed as content
        self._holding = plan.constrained  # from here on, text waits for the end

    def chunk(self, d: Delta) -> bytes:
        self._text += d.text
        out = b""
        if not self._holding:
            if START in self._text[self._sent :]:
                upto = self._text.index(START, self._sent)
                self._holding = True
            else:
                upto = len(self._text) - (0 if d.finish_reason else _held_suffix(self._text))
            if upto > self._sent:
                out += self._content(self._text[self._sent : upto], d)
                self._sent = upto
        if d.finish_reason is None:
            return out
        _, calls = parse_output(self._text, self.plan) if d.finish_reason == "stop" else (self._text, [])
        if not calls:  # nothing parsed: the held text is content after all
            if len(self._text) > self._sent:
                out += self._content(self._text[self._sent :], None)
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
        return out + self._chunk(ChatChunkChoice(index=0, delta=ChatDelta(), finish_reason="tool_calls"))

    def _content(self, text: str, d: Delta | None) -> bytes:
        lp = self.logprobs(d.logprobs) if d is not None else None
        return self._chunk(ChatChunkChoice(index=0, delta=ChatDelta(content=text), logprobs=lp))

    def response(self, deltas: Sequence[Delta], u: Usage) -> bytes:
        last = deltas[-1]
        text = "".join(d.text for d in deltas)
        content, calls = parse_output(text, self.plan) if last.finish_reason == "stop" else (text, [])
        entries = [e for d in deltas if d.logprobs is not None for e in d.logprobs]
        logprobs = self.logprobs(entries) if self.want_logprobs else None
        if calls:
            msg = AssistantMessage("assistant", content, tool_calls=[_tool_call(c) for c in calls])
            choice = ChatChoice(index=0, message=msg, logprobs=logprobs, finish_reason="tool_calls")
        else:
            choice = ChatChoice(
                index=0,
                message=AssistantMessage("assistant", text),
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


def _tool_call(c: ParsedCall) -> ToolCall:
    return ToolCall(id=c.id, function=FunctionCall(c.name, c.arguments))
