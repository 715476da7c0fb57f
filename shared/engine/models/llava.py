"""LLaVA-style vision-language models: a CLIP or SigLIP vision tower, the two-layer multimodal projector, and our
Llama / Qwen2 decoder (llama.py) for the text.

The vision half (`LlavaVisionEncoder`: tower + projector) turns pixel values into one embedding per image
placeholder token; the decoder takes those embeddings in place of the placeholder tokens' own embeddings
(ForwardBatch.embed_rows / embed_values). The two halves can live in different processes: the encoder service
runs the first, prefill the second.

Checkpoints name tensors several ways (transformers 5 saves `language_model.model.*` / `vision_tower.*`; older
exports use `model.language_model.*`, `vision_tower.vision_model.*`, a top-level `lm_head`): `canonical_name` maps
them all to one spelling before the strict loader runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shared.engine.models.config import ModelArchConfig
from shared.engine.models.llama import LlamaForCausalLM, WeightSlot
from shared.engine.models.vit import VisionTower, activation, param
from shared.modelspec.vlm_config import LlavaConfig, load_llava_config

__all__ = [
    "LlavaConfig",
    "LlavaVisionEncoder",
    "LlavaWeights",
    "canonical_name",
    "expand_image_tokens",
    "load_llava_config",
]


def canonical_name(name: str) -> str:
    """One spelling for every LLaVA checkpoint layout (see the module docstring)."""
    for old, new in (
        ("model.language_model.", "language_model.model."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
        ("vision_tower.vision_model.", "vision_tower."),
    ):
        if name.startswith(old):
            name = new + name[len(old) :]
    if name == "lm_head.weight":
        name = "language_model.lm_head.weight"
    return name


class LlavaVisionEncoder(nn.Module):
    """Vision tower + projector: pixel values [B, 3, H, W] -> image embeddings [B, num_image_tokens, text_hidden]."""

    def __init__(self, cfg: LlavaConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg = cfg
        self.dtype = dtype
        v, t = cfg.vision.hidden_size, cfg.text_hidden_size
        self.tower = VisionTower(cfg.vision, dtype, num_layers=cfg.feature_index)
        self.proj1_weight, self.proj2_weight = param(t, v, dtype=dtype), param(t, t, dtype=dtype)
        self.proj1_bias = param(t, dtype=dtype) if cfg.projector_bias else None
        self.proj2_bias = param(t, dtype=dtype) if cfg.projector_bias else None

    @property
    def num_image_tokens(self) -> int:
        return self.cfg.num_image_tokens

    def weight_map(self, me: str = "") -> dict[str, WeightSlot]:
        m = self.tower.weight_map("vision_tower.", f"{me}tower.")
        m["multi_modal_projector.linear_1.weight"] = WeightSlot(f"{me}proj1_weight")
        m["multi_modal_projector.linear_2.weight"] = WeightSlot(f"{me}proj2_weight")
        if self.cfg.projector_bias:
            m["multi_modal_projector.linear_1.bias"] = WeightSlot(f"{me}proj1_bias")
            m["multi_modal_projector.linear_2.bias"] = WeightSlot(f"{me}proj2_bias")
        return m

    def unused_prefixes(self) -> tuple[str, ...]:
        return self.tower.unused_prefixes("vision_tower.")

    @torch.inference_mode()
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        states = self.tower(pixel_values)
        feats = states[self.cfg.feature_index]
        if self.cfg.select_strategy == "default":
            feats = feats[:, 1:]
        h = activation(self.cfg.projector_act, F.linear(feats, self.proj1_weight, self.proj1_bias))
        return F.linear(h, self.proj2_weight, self.proj2_bias)


class LlavaWeights(nn.Module):
    """The halves a process needs under one module, so one strict load fills them from one checkpoint: prefill and
    the colocated worker build both, the encoder service only the vision half (language_model=None)."""

    def __init__(self, language_model: LlamaForCausalLM | None, vision: LlavaVisionEncoder | None) -> None:
        super().__init__()
        self.language_model = language_model
        self.vision = vision

    def hf_weight_map(self) -> dict[str, WeightSlot]:
        m: dict[str, WeightSlot] = {}
        if self.language_model is not None:
            m.update(
                {
                    f"language_model.{k}": WeightSlot(f"language_model.{s.param}", s.start, s.end, s.broadcast)
                    for k, s in self.language_model.hf_weight_map().items()
                }
            )
        if self.vision is not None:
            m.update(self.vision.weight_map("vision."))
        return m

    def skipped_prefixes(self, arch: ModelArchConfig) -> tuple[str, ...]:
        """Checkpoint names (prefixes) this load leaves out: a half not built, the tower parts LLaVA never runs,
        a tied lm_head."""
        out: list[str] = []
        if self.vision is not None:
            out.extend(self.vision.unused_prefixes())
        else:
            out.extend(("vision_tower.", "multi_modal_projector."))
        if self.language_model is None:
            out.append("language_model.")
        elif arch.tie_word_embeddings:
            out.append("language_model.lm_head.weight")
        return tuple(out)


def expand_image_tokens(token_ids: list[int], image_token_id: int, num_image_tokens: int) -> list[int]:
    """Each image placeholder token -> num_image_tokens of them (what LlavaProcessor does to `<image>`)."""
    out: list[int] = []
    for t in token_ids:
        if t == image_token_id:
            out.extend([image_token_id] * num_image_tokens)
        else:
            out.append(t)
    return out
