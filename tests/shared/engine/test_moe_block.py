"""The grouped MoE blocks (shared/engine/models/moe.py) against a plain per-token reference written from the
checkpoint's per-expert tensors: hidden and expert sizes off the 16-byte alignment _grouped_mm needs, experts that
get no rows, a single token, fp32 and bf16, with and without top-k renormalisation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shared.engine.models.moe import GptOssMoEBlock, MoEBlock


def make_block(hidden: int, inter: int, experts: int, top_k: int, norm: bool, dtype: torch.dtype):
    """A loaded block and the per-expert (gate, up, down) tensors and router it was loaded from."""
    g = torch.Generator().manual_seed(hidden * 31 + inter)
    block = MoEBlock(hidden, inter, experts, top_k, norm, dtype)
    router = torch.randn(experts, hidden, generator=g) * 0.3
    per = [
        (torch.randn(inter, hidden, generator=g) * 0.2, torch.randn(inter, hidden, generator=g) * 0.2)
        + (torch.randn(hidden, inter, generator=g) * 0.2,)
        for _ in range(experts)
    ]
    params = dict(block.named_parameters())
    for name, slot in block.weight_map("", "", ("gate", "e{e}.gate", "e{e}.up", "e{e}.down")).items():
        if name == "gate.weight":
            src = router
        else:
            e, kind = int(name.split(".")[0][1:]), name.split(".")[1]
            src = per[e][("gate", "up", "down").index(kind)]
        params[slot.param].data[slot.start : slot.end] = src.to(dtype)
    block.post_load()
    return block, router.to(dtype), [tuple(t.to(dtype) for t in p) for p in per]


def reference(x: torch.Tensor, router: torch.Tensor, per, top_k: int, norm: bool) -> torch.Tensor:
    """Token by token, in float64: softmax, top-k, sum of the chosen experts' SwiGLU MLPs."""
    out = []
    for row in x.double():
        probs = (router.double() @ row).softmax(-1)
        w, ids = probs.topk(top_k)
        if norm:
            w = w / w.sum()
        acc = torch.zeros_like(row)
        for weight, e in zip(w, ids.tolist(), strict=True):
            gate, up, down = (t.double() for t in per[e])
            acc += weight * (down @ (F.silu(gate @ row) * (up @ row)))
        out.append(acc)
    return torch.stack(out)


@pytest.mark.parametrize("hidden,inter", [(32, 16), (30, 13), (72, 38)])
@pytest.mark.parametrize("tokens", [1, 3, 16, 40])
@pytest.mark.parametrize("norm", [True, False])
def test_grouped_matches_reference_fp32(hidden: int, inter: int, tokens: int, norm: bool) -> None:
    block, router, per = make_block(hidden, inter, 8, 2, norm, torch.float32)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(tokens))
    ref = reference(x, router, per, 2, norm).float()
    got = block(x)
    assert got.shape == (tokens, hidden) and got.dtype == torch.float32
    assert (got - ref).abs().max().item() < 1e-5
    assert (block.forward_loop(x) - ref).abs().max().item() < 1e-5
    _, ids = block.route(x)
    if tokens <= 3:  # at most 6 of 8 experts have rows: empty groups in the grouped call
        assert ids.unique().numel() < 8


def test_bf16_weights_under_fp32_activations() -> None:
    """The native CPU kernels keep fp32 activations over bf16 weights: the block computes in bf16 and answers in
    the activations' dtype."""
    block, router, per = make_block(64, 24, 8, 2, True, torch.bfloat16)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(3))
    got = block(x)
    assert got.dtype == torch.float32
    ref = reference(x.bfloat16(), router, per, 2, True).float()
    assert (got - ref).abs().max().item() < 0.05 * ref.abs().max().item()


@pytest.mark.parametrize("hidden,inter", [(30, 13), (32, 16)])
@pytest.mark.parametrize("tokens", [1, 3, 16])
def test_gpt_oss_block_matches_reference(hidden: int, inter: int, tokens: int) -> None:
    """gpt-oss's block from its fused checkpoint tensors (gate and up interleaved, [E, in, out]) against a float64
    per-token reference: biased router, softmax over the top-k logits, biased experts, the clamped SwiGLU."""
    e, k, alpha, limit = 8, 2, 1.702, 0.5
    g = torch.Generator().manual_seed(hidden + tokens)
    block = GptOssMoEBlock(hidden, inter, e, k, alpha, limit, torch.float32)
    t = {
        "router": torch.randn(e, hidden, generator=g) * 0.3,
        "router_bias": torch.randn(e, generator=g) * 0.3,
        "w13": torch.randn(e, hidden, 2 * inter, generator=g) * 0.3,
        "b13": torch.randn(e, 2 * inter, generator=g) * 0.3,
        "w2": torch.randn(e, inter, hidden, generator=g) * 0.3,
        "b2": torch.randn(e, hidden, generator=g) * 0.3,
    }
    params = dict(block.named_parameters())
    for name, slot in block.weight_map("", "", ("",) * 4).items():
        params[slot.param].data.copy_(
            {
                "mlp.router.weight": t["router"],
                "mlp.router.bias": t["router_bias"],
                "mlp.experts.gate_up_proj": t["w13"],
                "mlp.experts.gate_up_proj_bias": t["b13"],
                "mlp.experts.down_proj": t["w2"],
                "mlp.experts.down_proj_bias": t["b2"],
            }[name]
        )
    block.post_load()
    x = torch.randn(tokens, hidden, generator=g)
    d = {n: v.double() for n, v in t.items()}
    ref = []
    for row in x.double():
        top, ids = (d["router"] @ row + d["router_bias"]).topk(k)
        acc = torch.zeros_like(row)
        for w, i in zip(top.softmax(-1), ids.tolist(), strict=True):
            gu = row @ d["w13"][i] + d["b13"][i]
            gate, up = gu[0::2].clamp(max=limit), gu[1::2].clamp(-limit, limit)
            acc += w * ((up + 1) * gate * torch.sigmoid(gate * alpha) @ d["w2"][i] + d["b2"][i])
        ref.append(acc)
    want = torch.stack(ref).float()
    assert (block(x) - want).abs().max().item() < 1e-5
    assert (block.forward_loop(x) - want).abs().max().item() < 1e-5
