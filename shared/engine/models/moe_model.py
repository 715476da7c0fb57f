"""Qwen3-MoE, Mixtral and gpt-oss: the Llama-family decoder (Qwen3's q/k norm, Mistral's window, gpt-oss's
attention biases, alternating windows and sinks) whose MLP is the routed experts of moe.py on the layers the config
makes sparse (Qwen3-MoE's mlp_only_layers / decoder_sparse_step keep a dense MLP on the others)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from shared.config.quantization import QuantSpec
from shared.engine.models.config import ModelArchConfig
from shared.engine.models.llama import DecoderLayer, LlamaForCausalLM
from shared.engine.models.moe import GptOssMoEBlock, MoEBlock
from shared.engine.models.slots import WeightSlot
from shared.kernels.elementwise import TORCH_OPS, ElementwiseOps
from shared.kernels.linear import LinearBackend

if TYPE_CHECKING:
    from shared.engine.models.tp_hooks import TPComm

# (router, gate, up, down) below model.layers.N., {e} the expert: the names hub checkpoints use, and what
# transformers' save_pretrained writes back (it unfuses its in-memory stacked experts on save)
EXPERT_NAMES = {
    "qwen3_moe": ("mlp.gate", "mlp.experts.{e}.gate_proj", "mlp.experts.{e}.up_proj", "mlp.experts.{e}.down_proj"),
    "mixtral": (
        "block_sparse_moe.gate",
        "block_sparse_moe.experts.{e}.w1",
        "block_sparse_moe.experts.{e}.w3",
        "block_sparse_moe.experts.{e}.w2",
    ),
}


class MoeDecoderLayer(DecoderLayer):
    """A DecoderLayer whose MLP is a MoEBlock where cfg.is_moe(layer_id) (self.moe), the dense MLP elsewhere."""

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
        self.moe: MoEBlock | None = None
        if cfg.is_moe(layer_id) and cfg.moe_kind == "gpt_oss":
            self.moe = GptOssMoEBlock(
                cfg.hidden_size,
                cfg.moe_intermediate_size,
                cfg.num_experts,
                cfg.experts_per_token,
                cfg.swiglu_alpha,
                cfg.swiglu_limit,
                dtype,
            )
        elif cfg.is_moe(layer_id):
            self.moe = MoEBlock(
                cfg.hidden_size,
                cfg.moe_intermediate_size,
                cfg.num_experts,
                cfg.experts_per_token,
                cfg.norm_topk_prob,
                dtype,
            )

    def dense_intermediate(self, cfg: ModelArchConfig) -> int:
        return 0 if cfg.is_moe(self.layer_id) else cfg.intermediate_size

    def weight_map(self, cfg: ModelArchConfig) -> dict[str, WeightSlot]:
        m = super().weight_map(cfg)
        if self.moe is None:
            return m
        pre, me = f"model.layers.{self.layer_id}.", f"layers.{self.layer_id}."
        dense = (me + "gate_up_weight", me + "down_weight")
        m = {name: slot for name, slot in m.items() if slot.param not in dense}
        return m | self.moe.weight_map(pre, me + "moe.", EXPERT_NAMES.get(cfg.model_type, ("",) * 4))

    def use_linear(self, backend: LinearBackend) -> None:
        if self.moe is None:
            super().use_linear(backend)
            return
        # qkv and o on the backend; the experts are grouped GEMMs of their own (moe.py)
        self.linear, self.exact = backend, backend.exact()
        self.packed = {"qkv": backend.pack(self.qkv_weight), "o": backend.pack(self.o_weight)}
        if backend.name != "torch":  # the packed copies replace the originals
            for p in (self.qkv_weight, self.o_weight):
                p.data = p.data.new_empty(0)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return super().mlp(x) if self.moe is None else self.moe(x)


class MoeForCausalLM(LlamaForCausalLM):
    """Qwen3-MoE / Mixtral / gpt-oss causal LM over a paged KV pool."""

    layer_class = MoeDecoderLayer

    def post_load(self) -> None:
        """The experts' loaded weights stacked for the grouped GEMMs, once."""
        for layer in self.layers:
            assert isinstance(layer, MoeDecoderLayer)
            if layer.moe is not None:
                layer.moe.post_load()
