"""Gemma 2 and Gemma 3 (text): the Llama-family decoder with Gemma's differences, as layer and model subclasses.

- RMSNorm scales by (1 + w): the loaded norm weights get their 1 added once (post_load), in float32 as transformers
  adds it, so the shared rms_norm kernels run them unchanged;
- a norm after attention and a norm around the MLP (pre- and post-feedforward), four per layer;
- GeGLU: gelu (tanh approximation) on the gate where Llama has silu;
- embeddings scaled by sqrt(hidden_size); the softmax scale query_pre_attn_scalar ** -0.5;
- local (sliding-window) and global layers; Gemma 3's local layers rotate with their own RoPE base;
- Gemma 2 soft-caps the attention scores (in the attention backends) and the final logits (here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from shared.config.quantization import QuantSpec
from shared.engine.forward_batch import ForwardBatch
from shared.engine.kv_pool import KVPool
from shared.engine.models.config import ModelArchConfig
from shared.engine.models.llama import DecoderLayer, LlamaForCausalLM, WeightSlot, _param
from shared.kernels.dispatch import AttentionBackend, AttentionMetadata
from shared.kernels.elementwise import TORCH_OPS, ElementwiseOps
from shared.kernels.linear import LinearBackend, PackedWeight
from shared.kernels.rotary import RotaryCache

if TYPE_CHECKING:
    from shared.engine.models.tp_hooks import TPComm


class GemmaDecoderLayer(DecoderLayer):
    """post_norm is Gemma's post_attention_layernorm (on the attention's output); pre_ff_norm and post_ff_norm
    wrap the MLP."""

    def __init__(
        self,
        cfg: ModelArchConfig,
        layer_id: int,
        dtype: torch.dtype,
        ops: ElementwiseOps = TORCH_OPS,
        quant: QuantSpec | None = None,
        tp: TPComm | None = None,
    ) -> None:
        super().__init__(cfg, layer_id, dtype, ops, quant, tp)
        self.pre_ff_norm = _param(cfg.hidden_size, dtype=dtype)
        self.post_ff_norm = _param(cfg.hidden_size, dtype=dtype)

    def pack_gate_up(self, backend: LinearBackend) -> PackedWeight:
        """A plain pack: a gated one fuses silu, and GeGLU's gelu runs after `apply`."""
        return backend.pack(self.gate_up_weight)

    def norms(self) -> list[nn.Parameter]:
        """Every (1 + w) norm weight of the layer."""
        out = [self.input_norm, self.post_norm, self.pre_ff_norm, self.post_ff_norm]
        return out + ([self.qk_norm] if self.qk_norm is not None else [])

    def weight_map(self, cfg: ModelArchConfig) -> dict[str, WeightSlot]:
        pre, me = f"model.layers.{self.layer_id}.", f"layers.{self.layer_id}."
        m = super().weight_map(cfg)
        m[pre + "pre_feedforward_layernorm.weight"] = WeightSlot(me + "pre_ff_norm")
        m[pre + "post_feedforward_layernorm.weight"] = WeightSlot(me + "post_ff_norm")
        return m

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        kv: KVPool,
        attn: AttentionBackend,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As DecoderLayer.forward: (the previous layer's post-feedforward-normed MLP output, residual stream)."""
        if residual is None:
            residual = hidden
            x = self.ops.rms_norm(hidden, self.input_norm, self.eps)
        else:
            x, residual = self.ops.fused_add_rms_norm(hidden, residual, self.input_norm, self.eps)
        x = self.ops.rms_norm(self.attention(x, cos, sin, batch, kv, attn, meta), self.post_norm, self.eps)
        x, residual = self.ops.fused_add_rms_norm(x, residual, self.pre_ff_norm, self.eps)
        gate, up = self.linear.apply(x, self.packed["gate_up"]).chunk(2, dim=-1)  # [T, inter] each
        x = self.exact.apply(F.gelu(gate, approximate="tanh") * up, self.packed["down"])
        return self.ops.rms_norm(x, self.post_ff_norm, self.eps), residual


class GemmaForCausalLM(LlamaForCausalLM):
    """Gemma 2 / Gemma 3 (text) causal LM over a paged KV pool."""

    layer_class = GemmaDecoderLayer

    def __init__(
        self,
        cfg: ModelArchConfig,
        dtype: torch.dtype,
        max_positions: int | None = None,
        ops: ElementwiseOps = TORCH_OPS,
        device: torch.device | None = None,
        quant: QuantSpec | None = None,
        tp: TPComm | None = None,
    ) -> None:
        super().__init__(cfg, dtype, max_positions, ops, device, quant, tp)
        # Gemma 3's local layers: the same positions, another base (no scaling); None = the global tables
        self.local_rotary: RotaryCache | None = None
        if cfg.local_rope_theta is not None:
            self.local_rotary = RotaryCache(cfg.head_dim, self.rotary.max_positions, cfg.local_rope_theta)

    def _gemma_layers(self) -> list[GemmaDecoderLayer]:
        layers = [layer for layer in self.layers if isinstance(layer, GemmaDecoderLayer)]
        assert len(layers) == len(self.layers)
        return layers

    def post_load(self) -> None:
        """Checkpoints store Gemma's norm weights as w for a scale of (1 + w): add the 1 once, in float32."""
        for p in [self.norm] + [p for layer in self._gemma_layers() for p in layer.norms()]:
            p.data = (p.data.float() + 1.0).to(p.dtype)

    def _upcast_vectors(self) -> None:
        super()._upcast_vectors()
        if self.act_dtype != self.dtype:
            for layer in self._gemma_layers():
                for p in (layer.pre_ff_norm, layer.post_ff_norm):
                    p.data = p.data.to(self.act_dtype)

    def to_device(self, device: torch.device) -> None:
        super().to_device(device)
        if self.local_rotary is not None:
            self.local_rotary.cos, self.local_rotary.sin = (
                self.local_rotary.cos.to(device),
                self.local_rotary.sin.to(device),
            )

    def forward(self, batch: ForwardBatch, kv: KVPool, attn: AttentionBackend, meta: AttentionMetadata) -> torch.Tensor:
        """As LlamaForCausalLM.forward, with the embedding scale and each layer's own RoPE tables."""
        if batch.embed_rows is not None:
            raise ValueError("image embeddings are not supported for Gemma text models")
        # transformers scales in the weights' dtype: the scale rounded to it first
        scale = torch.tensor(self.cfg.embed_scale, dtype=self.embed_tokens.dtype)
        hidden = (F.embedding(batch.input_ids, self.embed_tokens) * scale).to(self.act_dtype)  # [T, hidden]
        glob = self.rotary.lookup(batch.positions, self.act_dtype)  # (cos, sin) [T, 1, D / 2] each
        local = self.local_rotary.lookup(batch.positions, self.act_dtype) if self.local_rotary is not None else glob
        residual: torch.Tensor | None = None
        for layer in self._gemma_layers():
            cos, sin = local if layer.window else glob
            hidden, residual = layer(hidden, residual, cos, sin, batch, kv, attn, meta)
        assert residual is not None
        idx = batch.logits_indices
        if idx.numel() != hidden.shape[0] or batch.num_prompt_rows:
            hidden, residual = hidden.index_select(0, idx), residual.index_select(0, idx)
        out, _ = self.ops.fused_add_rms_norm(hidden, residual, self.norm, self.cfg.rms_norm_eps)
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden] -> float32 logits [n, vocab], soft-capped where the model says (Gemma 2)."""
        logits = super().compute_logits(hidden)
        cap = self.cfg.final_softcap
        return torch.tanh(logits / cap) * cap if cap else logits
