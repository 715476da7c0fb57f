"""The mixture-of-experts MLP (Qwen3-MoE, Mixtral): a softmax top-k router and the experts as one grouped GEMM per
projection, never a loop over experts.

The T * k routed (token, expert) rows are sorted by expert, so each expert's rows are contiguous; then
torch._grouped_mm runs every expert's gate_up GEMM in one call (`offs` = the cumulative row counts, an expert
with no rows is an empty group), silu(gate) * up, and the same for down; the rows are scaled by their router
weights and summed back into their tokens with index_add_.

Weights: the checkpoint's per-expert tensors load into stacked [E * rows, cols] parameters (gate rows then up rows
of each expert in w13, HF's [out, in] layout); `post_load` turns them once into the [E, in, out] layout
_grouped_mm takes, zero-padded so that every dimension is a multiple of 8 elements: _grouped_mm wants strides of
whole 16 bytes (fp32 and bf16 alike), and zero rows and columns add exact zeros.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shared.engine.models.slots import WeightSlot

ALIGN = 8  # elements: 16 bytes of bf16 (32 of fp32): _grouped_mm's stride alignment for either dtype


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)


class MoEBlock(nn.Module):
    """Router + routed experts of one layer: x [T, hidden] -> [T, hidden]."""

    def __init__(self, hidden: int, inter: int, experts: int, top_k: int, norm_topk: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.hidden, self.inter, self.num_experts, self.top_k = hidden, inter, experts, top_k
        self.norm_topk = norm_topk
        self.hidden_p, self.inter_p = _up(hidden), _up(inter)  # padded sizes (post_load)
        self.router = _param(experts, hidden, dtype=dtype)  # [E, hidden]
        self.w13 = _param(experts * 2 * inter, hidden, dtype=dtype)  # loaded: [E * (gate I; up I), hidden]
        self.w2 = _param(experts * hidden, inter, dtype=dtype)  # loaded: [E * hidden, I]
        self.stacked = False

    def weight_map(self, pre: str, me: str, names: tuple[str, str, str, str]) -> dict[str, WeightSlot]:
        """HF names -> slots; names = (router, gate, up, down) as the family spells them below `pre`, with {e} for
        the expert (Qwen3-MoE: mlp.gate, mlp.experts.{e}.gate_proj ...; Mixtral: block_sparse_moe.gate, w1 ...)."""
        router, gate, up, down = names
        i, h = self.inter, self.hidden
        m = {f"{pre}{router}.weight": WeightSlot(me + "router")}
        for e in range(self.num_experts):
            m[f"{pre}{gate.format(e=e)}.weight"] = WeightSlot(me + "w13", 2 * i * e, 2 * i * e + i)
            m[f"{pre}{up.format(e=e)}.weight"] = WeightSlot(me + "w13", 2 * i * e + i, 2 * i * (e + 1))
            m[f"{pre}{down.format(e=e)}.weight"] = WeightSlot(me + "w2", h * e, h * (e + 1))
        return m

    @torch.no_grad()
    def post_load(self) -> None:
        """The loaded weights -> w13 [E, hidden_p, 2 * inter_p] (gate in columns [0, I), up in [inter_p,
        inter_p + I)) and w2 [E, inter_p, hidden_p], zero-padded, once."""
        e, h, i, hp, ip = self.num_experts, self.hidden, self.inter, self.hidden_p, self.inter_p
        w13 = self.w13.data.view(e, 2, i, h)  # [E, gate/up, I, hidden]
        packed = w13.new_zeros(e, hp, 2, ip)
        packed[:, :h, :, :i] = w13.permute(0, 3, 1, 2)
        self.w13.data = packed.view(e, hp, 2 * ip)
        w2 = self.w2.data.view(e, h, i)
        down = w2.new_zeros(e, ip, hp)
        down[:, :i, :h] = w2.transpose(1, 2)
        self.w2.data = down
        self.stacked = True

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] (the weights' dtype) -> (weights [T, k] in x's dtype, expert ids [T, k]), as transformers
        routes: softmax in fp32 over all experts, the top k, renormalised where the family says so."""
        probs = F.linear(x, self.router).float().softmax(dim=-1)  # [T, E]
        top, ids = probs.topk(self.top_k, dim=-1)
        if self.norm_topk:
            top = top / top.sum(dim=-1, keepdim=True)
        return top.to(x.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.stacked, "post_load stacks the experts' weights"
        dtype = x.dtype
        x = x.to(self.router.dtype)  # bf16 weights under fp32 activations (the native CPU kernels): compute in bf16
        weights, ids = self.route(x)
        t, k = ids.shape
        flat = ids.reshape(-1)  # [T * k]: row r is token r // k's (r % k)-th choice
        order = flat.argsort(stable=True)  # the rows grouped by expert, in token order within an expert
        tokens = order // k
        # rows per expert without a host sync (bincount would read the max first)
        counts = torch.zeros(self.num_experts, dtype=torch.int32, device=x.device)
        counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        offs = counts.cumsum(0, dtype=torch.int32)
        rows = x.index_select(0, tokens)  # [T * k, hidden]
        if self.hidden_p != self.hidden:
            rows = F.pad(rows, (0, self.hidden_p - self.hidden))
        gate_up = torch._grouped_mm(rows, self.w13, offs=offs)  # [T * k, 2 * inter_p]
        act = F.silu(gate_up[:, : self.inter_p]) * gate_up[:, self.inter_p :]
        out = torch._grouped_mm(act.contiguous(), self.w2, offs=offs)[:, : self.hidden]  # [T * k, hidden]
        out = out * weights.reshape(-1).index_select(0, order).unsqueeze(1)
        return x.new_zeros(t, self.hidden).index_add_(0, tokens, out).to(dtype)

    def forward_loop(self, x: torch.Tensor) -> torch.Tensor:
        """The same with a Python loop over the experts (one GEMM pair per expert that has rows): the reference
        the grouped call is measured against (bench/moe_layer.py), not used in serving."""
        assert self.stacked, "post_load stacks the experts' weights"
        dtype = x.dtype
        x = x.to(self.router.dtype)
        weights, ids = self.route(x)
        out = x.new_zeros(x.shape[0], self.hidden)
        h, ip = self.hidden, self.inter_p
        for e in range(self.num_experts):
            tok, slot = (ids == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            gate_up = x.index_select(0, tok) @ self.w13[e, :h]
            y = (F.silu(gate_up[:, :ip]) * gate_up[:, ip:]) @ self.w2[e, :, :h]
            out.index_add_(0, tok, y * weights[tok, slot].unsqueeze(1))
        return out.to(dtype)
