"""Tiny random-weight Hugging Face checkpoints (Llama, Qwen2, Qwen3) with a real, freshly trained tokenizer.

`make_tiny_model(dir, "llama")` writes config.json + model.safetensors (transformers' own *ForCausalLM with random
weights) + tokenizer.json/tokenizer_config.json (a byte-level BPE trained on the spot, ChatML template, eos
<|im_end|>) + generation_config.json, all offline, in well under 2 s. Session fixtures below build each one once;
test modules import them (`from tests.helpers.tiny_models import tiny_llama_dir`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_CORPUS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "A paged KV cache stores keys and values in fixed-size pages.",
    "Prefill computes the prompt; decode produces one token at a time.",
    "def add(a, b):\n    return a + b\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Punctuation: , . ; : ! ? ( ) [ ] { }",
    "user assistant system: hello, how are you today? I am fine, thank you.",
    "Ünïcödé, emoji 🙂 and 中文 text still encode byte by byte.",
]
ARCHS = ("llama", "qwen2", "qwen3")


def train_tokenizer(vocab_size: int = 512):  # -> tokenizers.Tokenizer
    """A byte-level BPE (like GPT-2/Qwen/SmolLM2) trained on a few lines; ids 0..2 are the special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return tok


def _hf_config(
    arch: str, *, layers: int, hidden: int, heads: int, kv_heads: int, vocab: int, eos: int, bos: int, tie: bool
):
    import transformers

    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden + 32,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        bos_token_id=bos,
        eos_token_id=eos,
        tie_word_embeddings=tie,
    )
    if arch == "llama":
        return transformers.LlamaConfig(**common, rope_theta=10000.0), transformers.LlamaForCausalLM
    if arch == "qwen2":
        return transformers.Qwen2Config(**common, rope_theta=1000000.0), transformers.Qwen2ForCausalLM
    if arch == "qwen3":
        return (
            transformers.Qwen3Config(**common, head_dim=2 * hidden // heads, rope_theta=1000000.0),
            transformers.Qwen3ForCausalLM,
        )
    return _family_config(arch, common, hidden, heads)


WINDOW = 6  # the sliding window of the windowed families: shorter than the parity tests' prompts, not page-aligned
# Families beyond ARCHS (tests/shared/engine/test_model_families.py), each with a sliding window of WINDOW tokens
FAMILIES = ("mistral", "qwen2-swa", "phi3", "gemma2", "gemma3")


def _family_config(arch: str, common: dict, hidden: int, heads: int):
    """Mistral, Qwen2 with use_sliding_window, Phi-3 (partial RoPE), Gemma 2 (soft-capping small enough to bite on
    random weights) and Gemma 3 (local/global RoPE, q/k norm, linear RoPE scaling on global layers)."""
    import transformers

    if arch == "mistral":
        return (
            transformers.MistralConfig(**common, head_dim=2 * hidden // heads, sliding_window=WINDOW),
            transformers.MistralForCausalLM,
        )
    if arch == "qwen2-swa":  # layer 0 full, layer 1 windowed (max_window_layers)
        cfg = transformers.Qwen2Config(**common, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
        return cfg, transformers.Qwen2ForCausalLM
    if arch == "phi3":
        rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
        cfg = transformers.Phi3Config(**common, rope_parameters=rope, sliding_window=WINDOW, pad_token_id=0)
        return cfg, transformers.Phi3ForCausalLM
    if arch in MOE_FAMILIES:
        return _moe_config(arch, common, hidden)
    gemma = dict(common, head_dim=16, query_pre_attn_scalar=24, sliding_window=WINDOW, pad_token_id=0)
    if arch == "gemma2":
        cfg = transformers.Gemma2Config(**gemma, attn_logit_softcapping=2.0, final_logit_softcapping=3.0)
        return cfg, transformers.Gemma2ForCausalLM
    if arch == "gemma3":
        rope = {
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        }
        types = ["sliding_attention", "full_attention"] * (common["num_hidden_layers"] // 2)
        cfg = transformers.Gemma3TextConfig(**gemma, rope_parameters=rope, layer_types=types)
        return cfg, transformers.Gemma3ForCausalLM
    raise ValueError(f"arch {arch!r} is not one of {ARCHS + FAMILIES + MOE_FAMILIES}")


# Mixture-of-experts families (tests/shared/engine/test_moe_families.py): 8 experts, top-2, an expert size that is
# not a multiple of 8 (the grouped GEMM's padding); Qwen3-MoE with its last layer dense (mlp_only_layers) and
# norm_topk_prob off, Mixtral (which always renormalises) with the sliding window, gpt-oss with its default yarn RoPE,
# alternating windowed layers, attention sinks, biases everywhere and a SwiGLU clamp small enough to bite
MOE_FAMILIES = ("qwen3_moe", "mixtral", "gpt_oss")


def _moe_config(arch: str, common: dict, hidden: int):
    import transformers

    experts = dict(num_experts_per_tok=2, rope_theta=10000.0)
    if arch == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(
            **dict(common, intermediate_size=hidden + 8),
            **experts,
            num_experts=8,
            moe_intermediate_size=hidden // 2 + 2,
            norm_topk_prob=False,
            mlp_only_layers=[common["num_hidden_layers"] - 1],
            head_dim=2 * hidden // common["num_attention_heads"],
        )
        return cfg, transformers.Qwen3MoeForCausalLM
    if arch == "gpt_oss":
        cfg = transformers.GptOssConfig(
            **dict(common, intermediate_size=hidden // 2 + 2),
            num_local_experts=8,
            num_experts_per_tok=2,
            sliding_window=WINDOW,
            head_dim=2 * hidden // common["num_attention_heads"],
            swiglu_limit=0.5,
            # gpt-oss's yarn, its original context shrunk so that 32 x it is the tiny model's max_position_embeddings
            rope_parameters={
                "rope_type": "yarn",
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": common["max_position_embeddings"] // 32,
                "rope_theta": 150000.0,
            },
        )
        return cfg, transformers.GptOssForCausalLM
    cfg = transformers.MixtralConfig(
        **dict(common, intermediate_size=hidden // 2 + 2), **experts, num_local_experts=8, sliding_window=WINDOW
    )
    return cfg, transformers.MixtralForCausalLM


def make_tiny_model(
    tmp_dir: str | Path,
    arch: str = "llama",
    *,
    seed: int = 0,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 512,
    tie_word_embeddings: bool | None = None,
) -> Path:
    """Write a random-weight checkpoint of `arch` into tmp_dir/<arch>-<seed> and return that directory.

    Qwen3 gets head_dim = 2 * hidden / heads (its head_dim is free, unlike Llama's) so that path is exercised.
    Weights are re-drawn with a larger std than HF's init so that logits differ clearly between tokens.
    """
    import torch
    from transformers import PreTrainedTokenizerFast

    out = Path(tmp_dir) / f"{arch}-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(vocab)
    if tok.get_vocab_size() > vocab:
        raise ValueError(f"the trained tokenizer has {tok.get_vocab_size()} tokens, more than vocab={vocab}")
    eos, bos = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    tie = arch in ("llama", "gemma2", "gemma3") if tie_word_embeddings is None else tie_word_embeddings
    cfg, cls = _hf_config(
        arch, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, vocab=vocab, eos=eos, bos=bos, tie=tie
    )
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))  # not all ones, so a wrong norm weight shows
            elif name.endswith("sinks"):
                p.normal_(0.0, 1.0)  # gpt-oss's sink logits: as large as the scores, so they take real mass
            else:
                p.normal_(0.0, 0.08)
    model.save_pretrained(out, safe_serialization=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(out)
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": eos}))
    return out


def _tiny(tmp_path_factory: pytest.TempPathFactory, arch: str) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-models"), arch)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory, "llama")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory, "qwen2")


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory, "qwen3")


@pytest.fixture(scope="session", params=ARCHS)
def tiny_model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each architecture in turn."""
    return _tiny(tmp_path_factory, request.param)
