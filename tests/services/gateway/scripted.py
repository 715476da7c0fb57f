"""The official openai client against the gateway app over the mock backend, which answers with a scripted text
(its tokens, then EOS): the gateway's detokenizer, parsers and formatters are the real ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from services.gateway.http.app import GatewayApp
from services.gateway.mock.backend import MockBackend
from services.gateway.text.tokenizer import GatewayTokenizer

EOS = "<|im_end|>"  # the tiny tokenizer's EOS (tests/helpers/tiny_models.py)


def script(backend: MockBackend, tok: GatewayTokenizer, text: str, *, eos: bool = True) -> int:
    """The mock answers every request with `text` (then EOS, unless eos=False). -> the answer's token count."""
    ids = tok.fast.encode(text, add_special_tokens=False).ids
    eos_id = tok.fast.token_to_id(EOS)
    backend.output_token_ids = (*ids, eos_id) if eos else tuple(ids)
    backend.eos_token_ids = frozenset({eos_id})
    return len(ids)


def wide(tok: GatewayTokenizer) -> GatewayTokenizer:
    """The tiny tokenizer with room for a tools prompt: the tiny model's 512 positions hold little more than it
    (the mock backend does not care how long a prompt is)."""
    return GatewayTokenizer(tok.hf, context_length=4096)


def openai_client(app: GatewayApp) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway", timeout=10.0)
    return openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="unused", http_client=http, max_retries=0)


@dataclass
class Streamed:
    """A streamed answer put back together as a client would: text fields concatenated, calls by index."""

    content: str = ""
    reasoning: str = ""
    content_pieces: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    finish_reason: str | None = None


async def stream_chat(client: openai.AsyncOpenAI, **kw: Any) -> Streamed:
    out = Streamed()
    async for chunk in await client.chat.completions.create(model="tiny", stream=True, **kw):
        for choice in chunk.choices:
            d = choice.delta
            if d.content:
                out.content += d.content
                out.content_pieces.append(d.content)
            out.reasoning += getattr(d, "reasoning_content", None) or ""
            for tc in d.tool_calls or ():
                call = out.calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = tc.id or call["id"]
                if tc.function is not None:
                    call["name"] += tc.function.name or ""
                    call["arguments"] += tc.function.arguments or ""
            out.finish_reason = choice.finish_reason or out.finish_reason
    return out
