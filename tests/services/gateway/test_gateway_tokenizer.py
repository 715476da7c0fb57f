"""Prompt tokenization: the model's chat template (or a file overriding it), token texts and bytes, context length.
The reference for every prompt is transformers' own `apply_chat_template(tokenize=True)`."""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path

import pytest

from services.gateway.text.tokenizer import RESERVED_TEMPLATE_KWARGS, ChatTemplateError, GatewayTokenizer

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Grüße! 2+2=?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "and 3+3?"},
]


def test_chat_prompt_matches_transformers(tiny_tokenizer: GatewayTokenizer) -> None:
    want = tiny_tokenizer.hf.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tiny_tokenizer.encode_chat(MESSAGES) == list(want)
    assert tiny_tokenizer.render_chat(MESSAGES).endswith("<|im_start|>assistant\n")


def test_reserved_template_kwargs_cover_every_argument_on_the_way_to_the_template(
    tiny_tokenizer: GatewayTokenizer,
) -> None:
    """A transformers release that adds an argument to apply_chat_template (or its renderer) fails here, rather
    than letting a client's chat_template_kwargs set it."""
    from transformers.utils.chat_template_utils import render_jinja_template

    named = {
        name
        for fn in (type(tiny_tokenizer.hf).apply_chat_template, render_jinja_template)
        for name, p in inspect.signature(fn).parameters.items()
        if p.kind is not inspect.Parameter.VAR_KEYWORD
    }
    # ...plus what render_jinja_template hands the compiled template itself: template.render(messages=...,
    # tools=..., documents=..., add_generation_prompt=..., **kwargs).
    named |= {"messages", "tools", "documents", "add_generation_prompt"}
    assert named <= RESERVED_TEMPLATE_KWARGS.keys(), sorted(named - RESERVED_TEMPLATE_KWARGS.keys())


@pytest.mark.parametrize("key", sorted(RESERVED_TEMPLATE_KWARGS))
def test_a_reserved_template_kwarg_never_escapes_as_a_type_error(tiny_tokenizer: GatewayTokenizer, key: str) -> None:
    """The kwargs travel as one mapping, so a name that slips past the request checks is at worst a template error
    (a 400), never `encode_chat() got multiple values for argument 'messages'` (a 500)."""
    try:
        tiny_tokenizer.encode_chat(MESSAGES, {key: True})
    except ChatTemplateError:
        pass


def test_chat_template_file_overrides_the_model_template(tiny_llama_dir: Path, tmp_path: Path) -> None:
    template = tmp_path / "plain.jinja"
    template.write_text(
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    tok = GatewayTokenizer.from_dir(tiny_llama_dir, chat_template_file=template)
    assert tok.render_chat(MESSAGES[:2]) == "[system] You are terse.\n[user] Grüße! 2+2=?\n[assistant] "


def test_model_without_a_template_is_a_client_error(tiny_llama_dir: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(tiny_llama_dir, bare, ignore=shutil.ignore_patterns("chat_template.jinja", "*.safetensors"))
    tok = GatewayTokenizer.from_dir(bare)
    with pytest.raises(ChatTemplateError, match="no chat template.*--chat-template"):
        tok.render_chat(MESSAGES)


def test_template_raising_is_a_client_error(tiny_llama_dir: Path, tmp_path: Path) -> None:
    raising = tmp_path / "strict.jinja"
    raising.write_text(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be user') }}"
        "{% endif %}{{ messages[0]['content'] }}"
    )
    tok = GatewayTokenizer.from_dir(tiny_llama_dir, chat_template_file=raising)
    with pytest.raises(ChatTemplateError, match="first message must be user"):
        tok.render_chat(MESSAGES)
    assert tok.render_chat(MESSAGES[1:]) == "Grüße! 2+2=?"


def test_unreadable_template_file_names_the_flag(tiny_llama_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--chat-template"):
        GatewayTokenizer.from_dir(tiny_llama_dir, chat_template_file=tmp_path / "missing.jinja")


def test_missing_directory_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--tokenizer"):
        GatewayTokenizer.from_dir(tmp_path / "nope")


def test_context_length_from_config_or_override(tiny_llama_dir: Path, tiny_tokenizer: GatewayTokenizer) -> None:
    assert tiny_tokenizer.context_length == 512  # max_position_embeddings of the tiny checkpoint
    assert GatewayTokenizer.from_dir(tiny_llama_dir, context_length=128).context_length == 128


def test_token_bytes_concatenate_to_the_text(tiny_tokenizer: GatewayTokenizer) -> None:
    text = "Ünïcödé 🙂 中文 text"
    ids = tiny_tokenizer.encode_text(text, add_special_tokens=False)
    assert b"".join(tiny_tokenizer.token_bytes(i) for i in ids) == text.encode()
    for i in ids:  # a token that is whole characters reads the same as text and as bytes
        raw = tiny_tokenizer.token_bytes(i)
        try:
            assert tiny_tokenizer.token_text(i) == raw.decode()
        except UnicodeDecodeError:  # part of a character: its text shows the replacement character
            assert "\ufffd" in tiny_tokenizer.token_text(i)


@pytest.mark.slow
def test_bundled_model_chat_prompt_matches_transformers(bundled_model_dir: Path) -> None:
    tok = GatewayTokenizer.from_dir(bundled_model_dir)
    want = tok.hf.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tok.encode_chat(MESSAGES) == list(want)
    assert tok.context_length == 8192 and tok.eos_token_ids == (tok.hf.convert_tokens_to_ids("<|im_end|>"),)
    # SmolLM2's byte-level vocabulary splits this emoji's bytes over tokens; bytes still reassemble exactly.
    ids = tok.encode_text("Paris 🙂 中", add_special_tokens=False)
    assert b"".join(tok.token_bytes(i) for i in ids) == "Paris 🙂 中".encode()
