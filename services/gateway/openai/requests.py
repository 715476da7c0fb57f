"""Request bodies of the OpenAI-compatible API, as msgspec Structs (decoded and type-checked in one pass).

These types are also the source of /openapi.json (msgspec.json.schema_components), so the published schema is
the one the server decodes with. Unknown fields are ignored, as OpenAI clients send many optional ones.
Type checks happen at decode time; value checks (ranges, combinations) in validation.py.
Extensions beyond OpenAI follow vLLM's names: top_k, min_p, repetition_penalty, ignore_eos, min_tokens,
stop_token_ids, skip_special_tokens, include_stop_str_in_output, chat_template_kwargs, priority, prompt_logprobs,
and vLLM's `structured_outputs` object (json / regex / choice / grammar / json_object) for constrained decoding.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

Role = Literal["system", "developer", "user", "assistant", "tool"]


class TextPart(msgspec.Struct, tag_field="type", tag="text"):
    text: str


class ImageUrlPart(msgspec.Struct, tag_field="type", tag="image_url"):
    """Accepted by the schema so the error can say what is missing, rather than 'invalid type'."""

    image_url: Any = None


class InputAudioPart(msgspec.Struct, tag_field="type", tag="input_audio"):
    input_audio: Any = None


ContentPart = TextPart | ImageUrlPart | InputAudioPart


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[Any] | None = None


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class JsonSchemaFormat(msgspec.Struct, kw_only=True):
    name: str | None = None
    description: str | None = None
    schema: Any = None
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(msgspec.Struct, kw_only=True):
    """vLLM's structured_outputs object: set exactly one constraint."""

    json: Annotated[Any, Meta(description="A JSON schema (object or string) the output must validate against")] = None
    regex: Annotated[str | None, Meta(description="A regular expression the whole output must match")] = None
    choice: Annotated[list[str] | None, Meta(description="The output is exactly one of these strings")] = None
    grammar: Annotated[str | None, Meta(description="An EBNF grammar (root rule 'root')")] = None
    json_object: Annotated[bool | None, Meta(description="Any JSON object")] = None


class _CommonRequest(msgspec.Struct, kw_only=True):
    """Fields both endpoints share. None means "not sent": the OpenAI / vLLM default applies."""

    model: Annotated[str | None, Meta(description="Served model name (default: the only model served)")] = None
    max_tokens: Annotated[int | None, Meta(description="Most tokens to generate (default: up to the context)")] = None
    temperature: Annotated[float | None, Meta(description="0: greedy; default 1")] = None
    top_p: float | None = None
    top_k: Annotated[int | None, Meta(description="Extension: -1 or 0 disables")] = None
    min_p: Annotated[float | None, Meta(description="Extension: minimum probability relative to the top token")] = None
    seed: int | None = None
    stop: Annotated[str | list[str] | None, Meta(description="Stop strings; the output ends before them")] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Meta(description="Samples per prompt, 1 to 64 (one prefill shared by all)")] = 1
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: Annotated[float | None, Meta(description="Extension: HF/vLLM semantics, 1 disables")] = None
    ignore_eos: Annotated[bool, Meta(description="Extension: keep generating past EOS (benchmarks)")] = False
    min_tokens: Annotated[int, Meta(description="Extension: EOS and stop tokens are suppressed before this")] = 0
    stop_token_ids: Annotated[list[int] | None, Meta(description="Extension: extra stop tokens")] = None
    skip_special_tokens: Annotated[bool, Meta(description="Extension: drop special tokens from the text")] = True
    include_stop_str_in_output: Annotated[bool, Meta(description="Extension: keep the matched stop string")] = False
    logit_bias: Annotated[dict[str, float] | None, Meta(description="Token id -> bias in [-100, 100]")] = None
    user: str | None = None
    structured_outputs: Annotated[
        StructuredOutputs | None,
        Meta(description="Extension (vLLM): constrain the output to a JSON schema, regex, choice or grammar"),
    ] = None
    priority: Annotated[int, Meta(description="Extension: lower is served first under --schedule-policy priority")] = 0
    prompt_logprobs: Annotated[
        int | None,
        Meta(
            description="Extension (vLLM): logprob of every prompt token with this many alternatives (0..20); "
            "answered as prompt_logprobs, not with stream=true"
        ),
    ] = None


class ChatCompletionRequest(_CommonRequest, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: Annotated[int | None, Meta(description="Alias of max_tokens (wins when both)")] = None
    logprobs: bool = False
    top_logprobs: Annotated[int | None, Meta(description="0..20; needs logprobs=true")] = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_parallel_tool_calls: Annotated[
        int | None,
        Meta(
            description="Extension: most tool calls in the answer (default: the gateway's --max-parallel-tool-calls); "
            "tool_choice=required stops at this many, auto keeps the first this many"
        ),
    ] = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: Annotated[
        dict[str, Any] | None, Meta(description="Extension: extra variables for the chat template")
    ] = None


class CompletionRequest(_CommonRequest, kw_only=True):
    prompt: Annotated[
        str | list[Any],
        Meta(description="A string, a list of token ids, or a list of up to 64 of either (one choice per prompt)"),
    ]
    logprobs: Annotated[int | None, Meta(description="0..20 most likely alternatives per token")] = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
