"""OpenAI-compatible streaming requests: request bodies for /v1/completions and /v1/chat/completions, and the
SSE chunks turned into one `RequestResult` (TTFT, ITL, E2E, token counts; see bench.serve.metrics for definitions).

Works against pdrelay's gateway, `vllm serve`, sglang-router and a Dynamo frontend: `ignore_eos` and
`max_tokens` pin the output length, `stream_options.include_usage` makes the server count tokens. Servers that
do not send usage get their output counted with the benchmark's tokenizer (as vLLM's benchmark does).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from bench.serve.datasets import BenchRequest
from bench.serve.http_client import StreamingHttp
from bench.serve.metrics import RequestResult

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")


# Only the fields the benchmark reads; msgspec skips the rest of each chunk without building it.
class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None


class _Choice(msgspec.Struct):
    text: str | None = None
    delta: _Delta | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: Any = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True)
class RequestOptions:
    """What every request of a run carries besides its prompt."""

    endpoint: str
    model: str
    ignore_eos: bool = True
    temperature: float = 0.0
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    @property
    def chat(self) -> bool:
        return self.endpoint.endswith("/chat/completions")


def build_body(req: BenchRequest, opts: RequestOptions, history: Sequence[tuple[str, str]] = ()) -> bytes:
    """The JSON body for `req`. `history` holds the (user, assistant) turns before this one (multi-turn)."""
    body: dict[str, Any] = {
        "model": opts.model,
        "max_tokens": req.output_len,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": opts.temperature,
    }
    if opts.ignore_eos:
        body["ignore_eos"] = True
    if opts.chat:
        if not isinstance(req.prompt, str):
            raise ValueError(
                "token-id prompts need --endpoint /v1/completions (chat messages are text); "
                "use --random-prompt-format text for chat"
            )
        messages: list[dict[str, Any]] = []
        if req.system is not None:
            messages.append({"role": "system", "content": req.system})
        for user, assistant in history:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        if req.images:
            parts = [{"type": "image_url", "image_url": {"url": u}} for u in req.images]
            messages.append({"role": "user", "content": [*parts, {"type": "text", "text": req.prompt}]})
        else:
            messages.append({"role": "user", "content": req.prompt})
        body["messages"] = messages
    elif req.images:
        raise ValueError("images need --endpoint /v1/chat/completions")
    elif isinstance(req.prompt, str):
        body["prompt"] = (req.system or "") + "".join(u + a for u, a in history) + req.prompt
    else:
        assert req.system is None and not history, "token-id prompts are single-turn without a system prompt"
        body["prompt"] = list(req.prompt)
    body.update(opts.extra_body)
    return _encode(body)


def prompt_text(req: BenchRequest, history: Sequence[tuple[str, str]] = ()) -> str | None:
    """The prompt as one text (for counting tokens when the server reports no usage); None for token ids."""
    if not isinstance(req.prompt, str):
        return None
    return (req.system or "") + "".join(u + a for u, a in history) + req.prompt


async def send_request(
    http: StreamingHttp, path: str, body: bytes, *, prompt_len: int, count_tokens: Callable[[str], int]
) -> RequestResult:
    """Send one streaming request and time its chunks. Never raises for server or network errors (they are
    recorded in the result); cancellation (timeouts, Ctrl-C) propagates."""
    ttft = latency = 0.0
    last_text_at = 0.0
    itl: list[float] = []
    parts: list[str] = []
    usage: _Usage | None = None
    saw_choices = False
    start = time.perf_counter()
    try:
        async with contextlib.aclosing(http.stream(path, body)) as events:
            async for now, payloads in events:
                for payload in payloads:
                    if payload == b"[DONE]":
                        continue
                    chunk = _decode_chunk(payload)
                    if chunk.error is not None:
                        return RequestResult(False, error=f"error event: {str(chunk.error)[:300]}")
                    if chunk.usage is not None and chunk.usage.completion_tokens is not None:
                        usage = chunk.usage
                    if not chunk.choices:
                        continue
                    choice = chunk.choices[0]
                    text = (
                        choice.text
                        if choice.delta is None
                        else (choice.delta.content or choice.delta.reasoning_content)
                    )
                    if not saw_choices:
                        saw_choices = True
                        ttft = now - start  # provisional: replaced by the first chunk with text
                    latency = now - start
                    if text:
                        if last_text_at:
                            itl.append(now - last_text_at)
                        else:
                            ttft = now - start
                        last_text_at = now
                        parts.append(text)
    except Exception as e:  # noqa: BLE001  (HTTP status, network, bad JSON: a failed request, not a failed run)
        return RequestResult(False, error=f"{type(e).__name__}: {e}"[:400])
    if not saw_choices:
        return RequestResult(False, error="the stream ended without a single choice chunk")
    text = "".join(parts)
    if usage is not None and usage.completion_tokens is not None:
        output_tokens = usage.completion_tokens
    else:
        output_tokens = count_tokens(text)
    prompt_tokens = usage.prompt_tokens if usage is not None and usage.prompt_tokens is not None else prompt_len
    return RequestResult(
        True,
        ttft_s=ttft,
        itl_s=tuple(itl),
        latency_s=latency,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        generated_text=text,
    )


async def served_model(http: StreamingHttp) -> str:
    """The first model GET /v1/models lists (what --model defaults to)."""
    data = await http.get_json("/v1/models")
    models = [m.get("id") for m in (data.get("data") or []) if isinstance(m, dict)]
    if not models or not isinstance(models[0], str):
        raise ValueError(f"GET /v1/models listed no model ({str(data)[:200]}); pass --model NAME")
    return models[0]
