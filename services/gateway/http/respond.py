"""A generation's deltas to the HTTP client: the formatter of the request's API (completions, chat, chat with tool
calls), then one JSON body or an SSE stream. The first delta is awaited before any header is sent, so admission
failures (overload, unavailable) keep their status code and Retry-After; a failure after it ends the stream with
an error event."""

from __future__ import annotations

import time
from collections.abc import Sequence

from services.gateway.backend import BackendError, BackendRequest
from services.gateway.http.asgi import Responder
from services.gateway.http.batch import BatchGeneration
from services.gateway.http.formatters import DONE, ChatFormatter, CompletionFormatter, Formatter, sse, usage
from services.gateway.http.tool_formatter import ToolChatFormatter
from services.gateway.openai.errors import from_backend
from services.gateway.openai.output_parsers import OutputParsers
from services.gateway.openai.planning import ApiKind, Plan
from services.gateway.openai.tools.spec import ToolChoiceMode
from services.gateway.text.generation import Delta, Generation
from services.gateway.text.tokenizer import GatewayTokenizer


def formatter_for(
    plan: Plan,
    kind: ApiKind,
    reqs: Sequence[BackendRequest],
    tok: GatewayTokenizer,
    rid: str,
    model: str,
    parsers: OutputParsers | None = None,
) -> Formatter:
    """The response bodies of this request (reqs: its backend requests, one per prompt of a batch)."""
    parsers = parsers or OutputParsers()
    sampling = reqs[0].sampling
    want_logprobs = sampling.logprobs is not None
    created = int(time.time())
    # A grammar (response_format, structured_outputs, tool_choice required / named) constrains the output from its
    # first token, so such an answer holds no reasoning to split off.
    reasoning = parsers.reasoning if sampling.structured is None else None
    if plan.tools is not None and plan.tools.mode is not ToolChoiceMode.NONE:
        rid = reqs[0].request_id
        return ToolChatFormatter(
            tok,
            rid,
            created,
            model,
            plan.include_usage,
            want_logprobs,
            plan=plan.tools,
            parser=parsers.tool_call,
            want_prompt_logprobs=plan.prompt_logprobs,
            reasoning=reasoning,
        )
    if kind is ApiKind.CHAT:
        return ChatFormatter(
            tok,
            rid,
            created,
            model,
            plan.include_usage,
            want_logprobs,
            n=sampling.n,
            want_prompt_logprobs=plan.prompt_logprobs,
            reasoning=reasoning,
        )
    fmt = CompletionFormatter(
        tok,
        rid,
        created,
        model,
        plan.include_usage,
        want_logprobs,
        n=sampling.n,
        want_prompt_logprobs=plan.prompt_logprobs,
    )
    if plan.echo:
        fmt.echo = {
            p * sampling.n + s: tok.decode(q.prompt_token_ids, skip_special_tokens=False)
            for p, q in enumerate(reqs)
            for s in range(sampling.n)
        }
    return fmt


async def respond(gen: Generation | BatchGeneration, plan: Plan, fmt: Formatter, r: Responder) -> None:
    """Answer with the generation: streamed when the request asked for it, else one body."""
    try:
        try:
            delta = await gen.next()  # before any header: admission errors keep their status code
        except BackendError as e:
            raise from_backend(e) from None
        if plan.stream:
            await _stream(gen, plan, fmt, r, delta)
        else:
            deltas = [delta]
            while not gen.finished:
                deltas.append(await gen.next())
            await gen.aclose()
            u = usage(gen.num_prompt_tokens, gen.num_generated, gen.num_cached_tokens)
            await r.full(200, fmt.response(deltas, u))
    except BackendError as e:
        raise from_backend(e) from None
    finally:
        await gen.aclose()  # stop string, error or disconnect: abort the request on the worker


async def _stream(gen: Generation | BatchGeneration, plan: Plan, fmt: Formatter, r: Responder, delta: Delta) -> None:
    await r.start_stream()
    pending = fmt.first_chunk() or b""  # coalesced with the first content chunk: one write, not two
    while not gen.finished:
        if delta.text or delta.logprobs or delta.finish_reason is not None:  # n > 1: one sample ended
            await r.stream(pending + fmt.chunk(delta))
            pending = b""
        try:
            delta = await gen.next()
        except BackendError as e:
            await r.end_stream(pending + sse(from_backend(e).response()) + DONE)
            return
    await gen.aclose()  # before the last write: a stop string aborts the worker as early as possible
    tail = pending + fmt.chunk(delta)
    if plan.include_usage:
        tail += fmt.usage_chunk(usage(gen.num_prompt_tokens, gen.num_generated, gen.num_cached_tokens))
    await r.end_stream(tail + DONE)
