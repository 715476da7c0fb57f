"""The transformer encoder CLIP and SigLIP vision towers share (pre-norm LayerNorm, bidirectional attention with
biases, a two-layer MLP), with q/k/v fused into one weight. Images of one batch are independent sequences of the
same length, so attention is plain SDPA over [B, heads, N, head_dim] without masks or a KV cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shared.engine.models.llama import WeightSlot
from shared.modelspec.vlm_config import VisionConfig


def activation(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "quick_gelu":
        return x * torch.sigmoid(1.702 * x)
    if name == "gelu_pytorch_tanh":
        return F.gelu(x, approximate="tanh")
    assert name == "gelu", name
    return F.gelu(x)


def param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    # Uninitialised on purpose: the strict loader fills every element or fails (weights.load_weights).
    return nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)


class VitLayer(nn.Module):
    def __init__(self, cfg: VisionConfig, layer_id: int, dtype: torch.dtype) -> None:
        super().__init__()
        c, i = cfg.hidden_size, cfg.intermediate_size
        self.layer_id, self.cfg = layer_id, cfg
        self.ln1_weight, self.ln1_bias = param(c, dtype=dtype), param(c, dtype=dtype)
        self.qkv_weight, self.qkv_bias = param(3 * c, c, dtype=dtype), param(3 * c, dtype=dtype)
        self.out_weight, self.out_bias = param(c, c, dtype=dtype), param(c, dtype=dtype)
        self.ln2_weight, self.ln2_bias = param(c, dtype=dtype), param(c, dtype=dtype)
        self.fc1_weight, self.fc1_bias = param(i, c, dtype=dtype), param(i, dtype=dtype)
        self.fc2_weight, self.fc2_bias = param(c, i, dtype=dtype), param(c, dtype=dtype)

    def weight_map(self, hf_prefix: str, me: str) -> dict[str, WeightSlot]:
        """HF names under `hf_prefix` (e.g. 'vision_tower.encoder.layers.0.') -> our slots under `me`."""
        c = self.cfg.hidden_size
        m: dict[str, WeightSlot] = {}
        for kind in ("weight", "bias"):
            m[f"{hf_prefix}layer_norm1.{kind}"] = WeightSlot(f"{me}ln1_{kind}")
            m[f"{hf_prefix}layer_norm2.{kind}"] = WeightSlot(f"{me}ln2_{kind}")
            for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
                m[f"{hf_prefix}self_attn.{name}.{kind}"] = WeightSlot(f"{me}qkv_{kind}", j * c, (j + 1) * c)
            m[f"{hf_prefix}self_attn.out_proj.{kind}"] = WeightSlot(f"{me}out_{kind}")
            m[f"{hf_prefix}mlp.fc1.{kind}"] = WeightSlot(f"{me}fc1_{kind}")
            m[f"{hf_prefix}mlp.fc2.{kind}"] = WeightSlot(f"{me}fc2_{kind}")
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, N, C] -> [B, N, C]."""
        cfg = self.cfg
        b, n, c = x.shape
        h = F.layer_norm(x, (c,), self.ln1_weight, self.ln1_bias, cfg.layer_norm_eps)
        qkv = F.linear(h, self.qkv_weight, self.qkv_bias).view(b, n, 3, cfg.num_heads, cfg.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, heads, N, head_dim]
        o = F.scaled_dot_product_attention(q, k, v, scale=cfg.head_dim**-0.5)
        x = x + F.linear(o.transpose(1, 2).reshape(b, n, c), self.out_weight, self.out_bias)
        h = F.layer_norm(x, (c,), self.ln2_weight, self.ln2_bias, cfg.layer_norm_eps)
        h = activation(cfg.hidden_act, F.linear(h, self.fc1_weight, self.fc1_bias))
        return x + F.linear(h, self.fc2_weight, self.fc2_bias)


class VisionTower(nn.Module):
    """Patch embedding (CLIP: + class token and pre-norm; SigLIP: conv bias), position embedding, encoder layers.

    forward returns the hidden states transformers calls `hidden_states[layer]`: index 0 is the embedding output,
    index i the output of layer i - 1; only the layers up to the deepest one asked for are run. The post-norm (and
    SigLIP's pooling head) are not part of any hidden state, so they are not built: LLaVA never reads them.
    """

    def __init__(self, cfg: VisionConfig, dtype: torch.dtype, num_layers: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        clip = cfg.kind == "clip"
        c, p = cfg.hidden_size, cfg.patch_size
        self.num_positions = cfg.num_patches + int(clip)
        self.patch_weight = param(c, cfg.num_channels, p, p, dtype=dtype)
        self.patch_bias = None if clip else param(c, dtype=dtype)
        self.class_embedding = param(c, dtype=dtype) if clip else None
        self.position_embedding = param(self.num_positions, c, dtype=dtype)
        self.pre_norm_weight = param(c, dtype=dtype) if clip else None
        self.pre_norm_bias = param(c, dtype=dtype) if clip else None
        n = cfg.num_layers if num_layers is None else num_layers
        self.layers = nn.ModuleList(VitLayer(cfg, i, dtype) for i in range(n))

    def weight_map(self, hf_prefix: str = "vision_tower.", me: str = "") -> dict[str, WeightSlot]:
        m = {
            f"{hf_prefix}embeddings.patch_embedding.weight": WeightSlot(f"{me}patch_weight"),
            f"{hf_prefix}embeddings.position_embedding.weight": WeightSlot(f"{me}position_embedding"),
        }
        if self.cfg.kind == "clip":
            m[f"{hf_prefix}embeddings.class_embedding"] = WeightSlot(f"{me}class_embedding")
            m[f"{hf_prefix}pre_layrnorm.weight"] = WeightSlot(f"{me}pre_norm_weight")
            m[f"{hf_prefix}pre_layrnorm.bias"] = WeightSlot(f"{me}pre_norm_bias")
        else:
            m[f"{hf_prefix}embeddings.patch_embedding.bias"] = WeightSlot(f"{me}patch_bias")
        for layer in self.layers:
            assert isinstance(layer, VitLayer)
            m.update(layer.weight_map(f"{hf_prefix}encoder.layers.{layer.layer_id}.", f"{me}layers.{layer.layer_id}."))
        return m

    def unused_prefixes(self, hf_prefix: str = "vision_tower.") -> tuple[str, ...]:
        """Checkpoint tensors of the tower this model never runs (layers past the feature layer, post-norm, head)."""
        skipped = tuple(f"{hf_prefix}encoder.layers.{i}." for i in range(len(self.layers), self.cfg.num_layers))
        return (*skipped, f"{hf_prefix}post_layernorm.", f"{hf_prefix}head.")

    def forward(self, pixel_values: torch.Tensor) -> list[torch.Tensor]:
        """[B, 3, H, W] -> hidden states 0..len(layers), each [B, N, C]."""
        cfg = self.cfg
        if pixel_values.shape[-2:] != (cfg.image_size, cfg.image_size):
            raise ValueError(
                f"pixel values of size {tuple(pixel_values.shape[-2:])}; this vision tower takes "
                f"{cfg.image_size}x{cfg.image_size}"
            )
        x = F.conv2d(
            pixel_values.to(self.patch_weight.dtype), self.patch_weight, self.patch_bias, stride=cfg.patch_size
        )
        x = x.flatten(2).transpose(1, 2)  # [B, patches, C]
        if self.class_embedding is not None:
            cls = self.class_embedding.expand(x.shape[0], 1, -1)
            x = torch.cat([cls, x], dim=1)
        x = x + self.position_embedding
        if self.pre_norm_weight is not None:
            x = F.layer_norm(x, (cfg.hidden_size,), self.pre_norm_weight, self.pre_norm_bias, cfg.layer_norm_eps)
        states = [x]
        for layer in self.layers:
            x = layer(x)
            states.append(x)
        return states
