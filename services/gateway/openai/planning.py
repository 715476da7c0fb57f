"""Value checks on decoded requests, and their translation into what the backend needs.

Decoding (api_requests.py) already guarantees the types; here every range and combination is checked and each
rejection is a 400 naming the parameter, the value and the fix. The ranges mirror the engine's SamplingParams,
so a request the gateway accepts is never refused by a worker for its sampling values.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

from services.gateway.openai.errors import ApiError, bad_request
from services.gateway.openai.media_parts import image_part
from services.gateway.openai.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    ImageUrlPart,
    TextPart,
    _CommonRequest,
)
from services.gateway.openai.structured import check, structured_spec
from services.gateway.openai.tools.spec import DEFAULT_PARALLEL_CALLS, ToolPlan, plan_tools
from services.gateway.text.tokenizer import RESERVED_TEMPLATE_KWARGS
from shared.grammar.spec import StructuredSpec
from shared.modelspec.sampling import MAX_LOGPROBS, MAX_N, SamplingParams

MAX_STOP_STRINGS = 32
MAX_STOP_STRING_CHARS = 1024
MAX_LOGIT_BIAS_ENTRIES = 1024
MAX_BATCH_PROMPTS = 64


class ApiKind(enum.StrEnum):
    """Which OpenAI endpoint a request came in on."""

    CHAT = "chat"  # /v1/chat/completions
    COMPLETION = "completion"  # /v1/completions


@dataclass(frozen=True, slots=True)
class Plan:
    """A validated request, before tokenization. Exactly one of messages / prompt_text / prompt_ids is set."""

    kind: ApiKind
    model: str | None
    stream: bool
    include_usage: bool
    sampling: SamplingParams  # max_tokens None: fill in from the context length after tokenizing
    skip_special_tokens: bool
    messages: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    prompt_text: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    priority: int = 0
    tools: ToolPlan | None = None
    batch: tuple[Plan, ...] = ()  # completions with several prompts: one plan per prompt (this one: the first)
    echo: bool = False
    image_urls: tuple[tuple[str, str], ...] = ()  # (param path, url) of each image part, in prompt order
    prompt_logprobs: bool = False  # the answer carries vLLM's prompt_logprobs field


def _unsupported(param: str, what: str, fix: str) -> ApiError:
    return bad_request(f"{param}: {what} is not supported by this server; {fix}", param, "unsupported")


def _check_range(param: str, value: float, lo: float, hi: float, *, lo_open: bool = False, fix: str = "") -> None:
    ok = (lo < value if lo_open else lo <= value) and value <= hi  # NaN fails every comparison
    if not ok:
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise bad_request(f"{param} must be in {interval} (got {value!r}){'; ' + fix if fix else ''}", param)


def _logit_bias(raw: dict[str, float] | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
    if not raw:
        return ()
    if len(raw) > MAX_LOGIT_BIAS_ENTRIES:
        raise bad_request(f"logit_bias: at most {MAX_LOGIT_BIAS_ENTRIES} entries (got {len(raw)})", "logit_bias")
    out = []
    for key, bias in raw.items():
        try:
            tok = int(key)
        except ValueError:
            raise bad_request(f"logit_bias keys must be token ids (got {key!r})", "logit_bias") from None
        if not 0 <= tok < vocab_size:
            raise bad_request(f"logit_bias: token id {tok} is not in [0, {vocab_size})", "logit_bias")
        _check_range("logit_bias", bias, -100.0, 100.0)
        out.append((tok, float(bias)))
    return tuple(sorted(out))


def _priority(req: _CommonRequest) -> int:
    if not 0 <= req.priority < 2**31:
        raise bad_request(f"priority must be in [0, 2**31) (got {req.priority}); lower is served first", "priority")
    return req.priority


def _sampling(
    req: _CommonRequest,
    max_tokens: int | None,
    logprobs: int | None,
    vocab_size: int,
    structured: StructuredSpec | None = None,
) -> SamplingParams:
    if not 1 <= req.n <= MAX_N:
        raise bad_request(f"n must be in [1, {MAX_N}] (got {req.n})", "n")
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(
            f"max_tokens must be >= 1 (got {max_tokens}); omit it to generate up to the context length", "max_tokens"
        )
    temperature = 1.0 if req.temperature is None else req.temperature
    _check_range("temperature", temperature, 0.0, 100.0, fix="use 0 for greedy decoding")
    top_p = 1.0 if req.top_p is None else req.top_p
    _check_range("top_p", top_p, 0.0, 1.0, lo_open=True, fix="use 1 to disable")
    top_k = -1 if req.top_k in (None, 0, -1) else req.top_k
    if top_k < -1 or top_k > vocab_size:
        raise bad_request(f"top_k must be -1 or 0 (disabled) or in [1, {vocab_size}] (got {req.top_k})", "top_k")
    min_p = 0.0 if req.min_p is None else req.min_p
    _check_range("min_p", min_p, 0.0, 1.0, fix="use 0 to disable")
    presence = 0.0 if req.presence_penalty is None else req.presence_penalty
    _check_range("presence_penalty", presence, -2.0, 2.0, fix="use 0 to disable")
    frequency = 0.0 if req.frequency_penalty is None else req.frequency_penalty
    _check_range("frequency_penalty", frequency, -2.0, 2.0, fix="use 0 to disable")
    repetition = 1.0 if req.repetition_penalty is None else req.repetition_penalty
    _check_range("repetition_penalty", repetition, 0.0, 10.0, lo_open=True, fix="use 1 to disable")
    if req.seed is not None and not 0 <= req.seed < 2**63:
        raise bad_request(f"seed must be in [0, 2**63) (got {req.seed}); omit it for a random seed", "seed")
    stop = _stop_strings(req.stop)
    stop_ids = tuple(req.stop_token_ids or ())
    for t in stop_ids:
        if not 0 <= t < vocab_size:
            raise bad_request(f"stop_token_ids: token id {t} is not in [0, {vocab_size})", "stop_token_ids")
    if req.min_tokens < 0 or (max_tokens is not None and req.min_tokens > max_tokens):
        raise bad_request(
            f"min_tokens must be in [0, max_tokens] (got {req.min_tokens}, max_tokens {max_tokens})", "min_tokens"
        )
    logit_bias = _logit_bias(req.logit_bias, vocab_size)
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise bad_request(f"logprobs must be in [0, {MAX_LOGPROBS}] (got {logprobs})", "logprobs")
    return SamplingParams(
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        repetition_penalty=repetition,
        frequency_penalty=frequency,
        presence_penalty=presence,
        seed=req.seed,
        stop=stop,
        stop_token_ids=stop_ids,
        include_stop_str_in_output=req.include_stop_str_in_output,
        ignore_eos=req.ignore_eos,
        logprobs=logprobs,
        logit_bias=logit_bias,
        structured=structured,
        n=req.n,
    )


def _stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if len(stops) > MAX_STOP_STRINGS:
        raise bad_request(f"stop: at most {MAX_STOP_STRINGS} stop strings are allowed (got {len(stops)})", "stop")
    for s in stops:
        if not s or len(s) > MAX_STOP_STRING_CHARS:
            raise bad_request(
                f"stop strings must be 1 to {MAX_STOP_STRING_CHARS} characters long (got {s!r:.60})", "stop"
            )
    return stops


def _prompt_logprobs(req: _CommonRequest) -> int | None:
    """vLLM's prompt_logprobs (None: not asked for). Like vLLM, refused with stream=true."""
    k = req.prompt_logprobs
    if k is None:
        return None
    if not 0 <= k <= MAX_LOGPROBS:
        raise bad_request(
            f"prompt_logprobs must be in [0, {MAX_LOGPROBS}] (got {k}); 0 gives each prompt token's own logprob only",
            "prompt_logprobs",
        )
    if req.stream:
        raise bad_request(
            "prompt_logprobs is not available with stream=true; send the request without streaming", "prompt_logprobs"
        )
    return k


def template_kwargs(raw: dict[str, Any] | None) -> dict[str, Any] | None:
    """chat_template_kwargs, refusing the names the gateway passes to the template itself (HTTP and gRPC)."""
    for key in raw or ():
        why = RESERVED_TEMPLATE_KWARGS.get(key)
        if why is not None:
            raise bad_request(
                f"chat_template_kwargs: {key!r} is reserved ({why}); remove it from chat_template_kwargs",
                f"chat_template_kwargs.{key}",
            )
    return raw


def _stream_flags(req: _CommonRequest) -> bool:
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed with stream=true", "stream_options")
    return bool(req.stream and req.stream_options is not None and req.stream_options.include_usage)


def plan_chat(
    req: ChatCompletionRequest,
    *,
    vocab_size: int,
    image_placeholder: str | None = None,
    max_tool_calls: int = DEFAULT_PARALLEL_CALLS,
) -> Plan:
    """image_placeholder: the text an image part becomes in the templated prompt (the served model's image token);
    None for a text-only model, which refuses image parts. max_tool_calls: --max-parallel-tool-calls."""
    if not req.messages:
        raise bad_request("messages must contain at least one message", "messages")
    tools = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls, req.max_parallel_tool_calls, max_tool_calls)
    if tools is not None and req.n != 1:
        raise bad_request(f"n={req.n} with tools is not supported; send n separate requests", "n")
    structured = structured_spec(req.response_format, req.structured_outputs)
    if tools is not None and tools.constrained:
        if structured is not None:
            raise bad_request(
                "tool_choice required / a named function already constrains the output; leave out "
                "response_format and structured_outputs",
                "tool_choice",
            )
        structured = tools.grammar()
        assert structured is not None
        check(structured, "tools")
    if req.top_logprobs is not None:
        if not 0 <= req.top_logprobs <= MAX_LOGPROBS:
            raise bad_request(f"top_logprobs must be in [0, {MAX_LOGPROBS}] (got {req.top_logprobs})", "top_logprobs")
        if req.top_logprobs > 0 and not req.logprobs:
            raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    sampling = _sampling(req, max_tokens, logprobs, vocab_size, structured)
    prompt_k = _prompt_logprobs(req)
    if prompt_k is not None:
        sampling = dataclasses.replace(sampling, prompt_logprobs=prompt_k)
    messages: list[dict[str, Any]] = []
    image_urls: list[tuple[str, str]] = []
    for i, m in enumerate(req.messages):
        content: str
        if m.content is None:
            content = ""
        elif isinstance(m.content, str):
            content = m.content
        else:
            texts = []
            for j, part in enumerate(m.content):
                if isinstance(part, ImageUrlPart):
                    texts.append(image_part(part, f"messages[{i}].content[{j}]", image_placeholder, image_urls))
                    continue
                if not isinstance(part, TextPart):
                    kind = "image" if isinstance(part, ImageUrlPart) else "audio"
                    raise _unsupported(f"messages[{i}].content[{j}]", f"{kind} input", "send text parts only")
                texts.append(part.text)
            content = "\n".join(texts)
        msg: dict[str, Any] = {"role": m.role, "content": content}
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_calls:
            msg["tool_calls"] = m.tool_calls
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        messages.append(msg)
    return Plan(
        ApiKind.CHAT,
        req.model,
        req.stream,
        _stream_flags(req),
        sampling,
        req.skip_special_tokens,
        messages=messages,
        chat_template_kwargs=template_kwargs(req.chat_template_kwargs),
        priority=_priority(req),
        tools=tools,
        image_urls=tuple(image_urls),
        prompt_logprobs=prompt_k is not None,
    )


def plan_completion(req: CompletionRequest, *, vocab_size: int) -> Plan:
    if req.best_of not in (None, 1):
        raise _unsupported("best_of", f"best_of={req.best_of}", "leave it out or use 1")
    if req.suffix:
        raise _unsupported("suffix", "suffix", "leave it out")
    structured = structured_spec(None, req.structured_outputs)
    sampling = _sampling(req, req.max_tokens, req.logprobs, vocab_size, structured)
    prompt_k = _prompt_logprobs(req)
    if prompt_k is None and req.echo and req.logprobs is not None:  # the echoed prompt's tokens get logprobs too
        prompt_k = req.logprobs  # (vLLM's rule; an explicit prompt_logprobs wins)
    if prompt_k is not None:
        sampling = dataclasses.replace(sampling, prompt_logprobs=prompt_k)
    prompts = _prompts(req.prompt, vocab_size)
    plans = tuple(
        Plan(
            ApiKind.COMPLETION,
            req.model,
            req.stream,
            _stream_flags(req),
            sampling,
            req.skip_special_tokens,
            prompt_text=text,
            prompt_ids=ids,
            priority=_priority(req),
            echo=req.echo,
            prompt_logprobs=prompt_k is not None and not req.stream,
        )
        for text, ids in prompts
    )
    if len(plans) == 1:
        return plans[0]
    return dataclasses.replace(plans[0], batch=plans)


def _prompts(prompt: str | list[Any], vocab_size: int) -> list[tuple[str | None, tuple[int, ...] | None]]:
    """One prompt, or a batch: a list of strings or a list of token-id lists (each checked as a prompt)."""
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(p, str) or _is_token_list(p) for p in prompt)
        and not _is_token_list(prompt)
    ):
        if len(prompt) > MAX_BATCH_PROMPTS:
            raise bad_request(f"prompt: at most {MAX_BATCH_PROMPTS} prompts per request (got {len(prompt)})", "prompt")
        return [_prompt(p, vocab_size) for p in prompt]
    return [_prompt(prompt, vocab_size)]


def _is_token_list(value: Any) -> bool:
    return isinstance(value, list) and all(type(t) is int for t in value)  # bool is not a token id


def _prompt(prompt: str | list[Any], vocab_size: int) -> tuple[str | None, tuple[int, ...] | None]:
    """One prompt, as text or token ids. Batches (several prompts in one request) are refused."""
    if isinstance(prompt, list) and len(prompt) == 1 and (isinstance(prompt[0], str) or _is_token_list(prompt[0])):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("prompt must not be empty", "prompt")
        return prompt, None
    if not prompt:
        raise bad_request("prompt must not be empty", "prompt")
    if not _is_token_list(prompt):
        if all(isinstance(p, str) or _is_token_list(p) for p in prompt):
            raise _unsupported("prompt", f"a batch of {len(prompt)} prompts", "send one request per prompt")
        raise bad_request("prompt must be a string or a list of token ids (integers)", "prompt")
    for t in prompt:
        if not 0 <= t < vocab_size:
            raise bad_request(f"prompt: token id {t} is not in [0, {vocab_size})", "prompt")
    return None, tuple(prompt)
