"""The mixture-of-experts MLP (Qwen3-MoE, Mixtral; gpt-oss's and DeepSeek's variants below): a softmax top-k router
and the experts as one grouped GEMM per projection, never a loop over experts.

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
        self.router_bias: nn.Parameter | None = None
        self.b13: nn.Parameter | None = None  # the experts' biases (gpt-oss): [E, 2 * inter_p] after post_load
        self.b2: nn.Parameter | None = None  # [E, hidden]
        self.make_weights(dtype)
        self.stacked = False

    def make_weights(self, dtype: torch.dtype) -> None:
        """The experts' parameters as the checkpoint's tensors load into them."""
        e, h, i = self.num_experts, self.hidden, self.inter
        self.w13 = _param(e * 2 * i, h, dtype=dtype)  # loaded: [E * (gate I; up I), hidden]
        self.w2 = _param(e * h, i, dtype=dtype)  # loaded: [E * hidden, I]

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
        e, h, i = self.num_experts, self.hidden, self.inter
        self._stack(self.w13.data.view(e, 2, i, h).permute(0, 3, 1, 2), self.w2.data.view(e, h, i).transpose(1, 2))

    def _stack(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        """w13 [E, hidden, gate/up, I] and w2 [E, I, hidden] (any strides) into the padded grouped layouts."""
        e, h, i, hp, ip = self.num_experts, self.hidden, self.inter, self.hidden_p, self.inter_p
        packed = w13.new_zeros(e, hp, 2, ip)
        packed[:, :h, :, :i] = w13
        self.w13.data = packed.view(e, hp, 2 * ip)
        down = w2.new_zeros(e, ip, hp)
        down[:, :i, :h] = w2
        self.w2.data = down
        self.stacked = True

    def activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[rows, 2 * inter_p] -> [rows, inter_p]: silu(gate) * up (a padded column stays 0)."""
        return F.silu(gate_up[:, : self.inter_p]) * gate_up[:, self.inter_p :]

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
        expert = flat.index_select(0, order)  # each sorted row's expert: the rows of the biases (gpt-oss)
        if self.b13 is not None:
            gate_up = gate_up + self.b13.index_select(0, expert)
        act = self.activate(gate_up)
        out = torch._grouped_mm(act.contiguous(), self.w2, offs=offs)[:, : self.hidden]  # [T * k, hidden]
        if self.b2 is not None:
            out = out + self.b2.index_select(0, expert)
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
        h = self.hidden
        for e in range(self.num_experts):
            tok, slot = (ids == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            gate_up = x.index_select(0, tok) @ self.w13[e, :h]
            if self.b13 is not None:
                gate_up = gate_up + self.b13[e]
            y = self.activate(gate_up) @ self.w2[e, :, :h]
            if self.b2 is not None:
                y = y + self.b2[e]
            out.index_add_(0, tok, y * weights[tok, slot].unsqueeze(1))
        return out.to(dtype)


class GptOssMoEBlock(MoEBlock):
    """gpt-oss's experts: a router with a bias whose top-k logits are softmaxed (over the k only), experts with
    biases and a clamped SwiGLU, stored fused in the checkpoint as [E, in, out] with gate and up interleaved
    (gate_up_proj [E, hidden, 2I]: column 2j is gate j, 2j + 1 up j; down_proj [E, I, hidden])."""

    def __init__(
        self, hidden: int, inter: int, experts: int, top_k: int, alpha: float, limit: float, dtype: torch.dtype
    ) -> None:
        super().__init__(hidden, inter, experts, top_k, False, dtype)
        self.alpha, self.limit = alpha, limit
        self.router_bias = _param(experts, dtype=dtype)
        self.b13 = _param(experts, 2 * inter, dtype=dtype)
        self.b2 = _param(experts, hidden, dtype=dtype)

    def make_weights(self, dtype: torch.dtype) -> None:
        e, h, i = self.num_experts, self.hidden, self.inter
        self.w13 = _param(e, h, 2 * i, dtype=dtype)
        self.w2 = _param(e, i, h, dtype=dtype)

    def weight_map(self, pre: str, me: str, names: tuple[str, str, str, str]) -> dict[str, WeightSlot]:
        """gpt-oss's names (what its BF16 checkpoints and save_pretrained write); `names` is not used."""
        m = {
            f"{pre}mlp.router.weight": WeightSlot(me + "router"),
            f"{pre}mlp.router.bias": WeightSlot(me + "router_bias"),
        }
        for ours, theirs in (("w13", "gate_up_proj"), ("b13", "gate_up_proj_bias"), ("w2", "down_proj")):
            m[f"{pre}mlp.experts.{theirs}"] = WeightSlot(me + ours)
        m[f"{pre}mlp.experts.down_proj_bias"] = WeightSlot(me + "b2")
        return m

    @torch.no_grad()
    def post_load(self) -> None:
        """De-interleave gate and up (columns and biases) into MoEBlock's padded halves."""
        assert self.b13 is not None
        e, h, i, ip = self.num_experts, self.hidden, self.inter, self.inter_p
        self._stack(self.w13.data.view(e, h, i, 2).transpose(2, 3), self.w2.data)
        bias = self.b13.data.new_zeros(e, 2, ip)
        bias[:, :, :i] = self.b13.data.view(e, i, 2).transpose(1, 2)
        self.b13.data = bias.view(e, 2 * ip)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x, self.router, self.router_bias)  # [T, E]
        top, ids = logits.topk(self.top_k, dim=-1)
        return top.softmax(dim=-1), ids

    def activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        """(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = clamp(gate, max=limit); 0 where padded."""
        gate = gate_up[:, : self.inter_p].clamp(max=self.limit)
        up = gate_up[:, self.inter_p :].clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))


class DeepseekMoEBlock(MoEBlock):
    """DeepSeek-V2 / V3's routed experts (the shared ones are the decoder layer's dense MLP): MoEBlock's experts and
    names (mlp.gate, mlp.experts.{e}.gate_proj ...), a grouped router whose weights are scaled by `scale`.

    The router runs in fp32 as transformers' does. V2 (sigmoid False): softmax scores; with groups > 1 each group is
    ranked by its best score and only the best `topk_groups` groups' experts may be picked. V3 (sigmoid True): sigmoid
    scores plus e_score_correction_bias choose (groups ranked by the sum of their best two), the unbiased scores of
    the chosen weigh them, renormalised where norm_topk says so."""

    def __init__(
        self,
        hidden: int,
        inter: int,
        experts: int,
        top_k: int,
        norm_topk: bool,
        groups: tuple[int, int],
        scale: float,
        sigmoid: bool,
        dtype: torch.dtype,
    ) -> None:
        super().__init__(hidden, inter, experts, top_k, norm_topk, dtype)
        self.groups, self.topk_groups = groups
        self.scale, self.sigmoid = scale, sigmoid
        # selection only, so kept in fp32 (transformers' buffer is fp32 whatever the model's dtype)
        self.correction = _param(experts, dtype=torch.float32) if sigmoid else None

    def weight_map(self, pre: str, me: str, names: tuple[str, str, str, str]) -> dict[str, WeightSlot]:
        m = super().weight_map(pre, me, names)
        if self.correction is not None:
            m[f"{pre}{names[0]}.e_score_correction_bias"] = WeightSlot(me + "correction")
        return m

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x.float(), self.router.float())  # [T, E]
        scores = logits.sigmoid() if self.sigmoid else logits.softmax(dim=-1)
        choice = scores if self.correction is None else scores + self.correction
        if self.groups > 1:
            grouped = choice.view(-1, self.groups, self.num_experts // self.groups)
            best = grouped.topk(2, dim=-1).values.sum(-1) if self.sigmoid else grouped.amax(dim=-1)  # [T, groups]
            keep = torch.zeros_like(best, dtype=torch.bool)
            keep.scatter_(1, best.topk(self.topk_groups, dim=-1).indices, True)
            choice = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view_as(choice)
        ids = choice.topk(self.top_k, dim=-1).indices
        top = scores.gather(1, ids)
        if self.norm_topk:
            top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
        return (top * self.scale).to(x.dtype), ids
