"""DeepSeek-V2 / V3: multi-head latent attention (MLA) over a latent KV cache; Llama's MLP on the dense layers, on
the MoE layers routed experts (moe.DeepseekMoEBlock, grouped GEMMs) plus the shared experts as one dense MLP.

Per layer, after the input norm (numbers as transformers computes them, see mla_config.py):
  a = x @ [q_a_proj | kv_a_proj_with_mqa]  (or [q_proj | kv_a_proj_with_mqa] without q LoRA): one GEMM, both read x;
  q = q_b_proj(rms_norm(q_a)) (or a's q rows) -> per head [q_nope | q_pe];
  c_kv = rms_norm(a's kv rows), k_pe = a's last qk_rope_head_dim columns; q_pe and k_pe rotated (decoupled RoPE);
  the latent row [c_kv | k_pe] of each new token is written to the layer's page slot (an "mla" KVLayout: one
  "head" of kv_lora_rank + qk_rope_head_dim per token, no V), and attention runs over the sequence's latent rows
  (shared/kernels/mla_attention.py), decompressed through kv_b_proj;
  o_proj, then the post-attention norm and a SwiGLU MLP as Llama's (an MoE layer: the routed experts' sum plus
  the shared experts' MLP).
A step of decode tokens only attends in the latent space instead (weight absorption, mla_attention_absorbed: the
paged attention backend over the latent rows as one MQA head); prefill and mixed steps take the reference.

Runs on the torch ops (the MLA attention is the torch reference; no fused C decode, no Triton, no CUDA graphs) at
--tp-size 1 with unquantized weights; the runner refuses the rest by name.
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
from shared.engine.models.llama import LlamaForCausalLM, _param
from shared.engine.models.mla_config import LATENT_NORM_EPS, MLAConfig
from shared.engine.models.moe import DeepseekMoEBlock
from shared.engine.models.slots import WeightSlot
from shared.kernels.dispatch import AttentionBackend, AttentionMetadata
from shared.kernels.elementwise import TORCH_OPS, ElementwiseOps
from shared.kernels.linear import LinearBackend, PackedWeight, TorchLinear
from shared.kernels.mla_attention import MLAPlan, absorbed_weights, mla_attention, mla_attention_absorbed, plan_mla
from shared.kernels.rope_scaling import yarn
from shared.kernels.rotary import RotaryCache

if TYPE_CHECKING:
    from shared.engine.models.tp_hooks import TPComm


# (router, gate, up, down) below model.layers.N.: the hub's per-expert names, which save_pretrained also writes
EXPERT_NAMES = ("mlp.gate", "mlp.experts.{e}.gate_proj", "mlp.experts.{e}.up_proj", "mlp.experts.{e}.down_proj")


def mla_rotary(cfg: ModelArchConfig, max_positions: int) -> RotaryCache:
    """cos/sin tables over qk_rope_head_dim: plain RoPE, or yarn's frequencies with its attention factor folded into
    cos and sin (as transformers does)."""
    mla = cfg.mla
    assert mla is not None
    rot = RotaryCache(mla.qk_rope_head_dim, max_positions, cfg.rope_theta)
    if mla.yarn is not None:
        scaled = yarn(mla.qk_rope_head_dim, cfg.rope_theta, mla.yarn, cfg.max_position_embeddings)
        inv_freq, factor = scaled.inv_freq, scaled.attention_factor
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        rot.cos, rot.sin = freqs.cos() * factor, freqs.sin() * factor
    return rot


class MLADecoderLayer(nn.Module):
    def __init__(self, cfg: ModelArchConfig, layer_id: int, dtype: torch.dtype, ops: ElementwiseOps) -> None:
        super().__init__()
        mla = cfg.mla
        assert mla is not None
        self.mla: MLAConfig = mla
        self.layer_id = layer_id
        self.ops = ops
        self.eps = cfg.rms_norm_eps
        self.scale = cfg.softmax_scale
        h = self.num_heads = cfg.num_heads
        hidden = cfg.hidden_size
        # rows of `a` before the latent: q_a (q LoRA) or the whole query (V2-Lite)
        self.q_rows = mla.q_lora_rank or h * mla.qk_head_dim
        self.input_norm = _param(hidden, dtype=dtype)
        self.a_weight = _param(self.q_rows + mla.latent_dim, hidden, dtype=dtype)
        self.q_a_norm = _param(mla.q_lora_rank, dtype=dtype) if mla.q_lora_rank else None
        self.q_b_weight = _param(h * mla.qk_head_dim, mla.q_lora_rank, dtype=dtype) if mla.q_lora_rank else None
        self.kv_a_norm = _param(mla.kv_lora_rank, dtype=dtype)
        self.kv_b_weight = _param(h * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank, dtype=dtype)
        self.o_weight = _param(hidden, h * mla.v_head_dim, dtype=dtype)
        self.post_norm = _param(hidden, dtype=dtype)
        # the dense MLP, or on an MoE layer its shared experts (mla_config.py asks for at least one) as one MLP of
        # n_shared x moe_intermediate_size
        self.moe: DeepseekMoEBlock | None = None
        inter = cfg.intermediate_size
        if cfg.is_moe(layer_id):
            inter = cfg.shared_experts * cfg.moe_intermediate_size
            groups = (cfg.expert_groups, cfg.topk_groups)
            self.moe = DeepseekMoEBlock(
                hidden,
                cfg.moe_intermediate_size,
                cfg.num_experts,
                cfg.experts_per_token,
                cfg.norm_topk_prob,
                groups,
                cfg.routed_scaling_factor,
                cfg.moe_kind == "deepseek_v3",
                dtype,
            )
        self.dense_inter = inter
        self.gate_up_weight = _param(2 * inter, hidden, dtype=dtype)
        self.down_weight = _param(hidden, inter, dtype=dtype)
        self.linear: LinearBackend = TorchLinear()
        self.exact: LinearBackend = TorchLinear()
        self.packed: dict[str, PackedWeight] = {}
        # kv_b_proj split per head for weight absorption (W_UK, W_UV^T), made after loading (use_linear)
        self.w_uk = self.w_uv_t = torch.empty(0)
        self._pack(TorchLinear())

    def use_linear(self, backend: LinearBackend) -> None:
        """After loading: the projections through `backend` (down through backend.exact(), as llama.py says why);
        kv_b_proj stays a plain tensor, which the reference attention decompresses the cached latents with, and is
        split per head for the absorbed one."""
        self._pack(backend)
        mla = self.mla
        self.w_uk, self.w_uv_t = absorbed_weights(
            self.kv_b_weight, self.num_heads, mla.qk_nope_head_dim, mla.v_head_dim
        )

    def _pack(self, backend: LinearBackend) -> None:
        self.linear, self.exact = backend, backend.exact()
        self.packed = {
            "a": backend.pack(self.a_weight),
            "o": backend.pack(self.o_weight),
            "gate_up": backend.pack_gated(self.gate_up_weight),
            "down": self.exact.pack(self.down_weight),
        }
        if self.q_b_weight is not None:
            self.packed["q_b"] = backend.pack(self.q_b_weight)

    def weight_map(self, cfg: ModelArchConfig) -> dict[str, WeightSlot]:
        """HF tensor name -> slot, for this layer."""
        pre, me = f"model.layers.{self.layer_id}.", f"layers.{self.layer_id}."
        att, q, inter = pre + "self_attn.", self.q_rows, self.dense_inter
        mlp = pre + ("mlp.shared_experts." if self.moe is not None else "mlp.")
        m = {
            pre + "input_layernorm.weight": WeightSlot(me + "input_norm"),
            pre + "post_attention_layernorm.weight": WeightSlot(me + "post_norm"),
            att + "kv_a_proj_with_mqa.weight": WeightSlot(me + "a_weight", q, q + self.mla.latent_dim),
            att + "kv_a_layernorm.weight": WeightSlot(me + "kv_a_norm"),
            att + "kv_b_proj.weight": WeightSlot(me + "kv_b_weight"),
            att + "o_proj.weight": WeightSlot(me + "o_weight"),
            mlp + "gate_proj.weight": WeightSlot(me + "gate_up_weight", 0, inter),
            mlp + "up_proj.weight": WeightSlot(me + "gate_up_weight", inter, 2 * inter),
            mlp + "down_proj.weight": WeightSlot(me + "down_weight"),
        }
        if self.moe is not None:
            m.update(self.moe.weight_map(pre, me + "moe.", EXPERT_NAMES))
        if self.q_b_weight is not None:
            m[att + "q_a_proj.weight"] = WeightSlot(me + "a_weight", 0, q)
            m[att + "q_a_layernorm.weight"] = WeightSlot(me + "q_a_norm")
            m[att + "q_b_proj.weight"] = WeightSlot(me + "q_b_weight")
        else:
            m[att + "q_proj.weight"] = WeightSlot(me + "a_weight", 0, q)
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
        plan: MLAPlan | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As llama.DecoderLayer.forward: (this layer's MLP output, residual stream). plan: the reference attention's
        (mla_attention); None: attend in the latent space through `attn` (mla_attention_absorbed)."""
        if residual is None:
            residual = hidden
            x = self.ops.rms_norm(hidden, self.input_norm, self.eps)
        else:
            x, residual = self.ops.fused_add_rms_norm(hidden, residual, self.input_norm, self.eps)
        x = self.attention(x, cos, sin, batch, kv, attn, meta, plan)
        x, residual = self.ops.fused_add_rms_norm(x, residual, self.post_norm, self.eps)
        routed = self.moe(x) if self.moe is not None else None
        gated = self.linear.apply_gated(x, self.packed["gate_up"])
        if gated is None:
            gated = self.ops.silu_and_mul(self.linear.apply(x, self.packed["gate_up"]))
        dense = self.exact.apply(gated, self.packed["down"])
        # transformers adds the shared experts to the routed ones (the same order of the sum)
        return (dense if routed is None else routed + dense), residual

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """RoPE over x [T, heads, rope]. Interleaved pairs are gathered into halves first: the result is
        transformers' (V3's interleave form exactly; V2's complex form up to the order of the output dims, the same
        for q and k, so every score is unchanged)."""
        if self.mla.rope_interleave:
            x = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
        return self.ops.apply_rotary(x, cos, sin)

    def attention(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        kv: KVPool,
        attn: AttentionBackend,
        meta: AttentionMetadata,
        plan: MLAPlan | None,
    ) -> torch.Tensor:
        """x [T, hidden] (normed) -> o_proj output [T, hidden]; the new tokens' latent rows stored first."""
        t, h, mla = x.shape[0], self.num_heads, self.mla
        a = self.linear.apply(x, self.packed["a"])  # [T, q_rows + kv_lora_rank + rope]
        q = a[:, : self.q_rows]
        if self.q_a_norm is not None:
            q = self.linear.apply(self.ops.rms_norm(q, self.q_a_norm, LATENT_NORM_EPS), self.packed["q_b"])
        q = q.reshape(t, h, mla.qk_head_dim)
        c_kv = self.ops.rms_norm(a[:, self.q_rows : self.q_rows + mla.kv_lora_rank], self.kv_a_norm, LATENT_NORM_EPS)
        q_pe = self._rotate(q[..., mla.qk_nope_head_dim :], cos, sin)  # [T, H, rope]
        k_pe = self._rotate(a[:, None, self.q_rows + mla.kv_lora_rank :], cos, sin)  # [T, 1, rope]
        rows = torch.cat((c_kv[:, None], k_pe), dim=-1)  # [T, 1, rank + rope]
        kv.write_latent(self.layer_id, batch.out_pages, batch.out_offsets, rows)
        q_nope, cache = q[..., : mla.qk_nope_head_dim], kv.k(self.layer_id)
        if plan is None:
            o = mla_attention_absorbed(q_nope, q_pe, rows, cache, self.w_uk, self.w_uv_t, attn, meta, self.scale)
        else:
            o = mla_attention(q_nope, q_pe, cache, plan, self.kv_b_weight, mla.kv_lora_rank, mla.v_head_dim, self.scale)
        # o: [T, H, v]
        return self.linear.apply(o.reshape(t, h * mla.v_head_dim), self.packed["o"])


class DeepseekForCausalLM(LlamaForCausalLM):
    """DeepSeek-V2 / V3 causal LM over a paged latent KV pool.

    A LlamaForCausalLM to the runner (the same methods, the lm_head's compute_logits inherited), but its own layers
    and forward: nothing of Llama's constructor applies, so it is not called.
    """

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
        nn.Module.__init__(self)
        assert cfg.mla is not None and quant is None and tp is None  # the runner refuses quantized and TP runs
        self.cfg, self.tp, self.dtype, self.act_dtype, self.ops = cfg, tp, dtype, dtype, ops
        with torch.device(device or "cpu"):
            self.embed_tokens = _param(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
            self.layers = nn.ModuleList(MLADecoderLayer(cfg, i, dtype, ops) for i in range(cfg.num_layers))
            self.norm = _param(cfg.hidden_size, dtype=dtype)
            self.lm_head = (
                self.embed_tokens if cfg.tie_word_embeddings else _param(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
            )
        self.rotary = mla_rotary(cfg, max_positions or cfg.max_position_embeddings)
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.parameters())
        self.linear: LinearBackend = TorchLinear()
        self.packed = {"lm_head": self.lm_head}
        self.fused_decode = None
        self._fused_with = None

    def _mla_layers(self) -> list[MLADecoderLayer]:
        layers = [layer for layer in self.layers if isinstance(layer, MLADecoderLayer)]
        assert len(layers) == len(self.layers)
        return layers

    def post_load(self) -> None:
        """The routed experts' loaded weights stacked for the grouped GEMMs, once."""
        for layer in self._mla_layers():
            if layer.moe is not None:
                layer.moe.post_load()

    def use_linear(self, backend: LinearBackend) -> None:
        self.linear = backend
        for layer in self._mla_layers():
            layer.use_linear(backend)
        self.packed = {"lm_head": backend.pack(self.lm_head)}

    def hf_weight_map(self) -> dict[str, WeightSlot]:
        m = {"model.embed_tokens.weight": WeightSlot("embed_tokens"), "model.norm.weight": WeightSlot("norm")}
        if not self.cfg.tie_word_embeddings:
            m["lm_head.weight"] = WeightSlot("lm_head")
        for layer in self._mla_layers():
            m.update(layer.weight_map(self.cfg))
        return m

    # False: every step on the reference attention (tests compare the two paths with it)
    absorb_decode = True

    def forward(self, batch: ForwardBatch, kv: KVPool, attn: AttentionBackend, meta: AttentionMetadata) -> torch.Tensor:
        """As LlamaForCausalLM.forward. A decode-only step attends in the latent space through `attn` and `meta`;
        the others on the reference attention, planned here once for every layer."""
        if batch.embed_rows is not None:
            raise ValueError("image embeddings are not supported for DeepSeek text models")
        hidden = F.embedding(batch.input_ids, self.embed_tokens).to(self.act_dtype)  # [T, hidden]
        cos, sin = self.rotary.lookup(batch.positions, self.act_dtype)  # [T, 1, rope / 2] each
        plan = None
        if not (self.absorb_decode and batch.is_decode):
            plan = plan_mla(batch.page_table, batch.prefix_lens, batch.extend_lens, batch.token_starts, batch.page_size)
        residual: torch.Tensor | None = None
        for layer in self._mla_layers():
            hidden, residual = layer(hidden, residual, cos, sin, batch, kv, attn, meta, plan)
        assert residual is not None
        idx = batch.logits_indices
        if idx.numel() != hidden.shape[0] or batch.num_prompt_rows:
            hidden, residual = hidden.index_select(0, idx), residual.index_select(0, idx)
        out, _ = self.ops.fused_add_rms_norm(hidden, residual, self.norm, self.cfg.rms_norm_eps)
        return out
