"""Our Llama-family decoder: Llama, Qwen2 (q/k/v bias), Qwen3 (per-head q/k RMSNorm), Mistral (sliding window) and
Phi-3 (fused checkpoint tensors, partial RoPE) in one module; Gemma's layer (gemma.py) builds on it.

Inference only, laid out for few ops per layer on CPU:
  - q, k, v projections fused into one [(H + 2 * KVH) * D, hidden] weight, gate and up into one [2 * I, hidden];
  - RoPE (and Qwen3's q/k norm) applied to q and k heads together, as one [T, H + KVH, D] tensor;
  - cos/sin looked up once per forward, shared by all layers;
  - logits only for the rows that need them;
  - projections through a LinearBackend (shared/kernels/linear.py), chosen once after the weights load;
  - with every kernel native (CPU, fp32 or bf16 weights), a pure decode step runs all layers in one C call
    (shared/kernels/native/decode_layers.py), bit-identical to the layers one by one;
  - on the native CPU kernels a bf16 model keeps bf16 weights (packed) and a bf16 KV cache but fp32 activations
    (act_dtype): the kernels sum in fp32 and widen bf16 as they read it, so nothing is gained by rounding the
    activations, and the norms and biases are upcast once (exactly) after loading.
The fused parameters are filled from the checkpoint's separate tensors by `hf_weight_map` (see weights.py).
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
from shared.engine.models.quant_params import PROJECTIONS, add_params, packed, quant_slots, weight_dtype
from shared.engine.models.slots import WeightSlot
from shared.kernels.dispatch import AttentionBackend, AttentionMetadata, NativeAttentionBackend
from shared.kernels.elementwise import TORCH_OPS, ElementwiseOps
from shared.kernels.fp8_weight import quantize_fp8_rows
from shared.kernels.linear import LinearBackend, NativeLinear, NativePacked, PackedWeight, TorchLinear
from shared.kernels.rotary import RotaryCache

if TYPE_CHECKING:
    from shared.engine.models.tp_hooks import TPComm
    from shared.kernels.native.decode_layers import NativeDecodeLayers


def _param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    # Uninitialised on purpose: the strict loader fills every element or fails (weights.load_weights).
    return nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        cfg: ModelArchConfig,
        layer_id: int,
        dtype: torch.dtype,
        ops: ElementwiseOps = TORCH_OPS,
        quant: QuantSpec | None = None,
        tp: TPComm | None = None,
    ) -> None:
        """cfg: sized per rank under tensor parallelism (shared/engine/parallel/shard.py); tp: its collectives."""
        super().__init__()
        self.layer_id = layer_id
        self.quant = quant
        wdtype = weight_dtype(quant, dtype)  # the projections' weights as the checkpoint's (quant_params.py)
        self.tp = tp
        self.ops = ops
        h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = h, kvh, d
        self.q_size, self.kv_size = h * d, kvh * d
        self.eps = cfg.rms_norm_eps
        self.scale = cfg.softmax_scale
        self.window, self.softcap = cfg.window(layer_id), cfg.attn_softcap  # 0: full attention, no capping
        self.rotary_dim = cfg.rotary_dim  # 0: RoPE over the whole head
        self.fused_names = cfg.model_type == "phi3"  # the checkpoint holds qkv_proj and gate_up_proj fused already
        self.input_norm = _param(cfg.hidden_size, dtype=dtype)
        self.qkv_weight = _param(self.q_size + 2 * self.kv_size, cfg.hidden_size, dtype=wdtype)
        self.qkv_bias = _param(self.q_size + 2 * self.kv_size, dtype=dtype) if cfg.qkv_bias else None
        # Qwen3's q_norm and k_norm weights, repeated per head: [H + KVH, D] so one rms_norm covers q and k
        self.qk_norm = _param(h + kvh, d, dtype=dtype) if cfg.qk_norm else None
        self.o_weight = _param(cfg.hidden_size, self.q_size, dtype=wdtype)
        self.o_bias = _param(cfg.hidden_size, dtype=dtype) if cfg.o_bias else None
        self.sinks = _param(h, dtype=dtype) if cfg.attn_sinks else None  # gpt-oss: a sink logit per query head
        self.post_norm = _param(cfg.hidden_size, dtype=dtype)
        inter = self.dense_intermediate(cfg)
        self.gate_up_weight = _param(2 * inter, cfg.hidden_size, dtype=wdtype)
        self.down_weight = _param(cfg.hidden_size, inter, dtype=wdtype)
        if quant is not None:  # fp8 block scales, or AWQ's int4 tensors (quant_params.py)
            add_params(self, quant)
        self.linear: LinearBackend = TorchLinear()
        self.exact: LinearBackend = TorchLinear()  # the down projection's (see use_linear)
        # What self.linear.apply takes for qkv, o and gate_up (self.exact.apply for down): the parameters themselves
        # until use_linear packs them (a plain dict: a Parameter stored as a module attribute would register twice).
        self.packed: dict[str, PackedWeight] = {
            "qkv": self.qkv_weight,
            "o": self.o_weight,
            "gate_up": self.gate_up_weight,
            "down": self.down_weight,
        }

    def dense_intermediate(self, cfg: ModelArchConfig) -> int:
        """The dense MLP's intermediate size (0 where the layer's MLP is routed experts: moe_model.py)."""
        return cfg.intermediate_size

    def use_linear(self, backend: LinearBackend) -> None:
        """Run qkv, o and gate_up through `backend`, down through `backend.exact()` (packing the weights once; call
        after loading).

        The down projection (inner size = intermediate) runs on `backend.exact()`: F.linear, the GEMM transformers
        runs, where the backend would use oneDNN. oneDNN's fp32 kernel there measured ~3x the float64-reference error
        of MKL's on the bundled model (max logit error 2.0e-4 vs 6.7e-5, transformers' own fp32 error being 6.4e-5),
        past the 1e-4 HF-parity contract; with the hidden-size projections on oneDNN the logits stay at 7-9e-5. The
        native kernel's blocked sums are on par with MKL's, so down takes it wherever it is the faster of the two:
        every step with AVX-512 tiles, steps of up to 128 rows with AVX2 ones (linear.native_exact_max_rows).
        """
        self.linear = backend
        self.exact = backend.exact()
        if self.quant is not None:  # fp8 / int4 weights stay as loaded; the backend dequantizes them per call
            self.packed = packed(self, self.quant)
            return
        self.packed = {
            "qkv": backend.pack(self.qkv_weight),
            "o": backend.pack(self.o_weight),
            "gate_up": self.pack_gate_up(backend),
            "down": self.exact.pack(self.down_weight),
        }
        if backend.name != "torch":  # the packed copies replace the originals: do not hold the weights twice
            for p in (self.qkv_weight, self.o_weight, self.gate_up_weight):
                p.data = p.data.new_empty(0)

    def pack_gate_up(self, backend: LinearBackend) -> PackedWeight:
        """gate_up for silu-and-mul: the backend may fuse the activation into the GEMM (apply_gated)."""
        return backend.pack_gated(self.gate_up_weight)

    def quantize_fp8(self, quant: QuantSpec) -> None:
        """--quantization fp8 over an unquantized checkpoint: each loaded projection to fp8 blocks (before
        use_linear). The fused q/k/v and gate/up weights are quantized whole, in blocks of their own rows."""
        for key in PROJECTIONS:
            fp8 = quantize_fp8_rows(getattr(self, f"{key}_weight").data, quant.weight_block)
            setattr(self, f"{key}_weight", nn.Parameter(fp8.weight, requires_grad=False))
            self.register_parameter(f"{key}_weight_scale", nn.Parameter(fp8.scale, requires_grad=False))
        self.quant = quant

    def _gated(self, x: torch.Tensor) -> torch.Tensor:
        """silu(x @ gate.T) * (x @ up.T): [T, hidden] -> [T, inter].

        With F.linear on CPU two GEMMs over the contiguous halves of the fused weight measured ~5% faster than one
        GEMM of twice the width at decode batch sizes (MKL, fp32, M = 16); with many tokens, on GPU, or with a
        packed weight the fused GEMM + silu_and_mul is as fast and one op fewer.
        """
        if x.shape[0] > 64 or x.device.type != "cpu" or self.ops.name != "torch" or self.linear.name != "torch":
            fused = self.linear.apply_gated(x, self.packed["gate_up"])  # the native backend at decode batch sizes
            if fused is not None:
                return fused
            return self.ops.silu_and_mul(self.linear.apply(x, self.packed["gate_up"]))
        inter = self.gate_up_weight.shape[0] // 2  # F.linear on the parameter itself (the torch backend packs nothing)
        return F.silu(F.linear(x, self.gate_up_weight[:inter])) * F.linear(x, self.gate_up_weight[inter:])

    def weight_map(self, cfg: ModelArchConfig) -> dict[str, WeightSlot]:
        """HF tensor name -> slot, for this layer."""
        pre, me = f"model.layers.{self.layer_id}.", f"layers.{self.layer_id}."
        q, kv, inter = self.q_size, self.kv_size, cfg.intermediate_size
        m = {
            pre + "input_layernorm.weight": WeightSlot(me + "input_norm"),
            pre + "self_attn.o_proj.weight": WeightSlot(me + "o_weight"),
            pre + "post_attention_layernorm.weight": WeightSlot(me + "post_norm"),
            pre + "mlp.down_proj.weight": WeightSlot(me + "down_weight"),
        }
        if self.fused_names:  # Phi-3: [q; k; v] and [gate; up], the row order of our fused parameters
            m[pre + "self_attn.qkv_proj.weight"] = WeightSlot(me + "qkv_weight")
            m[pre + "mlp.gate_up_proj.weight"] = WeightSlot(me + "gate_up_weight")
        else:
            m[pre + "self_attn.q_proj.weight"] = WeightSlot(me + "qkv_weight", 0, q)
            m[pre + "self_attn.k_proj.weight"] = WeightSlot(me + "qkv_weight", q, q + kv)
            m[pre + "self_attn.v_proj.weight"] = WeightSlot(me + "qkv_weight", q + kv, q + 2 * kv)
            m[pre + "mlp.gate_proj.weight"] = WeightSlot(me + "gate_up_weight", 0, inter)
            m[pre + "mlp.up_proj.weight"] = WeightSlot(me + "gate_up_weight", inter, 2 * inter)
        if self.qkv_bias is not None:
            m[pre + "self_attn.q_proj.bias"] = WeightSlot(me + "qkv_bias", 0, q)
            m[pre + "self_attn.k_proj.bias"] = WeightSlot(me + "qkv_bias", q, q + kv)
            m[pre + "self_attn.v_proj.bias"] = WeightSlot(me + "qkv_bias", q + kv, q + 2 * kv)
        if self.o_bias is not None:
            m[pre + "self_attn.o_proj.bias"] = WeightSlot(me + "o_bias")
        if self.sinks is not None:
            m[pre + "self_attn.sinks"] = WeightSlot(me + "sinks")
        if self.qk_norm is not None:
            h = self.num_heads
            m[pre + "self_attn.q_norm.weight"] = WeightSlot(me + "qk_norm", 0, h, broadcast=True)
            m[pre + "self_attn.k_norm.weight"] = WeightSlot(me + "qk_norm", h, h + self.num_kv_heads, broadcast=True)
        if self.quant is not None:  # each projection's quantized tensors go to the same rows of theirs
            m = quant_slots(m, me, self.quant)
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
        """hidden [T, hidden] (the previous layer's MLP output), residual [T, hidden] or None for layer 0
        -> (this layer's MLP output, residual stream)."""
        if residual is None:
            residual = hidden
            x = self.ops.rms_norm(hidden, self.input_norm, self.eps)
        else:
            x, residual = self.ops.fused_add_rms_norm(hidden, residual, self.input_norm, self.eps)
        x = self.attention(x, cos, sin, batch, kv, attn, meta)
        if self.tp is not None:  # o is row-parallel: this rank's heads' partial sum
            x = self.tp.all_reduce(x)
        x, residual = self.ops.fused_add_rms_norm(x, residual, self.post_norm, self.eps)
        x = self.mlp(x)
        if self.tp is not None:  # down is row-parallel: this rank's intermediate columns' partial sum
            x = self.tp.all_reduce(x)
        return x, residual

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP after the post-attention norm: [T, hidden] -> [T, hidden]."""
        return self.exact.apply(self._gated(x), self.packed["down"])

    def attention(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        kv: KVPool,
        attn: AttentionBackend,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """The attention block after the input norm: x [T, hidden] -> o_proj output [T, hidden] (K/V stored)."""
        t = x.shape[0]
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.linear.apply(x, self.packed["qkv"], self.qkv_bias)  # [T, (H + 2 * KVH) * D]
        v = qkv[:, self.q_size + self.kv_size :].view(t, kvh, d)
        k_cache, v_cache = kv.k(self.layer_id), kv.v(self.layer_id)
        if self.ops.rope_store is not None and self.qk_norm is None and not self.rotary_dim and not kv.quantized:
            # one call: rotate, store K/V, q/k contiguous
            q, k = self.ops.rope_store(qkv, h, kvh, d, cos, sin, k_cache, v_cache, batch.out_pages, batch.out_offsets)
        else:
            qk = qkv[:, : self.q_size + self.kv_size].view(t, h + kvh, d)
            if self.qk_norm is not None:
                qk = self.ops.rms_norm(qk, self.qk_norm, self.eps)
            qk = self._rotate(qk, cos, sin)  # [T, H + KVH, D]
            q, k = qk[:, :h], qk[:, h:]
            if kv.quantized:  # fp8 pages: attend over K/V exactly as the pages hold them (kv_pool.py)
                k, v = kv.quantize(self.layer_id, k, v)
            kv.write(self.layer_id, batch.out_pages, batch.out_offsets, k, v)
        if kv.quantized:  # K/V in page units: k_scale folds into the softmax scale, v_scale into the output
            i = self.layer_id
            scale = self.scale * kv.k_scales[i]
            o = attn.forward(q, k, v, k_cache, v_cache, meta, scale, self.window, self.softcap, self.sinks)
            o = o * kv.v_scales[i]
        else:  # [T, H, D]
            o = attn.forward(q, k, v, k_cache, v_cache, meta, self.scale, self.window, self.softcap, self.sinks)
        return self.linear.apply(o.reshape(t, self.q_size), self.packed["o"], self.o_bias)

    def _rotate(self, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """RoPE over each head's first rotary_dim dims (all of them unless partial); the rest pass through."""
        if not self.rotary_dim:
            return self.ops.apply_rotary(qk, cos, sin)
        r = self.rotary_dim
        return torch.cat((self.ops.apply_rotary(qk[..., :r].contiguous(), cos, sin), qk[..., r:]), dim=-1)


class LlamaForCausalLM(nn.Module):
    """Llama / Qwen2 / Qwen3 / Mistral / Phi-3 causal LM over a paged KV pool."""

    layer_class: type[DecoderLayer] = DecoderLayer  # a subclass model sets its own layer (gemma.py)

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
        """tp: this rank's collectives, with cfg sized per rank (shared/engine/parallel/shard.py); None: one
        process holds the whole model."""
        super().__init__()
        self.cfg = cfg
        self.tp = tp
        self.dtype = dtype
        # the dtype of the hidden states: fp32 on the native CPU kernels (they take fp32 activations, whatever the
        # weights' dtype), the weights' dtype elsewhere
        self.act_dtype = torch.float32 if ops.name == "native" else dtype
        self.ops = ops
        # The parameters are allocated where they will live (a GPU model never has a host copy of its weights); the
        # RoPE tables are computed on the CPU and moved by to_device, as before.
        with torch.device(device or "cpu"):
            self.embed_tokens = _param(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
            self.layers = nn.ModuleList(self.layer_class(cfg, i, dtype, ops, quant, tp) for i in range(cfg.num_layers))
            self.norm = _param(cfg.hidden_size, dtype=dtype)
            self.lm_head = (
                self.embed_tokens if cfg.tie_word_embeddings else _param(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
            )
        self.rotary = RotaryCache(
            cfg.rotary_dim or cfg.head_dim,
            max_positions or cfg.max_position_embeddings,
            cfg.rope_theta,
            cfg.rope_scaling,
            model_max_positions=cfg.max_position_embeddings,
        )
        # Bytes of the checkpoint's weights (a tied lm_head once), fixed here: packing may replace parameters.
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.parameters())
        self.linear: LinearBackend = TorchLinear()
        self.packed: dict[str, PackedWeight] = {"lm_head": self.lm_head}
        # All layers of a pure decode step in one C call, when every kernel is native (set by use_linear); it runs
        # only while the backends it was built from are still in place (a profiler that wraps them gets the layers).
        self.fused_decode: NativeDecodeLayers | None = None
        self._fused_with: tuple[LinearBackend, ElementwiseOps] | None = None

    def post_load(self) -> None:
        """Turn checkpoint values into the form the forward uses, once, after the weights are loaded (none here)."""

    def use_linear(self, backend: LinearBackend) -> None:
        """Run the projections and the lm_head through `backend` (after the weights are loaded and on their device).

        A tied lm_head gets a packed copy next to the embedding table (the embedding lookup needs the original).
        """
        self._upcast_vectors()
        self.linear = backend
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)
            layer.use_linear(backend)
        self.packed = {"lm_head": backend.pack(self.lm_head)}
        if self.packed["lm_head"] is not self.lm_head and not self.cfg.tie_word_embeddings:
            self.lm_head.data = self.lm_head.data.new_empty(0)
        # the one-call decode has no all-reduce between its layers: tensor-parallel ranks run the layers one by one
        self.fused_decode = self._native_decode_layers(backend) if self.tp is None else None
        self._fused_with = (backend, self.ops)

    def _upcast_vectors(self) -> None:
        """Norm weights and biases in act_dtype where it is wider than the weights' (exact: bf16 -> fp32), for the
        native elementwise ops and GEMM epilogues, which read them as fp32."""
        if self.act_dtype == self.dtype:
            return
        vectors: list[nn.Parameter | None] = [self.norm]
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)
            vectors += [layer.input_norm, layer.post_norm, layer.qkv_bias, layer.o_bias, layer.qk_norm]
        for p in vectors:
            if p is not None and p.dtype != self.act_dtype:
                p.data = p.data.to(self.act_dtype)

    def _native_decode_layers(self, backend: LinearBackend) -> NativeDecodeLayers | None:
        """The one-call decode layers, where every layer's kernels are the native ones it calls (CPU, fp32 activations
        over fp32 or bf16 weights, native GEMMs for the projections and the down projection, native rope_store, no
        q/k norm); None elsewhere."""
        if not isinstance(backend, NativeLinear) or self.ops.name != "native" or self.ops.rope_store is None:
            return None
        c = self.cfg
        if c.qk_norm or self.act_dtype != torch.float32 or type(self) is not LlamaForCausalLM:
            return None
        # the C call has none of these (see its module); a sliding window only runs it while every sequence of the
        # step is within the window (forward), where the window changes nothing
        if c.rotary_dim or c.attn_softcap:
            return None
        from shared.kernels.native.decode_layers import LayerWeights, NativeDecodeLayers

        weights = []
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)
            p = layer.packed
            if not isinstance(layer.exact, NativeLinear):
                return None
            limit = layer.exact.max_rows  # the down projection must stay native at every step the call takes
            if limit is not None and (backend.max_rows is None or limit < backend.max_rows):
                return None
            qkv, o, gate_up, down = (p[n] for n in ("qkv", "o", "gate_up", "down"))
            if not (
                isinstance(qkv, NativePacked)
                and isinstance(o, NativePacked)
                and isinstance(gate_up, NativePacked)
                and isinstance(down, NativePacked)
                and gate_up.gated
            ):
                return None
            weights.append(
                LayerWeights(
                    layer.input_norm,
                    qkv.panels,
                    layer.qkv_bias,
                    o.panels,
                    layer.o_bias,
                    layer.post_norm,
                    gate_up.panels,
                    down.panels,
                )
            )
        return NativeDecodeLayers(
            weights,
            hidden=c.hidden_size,
            heads=c.num_heads,
            kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            inter=c.intermediate_size,
            eps=c.rms_norm_eps,
            max_rows=backend.max_rows,
        )

    def hf_weight_map(self) -> dict[str, WeightSlot]:
        """Every checkpoint tensor this model needs, by its Hugging Face name."""
        m = {"model.embed_tokens.weight": WeightSlot("embed_tokens"), "model.norm.weight": WeightSlot("norm")}
        if not self.cfg.tie_word_embeddings:
            m["lm_head.weight"] = WeightSlot("lm_head")
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)
            m.update(layer.weight_map(self.cfg))
        return m

    def to_device(self, device: torch.device) -> None:
        self.to(device)
        self.rotary.cos, self.rotary.sin = self.rotary.cos.to(device), self.rotary.sin.to(device)

    def forward(self, batch: ForwardBatch, kv: KVPool, attn: AttentionBackend, meta: AttentionMetadata) -> torch.Tensor:
        """Run all layers over the batch's T tokens, writing their K/V into `kv`.

        Returns the final-normed hidden states of the rows in batch.logits_indices: [n, hidden].
        """
        if self.tp is None:
            hidden = F.embedding(batch.input_ids, self.embed_tokens).to(self.act_dtype)  # [T, hidden]
        else:  # vocab-parallel: this rank's rows, summed over ranks
            hidden = self.tp.embed(batch.input_ids, self.embed_tokens).to(self.act_dtype)
        if batch.embed_rows is not None:  # image embeddings in place of their placeholder tokens' embeddings
            assert batch.embed_values is not None
            hidden.index_copy_(0, batch.embed_rows, batch.embed_values.to(hidden.dtype))
        cos, sin = self.rotary.lookup(batch.positions, self.act_dtype)  # [T, 1, D / 2] each
        residual: torch.Tensor | None = None
        fused = self.fused_decode
        if (
            fused is not None
            and isinstance(attn, NativeAttentionBackend)
            and self._fused_with == (self.linear, self.ops)
            and fused.takes(hidden.shape[0], meta.flat_decode, meta.extend_rows)
            and (not any(self.cfg.layer_windows) or meta.max_seq_len <= min(w for w in self.cfg.layer_windows if w))
        ):
            assert meta.flat_decode is not None
            first = self.layers[0]
            assert isinstance(first, DecoderLayer)
            x0 = self.ops.rms_norm(hidden, first.input_norm, first.eps)  # layer 0's norm, as its forward does it
            if fused.pool is not kv:  # the caches' addresses, once per pool
                n = len(self.layers)
                fused.bind_caches(kv, [kv.k(i) for i in range(n)], [kv.v(i) for i in range(n)])
            hidden, residual = fused.run(x0, hidden, cos, sin, batch.out_pages, batch.out_offsets, meta.flat_decode)
        else:
            for layer in self.layers:
                hidden, residual = layer(hidden, residual, cos, sin, batch, kv, attn, meta)
        assert residual is not None
        idx = batch.logits_indices
        if idx.numel() != hidden.shape[0] or batch.num_prompt_rows:
            hidden, residual = hidden.index_select(0, idx), residual.index_select(0, idx)
        out, _ = self.ops.fused_add_rms_norm(hidden, residual, self.norm, self.cfg.rms_norm_eps)
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden] -> float32 logits [n, vocab]."""
        logits = self.linear.apply(hidden, self.packed["lm_head"]).float()
        return logits if self.tp is None else self.tp.gather_logits(logits)  # vocab-parallel: every rank's columns
