"""The configuration of LLaVA-style vision-language models, read from config.json without torch (the gateway
needs the image token and the number of positions per image; the engine builds the models from it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_VISION_ACTS = ("quick_gelu", "gelu", "gelu_pytorch_tanh")


@dataclass(frozen=True)
class VisionConfig:
    """What a ViT tower needs from config.json's vision_config."""

    kind: str  # "clip" | "siglip"
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    num_channels: int
    layer_norm_eps: float
    hidden_act: str

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


def parse_vision_config(cfg: dict[str, Any], source: str) -> VisionConfig:
    kinds = {"clip_vision_model": "clip", "siglip_vision_model": "siglip"}
    kind = kinds.get(cfg.get("model_type", "clip_vision_model"))
    if kind is None:
        raise ValueError(
            f"{source}: vision tower {cfg.get('model_type')!r} is not supported; supported: {', '.join(kinds)}"
        )
    act = cfg.get("hidden_act", "quick_gelu" if kind == "clip" else "gelu_pytorch_tanh")
    if act not in SUPPORTED_VISION_ACTS:
        raise ValueError(
            f"{source}: vision hidden_act {act!r} is not supported; supported: {', '.join(SUPPORTED_VISION_ACTS)}"
        )
    hidden, heads = int(cfg.get("hidden_size", 768)), int(cfg.get("num_attention_heads", 12))
    if hidden % heads:
        raise ValueError(f"{source}: vision hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    return VisionConfig(
        kind=kind,
        hidden_size=hidden,
        intermediate_size=int(cfg.get("intermediate_size", 3072)),
        num_layers=int(cfg.get("num_hidden_layers", 12)),
        num_heads=heads,
        image_size=int(cfg.get("image_size", 224)),
        patch_size=int(cfg.get("patch_size", 16)),
        num_channels=int(cfg.get("num_channels", 3)),
        layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-5 if kind == "clip" else 1e-6)),
        hidden_act=act,
    )


LLAVA_ARCHITECTURES = ("LlavaForConditionalGeneration",)
SUPPORTED_PROJECTOR_ACTS = ("gelu", "quick_gelu", "gelu_pytorch_tanh")


@dataclass(frozen=True)
class LlavaConfig:
    """The vision side of a LLaVA checkpoint (the text side is a ModelArchConfig)."""

    vision: VisionConfig
    text_hidden_size: int
    image_token_id: int
    feature_layer: int  # index into the tower's hidden states (negative: from the end, as transformers)
    select_strategy: str  # "default": drop the class token; "full": keep every position
    projector_act: str
    projector_bias: bool

    @property
    def feature_index(self) -> int:
        """feature_layer as a non-negative index into hidden states 0..num_layers."""
        n = self.vision.num_layers + 1
        return self.feature_layer % n

    @property
    def num_image_tokens(self) -> int:
        """Placeholder tokens per image: one per patch (plus the class token for CLIP with 'full')."""
        return self.vision.num_patches + int(self.vision.kind == "clip" and self.select_strategy == "full")


def is_llava(cfg: dict[str, Any]) -> bool:
    return cfg.get("model_type") == "llava" or any(a in LLAVA_ARCHITECTURES for a in cfg.get("architectures") or ())


def parse_llava_config(cfg: dict[str, Any], source: str) -> LlavaConfig:
    """config.json of a LLaVA checkpoint -> LlavaConfig. Raises ValueError naming what is unsupported."""
    vision = parse_vision_config(dict(cfg.get("vision_config") or {}), source)
    layer = cfg.get("vision_feature_layer", -2)
    if not isinstance(layer, int):
        raise ValueError(f"{source}: vision_feature_layer {layer!r} (several layers) is not supported; use one layer")
    if not -(vision.num_layers + 1) <= layer <= vision.num_layers:
        raise ValueError(f"{source}: vision_feature_layer {layer} is outside the tower's {vision.num_layers} layers")
    strategy = cfg.get("vision_feature_select_strategy", "default")
    if strategy not in ("default", "full"):
        raise ValueError(f"{source}: vision_feature_select_strategy {strategy!r} is not 'default' or 'full'")
    act = cfg.get("projector_hidden_act", "gelu")
    if act not in SUPPORTED_PROJECTOR_ACTS:
        raise ValueError(
            f"{source}: projector_hidden_act {act!r} is not supported; supported: {', '.join(SUPPORTED_PROJECTOR_ACTS)}"
        )
    text = cfg.get("text_config") or {}
    token = cfg.get("image_token_index", cfg.get("image_token_id", 32000))
    return LlavaConfig(
        vision=vision,
        text_hidden_size=int(text.get("hidden_size", 4096)),
        image_token_id=int(token),
        feature_layer=layer,
        select_strategy=strategy,
        projector_act=act,
        projector_bias=bool(cfg.get("multimodal_projector_bias", True)),
    )


def load_llava_config(model_dir: str | Path) -> LlavaConfig | None:
    """The vision side of <model_dir>/config.json, or None for a text-only model."""
    path = Path(model_dir) / "config.json"
    cfg = json.loads(path.read_text()) if path.is_file() else {}
    return parse_llava_config(cfg, str(path)) if is_llava(cfg) else None
