"""Response bodies of the OpenAI-compatible API. The server encodes exactly these Structs, and /openapi.json is
generated from them, so the published schema cannot drift from what is sent.

Fields set to msgspec.UNSET are left out of the JSON (OpenAI omits `usage` from stream chunks unless
stream_options.include_usage, and then sends `"usage": null` on every chunk but the last).
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

FinishReasonOut = Literal["stop", "length", "abort", "tool_calls"]


class ErrorInfo(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(msgspec.Struct):
    error: ErrorInfo


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


# ---------------------------------------------------------------- logprobs


class ChatTopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[ChatTopLogprob]


class ChatLogprobs(msgspec.Struct):
    content: list[ChatTokenLogprob] | None


class PromptLogprob(msgspec.Struct):
    """vLLM's Logprob: one token's entry in a prompt_logprobs position (keyed by token id)."""

    logprob: float
    rank: int | None  # in the vocabulary, 1 = most likely
    decoded_token: str


# vLLM's prompt_logprobs: one entry per prompt token, None for the first (nothing precedes it); each maps the prompt
# token and the most likely alternatives (token id, a string key in JSON) to their logprob and rank.
PromptLogprobs = list[dict[int, PromptLogprob] | None]


class CompletionLogprobs(msgspec.Struct):
    """Legacy completions format: parallel lists, one entry per generated token."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


# ---------------------------------------------------------------- chat


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str  # a JSON object as text


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET


class DeltaToolCall(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A streamed piece of a tool call: the first carries id, type and name, later ones argument text."""

    index: int
    id: str | UnsetType = UNSET
    type: Literal["function"] | UnsetType = UNSET
    function: DeltaFunctionCall | UnsetType = UNSET


class AssistantMessage(msgspec.Struct, omit_defaults=True):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCall] | UnsetType = UNSET
    # with --reasoning-parser: the model's thinking (null when it wrote none); absent without one
    reasoning_content: str | None | UnsetType = UNSET


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReasonOut | None = None
    stop_reason: int | str | None = None  # vLLM extension: the stop token id or string that matched


class ChatCompletionResponse(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: PromptLogprobs | UnsetType = UNSET  # vLLM extension (request field prompt_logprobs)


class ChatDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: Literal["assistant"] | UnsetType = UNSET
    content: str | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET  # with --reasoning-parser: a piece of the thinking
    tool_calls: list[DeltaToolCall] | UnsetType = UNSET


class ChatChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReasonOut | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None | UnsetType = UNSET


# ---------------------------------------------------------------- completions


class CompletionChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReasonOut | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | UnsetType = UNSET  # vLLM extension: prompt_logprobs, or echo with logprobs


class CompletionResponse(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class CompletionChunk(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None | UnsetType = UNSET


# ---------------------------------------------------------------- models, health


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "pdrelay"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class HealthStatus(msgspec.Struct):
    status: Literal["ok", "ready", "not_ready"]
