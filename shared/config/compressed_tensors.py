"""compressed-tensors checkpoints (llm-compressor's exports, `quant_method: compressed-tensors`): which ones the
engine runs, read from their `quantization_config`.

Served: FP8 e4m3 weights with one `weight_scale` per output channel or per tensor (llm-compressor's FP8_DYNAMIC and
FP8 schemes, format float-quantized or naive-quantized: both store the e4m3 bytes as they are), one config group
targeting every Linear, nothing but the lm_head ignored. Input activations, dynamic or static (`input_scale`), run
unquantized: the engine is weight-only (fp8 x scale, then a full-precision GEMM), the arithmetic transformers runs on
the dequantized weights. Everything else (int4/int8 pack-quantized, block or group fp8, sparsity, several groups,
layers left unquantized) is refused naming what the checkpoint declares.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FORMATS = ("float-quantized", "naive-quantized")
STRATEGIES = ("channel", "tensor")


def describe(q: Mapping[str, Any]) -> str:
    """'compressed-tensors (int 4-bit, group)': the scheme of its first config group, for a refusal."""
    groups = q.get("config_groups") or {}
    first: Any = next(iter(groups.values()), {}) if isinstance(groups, Mapping) else {}
    w = first.get("weights") or {} if isinstance(first, Mapping) else {}
    if not w:
        return "compressed-tensors"
    return f"compressed-tensors ({w.get('type', '?')} {w.get('num_bits', '?')}-bit, {w.get('strategy', '?')})"


def _only_lm_head(ignore: Any) -> bool:
    names = [str(n) for n in ignore or []]
    return all(n == "lm_head" or (n.startswith("re:") and n.endswith("lm_head")) for n in names)


def fp8_strategy(q: Mapping[str, Any]) -> str:
    """'channel' or 'tensor' for a compressed-tensors FP8 checkpoint the engine runs; ValueError with what it
    declares (for the refusal's 'quantization X is not supported') otherwise."""
    what = describe(q)
    groups = q.get("config_groups") or {}
    if not isinstance(groups, Mapping) or len(groups) != 1:
        raise ValueError(f"{what!r} with {len(groups) if isinstance(groups, Mapping) else 'no'} config groups")
    group = next(iter(groups.values()))
    w = group.get("weights") or {}
    fmt = q.get("format")
    if fmt not in FORMATS:
        raise ValueError(f"{what!r} in format {fmt!r}")
    if w.get("type") != "float" or w.get("num_bits") != 8 or w.get("strategy") not in STRATEGIES:
        raise ValueError(repr(what))
    if not w.get("symmetric", True) or w.get("dynamic"):
        raise ValueError(f"{what!r}, asymmetric or dynamic weights")
    act = group.get("input_activations")
    if act and (act.get("type") != "float" or act.get("num_bits") != 8):
        raise ValueError(f"{what!r} with {act.get('type')} {act.get('num_bits')}-bit activations")
    if group.get("output_activations"):
        raise ValueError(f"{what!r} with quantized output activations")
    if list(group.get("targets") or []) != ["Linear"]:
        raise ValueError(f"{what!r} targeting {group.get('targets')!r} (every Linear is supported)")
    if not _only_lm_head(q.get("ignore")):
        raise ValueError(f"{what!r} leaving {q.get('ignore')!r} unquantized (only the lm_head may be)")
    if q.get("sparsity_config") or q.get("transform_config"):
        raise ValueError(f"{what!r} with sparsity or transforms")
    return str(w["strategy"])
