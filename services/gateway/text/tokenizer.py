"""Prompt tokenization for the gateway: HF tokenizer in-process, the model's chat template, token texts/bytes.

The chat template is rendered by transformers (its compiled Jinja template is cached, ~25 us). Text is encoded
by `fast_encode.ByteLevelEncoder` when the tokenizer is a byte-level BPE it reproduces exactly (cached per word:
~5-10x cheaper than `Tokenizer.encode` once warm), else by the Rust `tokenizers.Tokenizer` directly (about half
the cost of going through the HF wrapper).
Templates put their own special tokens (BOS, role markers) into the text, so chat prompts are encoded with
add_special_tokens=False, as `apply_chat_template(tokenize=True)` does.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from services.gateway.text.fast_encode import ByteLevelEncoder, adds_special_tokens

# Keys of config.json that hold the context length, by model family (first found wins).
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "max_seq_len")
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")

_APPLY_ARG = "an argument of transformers' apply_chat_template, not a template variable"
# Names a client's chat_template_kwargs may not use, each with what sets it instead: every name the gateway or
# transformers passes itself on the way to the template (render_chat -> apply_chat_template(self, conversation, ...)
# -> render_jinja_template(conversations, ...) -> template.render(messages, tools, documents, add_generation_prompt)).
# Any of them in the kwargs would collide with that argument or quietly change how the prompt is built.
RESERVED_TEMPLATE_KWARGS: Mapping[str, str] = MappingProxyType(
    {
        "messages": "the request's messages",
        "conversation": "the request's messages (apply_chat_template's name for them)",
        "conversations": "the request's messages (render_jinja_template's name for them)",
        "tools": "the request's tools field",
        "chat_template": "the served model's template (--chat-template)",
        "add_generation_prompt": "always true: the prompt ends with the assistant's turn",
        "continue_final_message": "always false: the prompt ends with a new assistant turn",
        "tokenize": "always false: the gateway tokenizes the rendered text itself",
        "documents": _APPLY_ARG,
        "self": _APPLY_ARG,
        "sanitize_control_tokens": _APPLY_ARG,
        "padding": _APPLY_ARG,
        "truncation": _APPLY_ARG,
        "max_length": _APPLY_ARG,
        "return_tensors": _APPLY_ARG,
        "return_dict": _APPLY_ARG,
        "return_assistant_tokens_mask": _APPLY_ARG,
        "tokenizer_kwargs": _APPLY_ARG,
    }
)


class ChatTemplateError(ValueError):
    """The conversation cannot be rendered with the model's chat template (the client's messages or the
    template are at fault; never a server error)."""


def _byte_level_table() -> dict[str, int]:
    """GPT-2 byte-level BPE alphabet: the printable character that stands for each byte, inverted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _context_length_of(model_dir: Path) -> int | None:
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for source in (config, config.get("text_config") or {}):
        for key in _CONTEXT_KEYS:
            value = source.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None


class GatewayTokenizer:
    """Tokenizer of one served model. Thread-compatible; all methods are synchronous and fast."""

    def __init__(self, hf_tokenizer: Any, *, context_length: int | None, chat_template: str | None = None) -> None:
        self.hf = hf_tokenizer
        self.fast = hf_tokenizer.backend_tokenizer  # tokenizers.Tokenizer (Rust)
        self.context_length = context_length
        self.chat_template = chat_template  # None: the model's own
        self.vocab_size = int(self.fast.get_vocab_size(with_added_tokens=True))
        eos = hf_tokenizer.eos_token_id
        self.eos_token_ids: tuple[int, ...] = (eos,) if isinstance(eos, int) else ()
        decoder = self.fast.decoder
        self._byte_level = decoder is not None and type(decoder).__name__ == "ByteLevel"
        self._byte_table = _byte_level_table() if self._byte_level else {}
        self._text_cache: dict[int, str] = {}
        self._encoder = ByteLevelEncoder.of(self.fast)  # None: not a pipeline it reproduces; use the Rust one
        self._post_adds = adds_special_tokens(self.fast)  # BOS/EOS on plain text: the Rust path adds them
        self._bytes_cache: dict[int, bytes] = {}

    @classmethod
    def from_dir(
        cls,
        model_dir: str | os.PathLike[str],
        *,
        tokenizer_dir: str | os.PathLike[str] | None = None,
        chat_template_file: str | os.PathLike[str] | None = None,
        context_length: int | None = None,
    ) -> GatewayTokenizer:
        """Load offline from a local model directory (tokenizer.json + chat template)."""
        from transformers import AutoTokenizer  # heavy import, only when a tokenizer is really needed

        source = Path(tokenizer_dir or model_dir)
        if not source.is_dir():
            raise ValueError(f"tokenizer directory {str(source)!r} does not exist; pass --tokenizer DIR or --model DIR")
        hf = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
        if getattr(hf, "backend_tokenizer", None) is None:
            raise ValueError(f"tokenizer in {str(source)!r} has no fast (tokenizer.json) form; convert it first")
        template = None
        if chat_template_file is not None:
            try:
                template = Path(chat_template_file).read_text()
            except OSError as e:
                raise ValueError(
                    f"--chat-template {str(chat_template_file)!r} cannot be read ({e}); pass a readable Jinja file"
                ) from e
        if context_length is None:
            context_length = _context_length_of(Path(model_dir))
        return cls(hf, context_length=context_length, chat_template=template)

    # ------------------------------------------------------------ prompts

    def render_chat(
        self, messages: Sequence[Mapping[str, Any]], template_kwargs: Mapping[str, Any] | None = None
    ) -> str:
        """The templated conversation, ending with the assistant generation prompt. template_kwargs: extra
        variables for the template (the request's chat_template_kwargs, checked against RESERVED_TEMPLATE_KWARGS
        where they enter; one that still collides is a ChatTemplateError)."""
        if self.chat_template is None and not getattr(self.hf, "chat_template", None):
            raise ChatTemplateError(
                "this model has no chat template; start the gateway with --chat-template FILE "
                "or send the prompt as text to /v1/completions"
            )
        try:
            text = self.hf.apply_chat_template(
                list(messages),
                chat_template=self.chat_template,
                add_generation_prompt=True,
                tokenize=False,
                **(template_kwargs or {}),
            )
        except Exception as e:  # jinja2 TemplateError, raise_exception() in the template, TypeError on odd input
            raise ChatTemplateError(f"the chat template rejected the messages: {e}") from e
        assert isinstance(text, str), type(text)
        return text

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], template_kwargs: Mapping[str, Any] | None = None
    ) -> list[int]:
        text = self.render_chat(messages, template_kwargs)
        if self._encoder is not None:
            return self._encoder.encode(text)
        return self.fast.encode(text, add_special_tokens=False).ids

    def encode_text(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if self._encoder is not None and not (add_special_tokens and self._post_adds):
            return self._encoder.encode(text)
        return self.fast.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.fast.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------ per-token views (logprobs)

    def token_text(self, token_id: int) -> str:
        """The token on its own, as text (may contain U+FFFD for a token that is part of a character)."""
        text = self._text_cache.get(token_id)
        if text is None:
            text = self.fast.decode([token_id], skip_special_tokens=False)
            self._text_cache[token_id] = text
        return text

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes the token contributes (OpenAI's `bytes` field): partial characters stay exact."""
        raw = self._bytes_cache.get(token_id)
        if raw is None:
            raw = self._exact_bytes(token_id)
            self._bytes_cache[token_id] = raw
        return raw

    def _exact_bytes(self, token_id: int) -> bytes:
        piece = self.fast.id_to_token(token_id)
        if piece is not None:
            if self._byte_level and all(c in self._byte_table for c in piece):
                return bytes(self._byte_table[c] for c in piece)
            m = _BYTE_FALLBACK.match(piece)
            if m:  # SentencePiece byte fallback: <0xE4>
                return bytes([int(m.group(1), 16)])
        return self.token_text(token_id).encode("utf-8")
