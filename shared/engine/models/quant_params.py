"""The parameters, checkpoint slots and packed forms of a decoder layer's quantized projections (qkv, o, gate_up,
down), by quantization method (shared.config.quantization.QuantSpec):

  fp8: <key>_weight in float8_e4m3fn plus <key>_weight_scale [rows, ceil(in / 128)] float32, the checkpoint's
       `weight_scale_inv` blocks repeated per row (kernels/fp8_weight.py); compressed-tensors' per-channel and
       per-tensor `weight_scale` are [rows, 1] (a tensor's one scale repeated over its rows: q, k and v keep
       their own);
  awq, gptq: <key>_qweight / <key>_qzeros / <key>_scales, the checkpoint's `qweight` / `qzeros` / `scales`
       transposed to rows of output columns (kernels/int4_weight.py), and GPTQ's `g_idx` (i // group without
       act-order: kept, not read); <key>_weight holds nothing.
"""

from __future__ import annotations

import torch
from torch import nn

from shared.config.quantization import QuantSpec
from shared.engine.models.slots import WeightSlot
from shared.kernels.fp8_weight import Fp8BlockWeight
from shared.kernels.int4_weight import Int4Weight
from shared.kernels.linear import PackedWeight

PROJECTIONS = ("qkv", "o", "gate_up", "down")
# a per-tensor scale's row block: more rows than any projection has, so its one value covers the whole slice
ALL_ROWS = 1 << 30


def weight_dtype(quant: QuantSpec | None, dtype: torch.dtype) -> torch.dtype:
    """The dtype of the projections' <key>_weight parameters."""
    return dtype if quant is None else torch.float8_e4m3fn if quant.method == "fp8" else dtype


def _param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)


def add_params(layer: nn.Module, quant: QuantSpec) -> None:
    """Register the quantized projections' parameters on `layer`, whose <key>_weight parameters give the shapes."""
    for key in PROJECTIONS:
        w = getattr(layer, f"{key}_weight")
        out, inner = w.shape
        if quant.method == "fp8":
            cols = -(-inner // quant.weight_block[1]) if quant.strategy == "block" else 1
            layer.register_parameter(f"{key}_weight_scale", _param(out, cols, dtype=torch.float32))
            continue
        groups = inner // quant.group_size
        if out % 8 or inner % 8 or inner % quant.group_size:
            raise ValueError(
                f"awq: a {out} x {inner} projection is not whole int32s of 8 output columns by groups of "
                f"{quant.group_size} inputs"
            )
        gptq = quant.method == "gptq"
        qshape = (out, inner // 8) if gptq else (out // 8, inner)
        layer.register_parameter(f"{key}_qweight", _param(*qshape, dtype=torch.int32))
        if gptq:
            layer.register_parameter(f"{key}_g_idx", _param(inner, dtype=torch.int32))
        layer.register_parameter(f"{key}_qzeros", _param(out // 8, groups, dtype=torch.int32))
        layer.register_parameter(f"{key}_scales", _param(out, groups, dtype=torch.float16))
        w.data = w.data.new_empty(0)  # the int4 tensors are the weight


def quant_slots(m: dict[str, WeightSlot], me: str, quant: QuantSpec) -> dict[str, WeightSlot]:
    """The layer's weight map `m` with the quantized projections' checkpoint tensors in place of / beside theirs."""
    projections = {f"{me}{k}_weight": k for k in PROJECTIONS}
    out = {n: s for n, s in m.items() if quant.method == "fp8" or s.param not in projections}
    for name, s in m.items():
        if s.param not in projections:
            continue
        key, base = projections[s.param], name.removesuffix("weight")
        if quant.method == "fp8":
            rows = {"block": quant.weight_block[0], "channel": 1}.get(quant.strategy, ALL_ROWS)
            out[base + quant.scale_suffix] = WeightSlot(f"{me}{key}_weight_scale", s.start, s.end, row_block=rows)
            continue
        if (s.start or 0) % 8 or (s.end or 0) % 8:
            raise ValueError(f"awq: {name} starts or ends inside an int32 of 8 output columns of {key}")
        r0, r1 = (None, None) if s.start is None else (s.start // 8, (s.end or 0) // 8)  # 8 columns per int32
        gptq = quant.method == "gptq"
        q0, q1 = (s.start, s.end) if gptq else (r0, r1)  # GPTQ packs inputs, AWQ outputs
        out[base + "qweight"] = WeightSlot(f"{me}{key}_qweight", q0, q1, transpose=True)
        if gptq:
            out[base + "g_idx"] = WeightSlot(f"{me}{key}_g_idx")
        out[base + "qzeros"] = WeightSlot(f"{me}{key}_qzeros", r0, r1, transpose=True)
        out[base + "scales"] = WeightSlot(f"{me}{key}_scales", s.start, s.end, transpose=True)
    return out


def packed(layer: nn.Module, quant: QuantSpec) -> dict[str, PackedWeight]:
    """The quantized projections as the dequantizing backend (kernels/dequant_linear.py) takes them."""
    if quant.method == "fp8":
        whole_rows = quant.strategy != "block"  # one scale column: the block is the whole input dimension
        return {
            k: Fp8BlockWeight(
                w := getattr(layer, f"{k}_weight"),
                getattr(layer, f"{k}_weight_scale"),
                int(w.shape[1]) if whole_rows else quant.weight_block[1],
            )
            for k in PROJECTIONS
        }
    return {
        k: Int4Weight(
            getattr(layer, f"{k}_qweight"),
            getattr(layer, f"{k}_qzeros"),
            getattr(layer, f"{k}_scales"),
            quant.group_size,
            quant.method,
            quant.zero_offset,
        )
        for k in PROJECTIONS
    }
