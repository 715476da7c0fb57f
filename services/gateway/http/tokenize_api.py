"""/tokenize and /detokenize, as vLLM serves them (same request and response fields)."""

from __future__ import annotations

from typing import Any

import msgspec

from services.gateway.openai.errors import bad_request
from services.gateway.text.tokenizer import ChatTemplateError, GatewayTokenizer


class TokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = None  # default: true for a prompt, false for messages (the template adds them)
    return_token_strs: bool = False


class TokenizeResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    count: int
    max_model_len: int | None
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(msgspec.Struct):
    prompt: str


def tokenize(tok: GatewayTokenizer, req: TokenizeRequest) -> TokenizeResponse:
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("send exactly one of prompt or messages", "prompt")
    if req.prompt is not None:
        ids = tok.encode_text(req.prompt, add_special_tokens=req.add_special_tokens is not False)
    else:
        try:
            text = tok.render_chat(req.messages or [])  # ends with the assistant generation prompt
        except ChatTemplateError as e:
            raise bad_request(str(e), "messages", "chat_template_error") from None
        except TypeError as e:
            raise bad_request(f"messages: {e}", "messages") from None
        ids = tok.encode_text(text, add_special_tokens=bool(req.add_special_tokens))
    strs = [tok.token_text(t) for t in ids] if req.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=tok.context_length, tokens=list(ids), token_strs=strs)


def detokenize(tok: GatewayTokenizer, req: DetokenizeRequest) -> DetokenizeResponse:
    for t in req.tokens:
        if not 0 <= t < tok.vocab_size:
            raise bad_request(f"tokens: token id {t} is not in [0, {tok.vocab_size})", "tokens")
    return DetokenizeResponse(tok.decode(req.tokens, skip_special_tokens=False))
