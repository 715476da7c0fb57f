"""Tiny random-weight LLaVA checkpoints (transformers' own LlavaForConditionalGeneration) with a freshly trained
tokenizer that knows `<image>`, a preprocessor_config.json, and images made with Pillow.

Two variants, both with odd head counts: "clip-llama" (CLIP ViT, 3 heads, feature layer -2, class token dropped,
into a Llama decoder with 5 heads / 5 KV heads) and "siglip-qwen2" (SigLIP ViT, 5 heads, last layer, every
patch, into a Qwen2 decoder with 3 heads / 1 KV head, q/k/v biases). Built in about a second each.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.tiny_models import _CORPUS, CHATML_TEMPLATE, SPECIAL_TOKENS

IMAGE_TOKEN = "<image>"
VARIANTS = ("clip-llama", "siglip-qwen2")


def _tokenizer(vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[*SPECIAL_TOKENS, IMAGE_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return tok


def make_tiny_llava(tmp_dir: str | Path, variant: str = "clip-llama", *, seed: int = 0, vocab: int = 512) -> Path:
    """A random LLaVA checkpoint in tmp_dir/llava-<variant>-<seed> (variant "bench": a larger one for timing)."""
    import torch
    import transformers as tf

    out = Path(tmp_dir) / f"llava-{variant}-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(vocab)
    eos, bos, image_id = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>"), tok.token_to_id(IMAGE_TOKEN)
    text_common = dict(
        vocab_size=vocab,
        num_hidden_layers=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        bos_token_id=bos,
        eos_token_id=eos,
    )
    if variant == "clip-llama":
        vision = tf.CLIPVisionConfig(
            hidden_size=48,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=3,
            image_size=32,
            patch_size=8,
            projection_dim=32,
        )
        text = tf.LlamaConfig(
            hidden_size=60, intermediate_size=128, num_attention_heads=5, num_key_value_heads=5, **text_common
        )
        extra = dict(vision_feature_layer=-2, vision_feature_select_strategy="default", image_seq_length=16)
        proc = tf.CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    elif variant == "siglip-qwen2":
        vision = tf.SiglipVisionConfig(
            hidden_size=40,
            intermediate_size=72,
            num_hidden_layers=2,
            num_attention_heads=5,
            image_size=30,
            patch_size=6,
        )
        text = tf.Qwen2Config(
            hidden_size=48,
            intermediate_size=112,
            num_attention_heads=3,
            num_key_value_heads=1,
            rope_theta=1000000.0,
            **text_common,
        )
        extra = dict(vision_feature_layer=-1, vision_feature_select_strategy="full", image_seq_length=25)
        proc = tf.SiglipImageProcessorPil(size={"height": 30, "width": 30})
    elif variant == "bench":  # ViT-S/16-sized tower at 224 px (196 image tokens) over a small Llama: benchmarks
        vision = tf.CLIPVisionConfig(
            hidden_size=384,
            intermediate_size=1536,
            num_hidden_layers=12,
            num_attention_heads=6,
            image_size=224,
            patch_size=16,
            projection_dim=256,
        )
        text = tf.LlamaConfig(
            hidden_size=512,
            intermediate_size=1408,
            num_attention_heads=8,
            num_key_value_heads=4,
            **{**text_common, "num_hidden_layers": 8, "max_position_embeddings": 4096},
        )
        extra = {"vision_feature_layer": -2, "vision_feature_select_strategy": "default", "image_seq_length": 196}
        proc = tf.CLIPImageProcessorPil(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224})
    else:
        raise ValueError(f"variant {variant!r} is not one of {VARIANTS} or 'bench'")
    cfg = tf.LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_id, **extra)
    torch.manual_seed(seed)
    model = tf.LlavaForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.08)
    model.save_pretrained(out, safe_serialization=True)
    proc.save_pretrained(out)
    fast = tf.PreTrainedTokenizerFast(
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


def make_image(seed: int, size: tuple[int, int] = (45, 37), fmt: str = "PNG") -> bytes:
    """A noisy gradient image (width, height) encoded as PNG / JPEG / WEBP bytes."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 // max(w - 1, 1), yy * 255 // max(h - 1, 1), (xx + yy) * 127 // max(w + h - 2, 1)], -1)
    noisy = np.clip(base + rng.integers(-40, 40, size=(h, w, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noisy, "RGB").save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture(scope="session", params=VARIANTS)
def tiny_llava_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each LLaVA variant in turn."""
    return make_tiny_llava(tmp_path_factory.mktemp("tiny-vlm"), request.param)


@pytest.fixture(scope="session")
def tiny_llava_clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llava(tmp_path_factory.mktemp("tiny-vlm"), "clip-llama")
