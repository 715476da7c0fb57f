"""A planned request's prompt as token ids, and its sampling fitted to the model's context: the same for both front
doors (each names its own fields in the errors: `messages` / `prompt` over HTTP, `chat` / `input` over gRPC)."""

from __future__ import annotations

import dataclasses

from services.gateway.openai.errors import bad_request
from services.gateway.openai.planning import Plan
from services.gateway.openai.tools.render import render_messages
from services.gateway.text.tokenizer import ChatTemplateError, GatewayTokenizer
from shared.modelspec.sampling import SamplingParams


def prompt_ids(plan: Plan, tok: GatewayTokenizer, *, template_param: str, prompt_param: str) -> tuple[int, ...]:
    """The prompt's token ids: chat messages through the chat template (tool definitions rendered into it), text
    encoded, or the ids as sent. A 400 for a template that fails or a prompt of no tokens."""
    if plan.messages is not None:
        try:
            template = tok.chat_template or getattr(tok.hf, "chat_template", None)
            messages, extra = render_messages(plan.messages, plan.tools, template)
            ids = tok.encode_chat(messages, {**(plan.chat_template_kwargs or {}), **extra})
        except ChatTemplateError as e:
            raise bad_request(str(e), template_param, "chat_template_error") from None
    elif plan.prompt_text is not None:
        ids = tok.encode_text(plan.prompt_text)
    else:
        assert plan.prompt_ids is not None
        return plan.prompt_ids
    if not ids:
        raise bad_request("the prompt tokenizes to no tokens; send some text", prompt_param)
    return tuple(ids)


def fit_context(
    sampling: SamplingParams, prompt_len: int, context_length: int | None, *, prompt_param: str
) -> SamplingParams:
    """Refuse a prompt that does not fit the context; max_tokens defaults to the room left (vLLM's semantics)."""
    ctx = context_length
    if ctx is None:
        return sampling
    if prompt_len >= ctx:
        raise bad_request(
            f"the prompt is {prompt_len} tokens, but this model's context length is {ctx} tokens "
            "(prompt + completion); shorten the prompt",
            prompt_param,
            "context_length_exceeded",
        )
    if sampling.max_tokens is None:
        return dataclasses.replace(sampling, max_tokens=ctx - prompt_len)
    if prompt_len + sampling.max_tokens > ctx:
        raise bad_request(
            f"this model's context length is {ctx} tokens, but {prompt_len} prompt tokens + "
            f"max_tokens {sampling.max_tokens} = {prompt_len + sampling.max_tokens}; lower "
            f"max_tokens to at most {ctx - prompt_len}",
            "max_tokens",
            "context_length_exceeded",
        )
    return sampling
