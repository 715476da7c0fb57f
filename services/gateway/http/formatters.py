"""Deltas -> OpenAI response bodies, for chat and for legacy completions (streamed chunks and whole answers)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from typing import Any

import msgspec

from services.gateway.backend import TokenLogprob
from services.gateway.openai.reasoning import Splitter, make_splitter, split_reasoning
from services.gateway.openai.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatTokenLogprob,
    ChatTopLogprob,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionResponse,
    PromptLogprob,
    PromptLogprobs,
    PromptTokensDetails,
    Usage,
)
from services.gateway.text.generation import Delta
from services.gateway.text.tokenizer import GatewayTokenizer
from shared.config.choices import ReasoningParser

_ENC = msgspec.json.Encoder()
DONE = b"data: [DONE]\n\n"


def sse(body: Any) -> bytes:
    return b"data: " + _ENC.encode(body) + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens),
    )


def prompt_logprobs(tok: GatewayTokenizer, deltas: Sequence[Delta]) -> PromptLogprobs | msgspec.UnsetType:
    """vLLM's prompt_logprobs from the first delta that carries the prompt (UNSET when none does)."""
    prompt = next((d.prompt for d in deltas if d.prompt is not None), None)
    if prompt is None:
        return msgspec.UNSET
    out: PromptLogprobs = []
    for _, p in prompt:
        if p is None:  # the first prompt token: nothing precedes it
            out.append(None)
            continue
        entry = {p.token_id: PromptLogprob(p.logprob, p.rank or None, tok.token_text(p.token_id))}
        for rank, t in enumerate(p.top_logprobs, 1):
            entry.setdefault(t.token_id, PromptLogprob(t.logprob, rank, tok.token_text(t.token_id)))
        out.append(entry)
    return out


def by_choice(deltas: Sequence[Delta]) -> list[tuple[int, list[Delta]]]:
    """Deltas grouped by choice index, in index order (each group keeps its stream order)."""
    ordered = sorted(deltas, key=lambda d: d.index)  # stable: stream order within a choice
    return [(i, list(g)) for i, g in groupby(ordered, key=lambda d: d.index)]


class _Answer:
    """What both formatters are built from: the request's identity and what it asked to be shown."""

    def __init__(
        self,
        tokenizer: GatewayTokenizer,
        response_id: str,
        created: int,
        model: str,
        include_usage: bool,
        want_logprobs: bool,
        n: int = 1,
        want_prompt_logprobs: bool = False,
    ) -> None:
        self.n = n
        self.want_prompt_logprobs = want_prompt_logprobs  # vLLM's prompt_logprobs field (whole answers only)
        self.tok = tokenizer
        self.id, self.created, self.model = response_id, created, model
        self.want_logprobs = want_logprobs
        # OpenAI: with include_usage every chunk has "usage": null and one extra chunk carries the totals.
        self._usage_field: Usage | None | msgspec.UnsetType = None if include_usage else msgspec.UNSET


class ChatFormatter(_Answer):
    def __init__(self, *args: Any, reasoning: ReasoningParser | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.reasoning = reasoning  # None: all text is content; else <think> text goes to reasoning_content
        self._splitters: dict[int, Splitter] = {}  # choice index -> its splitter (streaming)

    def split(self, d: Delta) -> tuple[str, str]:
        """A delta's text as (reasoning, content) that is safe to send now (all content without a parser)."""
        if self.reasoning is None:
            return "", d.text
        s = self._splitters.get(d.index)
        if s is None:
            s = self._splitters[d.index] = make_splitter(self.reasoning)
        r, c = s.feed(d.text)
        if d.finish_reason is not None:
            r2, c2 = s.finish()
            r, c = r + r2, c + c2
        return r, c

    def message(self, text: str) -> AssistantMessage:
        """A whole choice's text as the assistant message (reasoning split off when there is a parser)."""
        if self.reasoning is None:
            return AssistantMessage("assistant", text)
        reasoning, content = split_reasoning(text, self.reasoning)
        return AssistantMessage("assistant", content or None, reasoning_content=reasoning)

    def logprobs(self, entries: Sequence[TokenLogprob] | None) -> ChatLogprobs | None:
        if entries is None:
            return None
        tok = self.tok
        out = []
        for e in entries:
            tops = [
                ChatTopLogprob(tok.token_text(t.token_id), t.logprob, list(tok.token_bytes(t.token_id)))
                for t in e.top_logprobs
            ]
            out.append(ChatTokenLogprob(tok.token_text(e.token_id), e.logprob, list(tok.token_bytes(e.token_id)), tops))
        return ChatLogprobs(out)

    def _chunk(self, choice: ChatChunkChoice) -> bytes:
        return sse(
            ChatCompletionChunk(
                id=self.id, created=self.created, model=self.model, choices=[choice], usage=self._usage_field
            )
        )

    def first_chunk(self) -> bytes:
        return b"".join(
            self._chunk(ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))) for i in range(self.n)
        )

    def chunk(self, d: Delta) -> bytes:
        reasoning, content = self.split(d)
        if not (reasoning or content) and d.logprobs is None and d.finish_reason is None:
            return b""  # all of it held back (a piece of a tag)
        delta = ChatDelta(
            content=content or msgspec.UNSET,
            reasoning_content=reasoning or msgspec.UNSET,
        )
        return self._chunk(
            ChatChunkChoice(
                index=d.index,
                delta=delta,
                logprobs=self.logprobs(d.logprobs),
                finish_reason=d.finish_reason,
                stop_reason=d.stop_reason,
            )
        )

    def usage_chunk(self, u: Usage) -> bytes:
        return sse(ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[], usage=u))

    def response(self, deltas: Sequence[Delta], u: Usage) -> bytes:
        choices = []
        for i, ds in by_choice(deltas):
            last = ds[-1]
            entries = [e for d in ds if d.logprobs is not None for e in d.logprobs]
            logprobs = self.logprobs(entries) if self.want_logprobs else None
            choices.append(
                ChatChoice(
                    index=i,
                    message=self.message("".join(d.text for d in ds)),
                    logprobs=logprobs,
                    finish_reason=last.finish_reason,
                    stop_reason=last.stop_reason,
                )
            )
        return _ENC.encode(
            ChatCompletionResponse(
                id=self.id,
                created=self.created,
                model=self.model,
                choices=choices,
                usage=u,
                prompt_logprobs=self.prompt_logprobs(deltas),
            )
        )

    def prompt_logprobs(self, deltas: Sequence[Delta]) -> PromptLogprobs | msgspec.UnsetType:
        """vLLM puts a chat answer's prompt_logprobs on the response (its n choices share the prompt)."""
        return prompt_logprobs(self.tok, deltas) if self.want_prompt_logprobs else msgspec.UNSET


class CompletionFormatter(_Answer):
    def __init__(
        self,
        tokenizer: GatewayTokenizer,
        response_id: str,
        created: int,
        model: str,
        include_usage: bool,
        want_logprobs: bool,
        n: int = 1,
        want_prompt_logprobs: bool = False,
    ) -> None:
        super().__init__(tokenizer, response_id, created, model, include_usage, want_logprobs, n, want_prompt_logprobs)
        self.echo: dict[int, str] = {}  # echo=true: choice index -> prompt text, sent before its first text
        self._echo_len: dict[int, int] = {}  # choice index -> characters echoed (completion text_offset starts after)

    def _echoed(self, index: int, text: str) -> str:
        head = self.echo.pop(index, None)
        if head is None:
            return text
        self._echo_len[index] = len(head)
        return head + text

    def logprobs(self, deltas: Sequence[Delta]) -> CompletionLogprobs | None:
        if not self.want_logprobs or all(d.logprobs is None for d in deltas):
            return None
        tok = self.tok
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for d in deltas:
            if d.prompt is not None and (d.index in self.echo or d.index in self._echo_len):
                # echo: the prompt's tokens first, the first one without a logprob (prompt_logprobs alone: not here)
                offset = 0
                for tid, p in d.prompt:
                    text = tok.token_text(tid)
                    tokens.append(text)
                    token_logprobs.append(None if p is None else p.logprob)
                    tops.append(None if p is None else {tok.token_text(t.token_id): t.logprob for t in p.top_logprobs})
                    offsets.append(offset)
                    offset += len(text)
            offset = d.text_offset + self._echo_len.get(d.index, 0)
            for e in d.logprobs or ():
                text = tok.token_text(e.token_id)
                tokens.append(text)
                token_logprobs.append(e.logprob)
                tops.append({tok.token_text(t.token_id): t.logprob for t in e.top_logprobs})
                offsets.append(offset)
                offset += len(text)
        return CompletionLogprobs(tokens, token_logprobs, tops, offsets)

    def first_chunk(self) -> bytes | None:
        return None  # completions have no role delta

    def chunk(self, d: Delta) -> bytes:
        choice = CompletionChoice(
            index=d.index,
            text=self._echoed(d.index, d.text),
            logprobs=self.logprobs((d,)),
            finish_reason=d.finish_reason,
            stop_reason=d.stop_reason,
        )
        return sse(
            CompletionChunk(
                id=self.id, created=self.created, model=self.model, choices=[choice], usage=self._usage_field
            )
        )

    def usage_chunk(self, u: Usage) -> bytes:
        return sse(CompletionChunk(id=self.id, created=self.created, model=self.model, choices=[], usage=u))

    def response(self, deltas: Sequence[Delta], u: Usage) -> bytes:
        choices = [
            CompletionChoice(
                index=i,
                text=self._echoed(i, "".join(d.text for d in ds)),
                logprobs=self.logprobs(ds),
                finish_reason=ds[-1].finish_reason,
                stop_reason=ds[-1].stop_reason,
                prompt_logprobs=prompt_logprobs(self.tok, ds) if self.want_prompt_logprobs else msgspec.UNSET,
            )  # vLLM: on each choice (batched prompts differ)
            for i, ds in by_choice(deltas)
        ]
        return _ENC.encode(
            CompletionResponse(id=self.id, created=self.created, model=self.model, choices=choices, usage=u)
        )


Formatter = ChatFormatter | CompletionFormatter
