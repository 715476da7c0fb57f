"""A checkpoint's `quantization_config` (config.json) -> what the engine must do with its weights, or a refusal.

Read before anything is loaded, by the config passes (so `pdrelay up` and a service refuse at start, in one line) and
by the engine's config parse: a quantized checkpoint the engine cannot run must never reach the weight loader, whose
"the checkpoint does not match the model" error would send the user looking for a wrong config.json.

Supported: FP8 e4m3 weights in square-ish blocks with a float32 `weight_scale_inv` per block (weight = fp8 x scale),
as DeepSeek-V3 and Qwen3-*-FP8 ship them (`quant_method: fp8`, `weight_block_size: [128, 128]`), activations
dynamic; AWQ int4 (`quant_method: awq`, 4 bits, zero points, AutoAWQ's GEMM packing, any group size) and GPTQ int4
(`quant_method: gptq`, 4 bits, grouped, without act-order; v1 and v2 zero points); compressed-tensors FP8 per channel
or per tensor (compressed_tensors.py). The engine runs activations unquantized: dequantize-on-the-fly weights,
full-precision GEMM. Everything else (other compressed-tensors schemes, bitsandbytes, ...) is refused naming the
method and its format.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.config.compressed_tensors import fp8_strategy

# What --quantization accepts (SGLang's flag and spellings): the methods a checkpoint may declare.
QUANTIZATION_METHODS = ("fp8", "awq", "gptq", "compressed-tensors")
# What the engine runs today, as the refusal lists it.
SUPPORTED_QUANTIZATION = (
    "fp8 (block-wise e4m3 with weight_scale_inv, as DeepSeek-V3 and Qwen3-FP8 ship), compressed-tensors fp8 "
    "(e4m3 per channel or per tensor, float-quantized or naive-quantized), awq (4-bit, zero point, gemm), "
    "gptq (4-bit, grouped, no act-order)"
)


@dataclass(frozen=True)
class QuantSpec:
    """How a checkpoint's linear weights are stored. fp8: e4m3 in blocks of `weight_block` (rows, columns), each block
    with one float32 scale named `<weight>_scale_inv` (the dequantized weight is fp8 value x scale). awq: 4-bit
    qweight / qzeros / scales per `group_size` input columns (kernels/int4_weight.py)."""

    method: str
    weight_block: tuple[int, int] = (128, 128)
    scale_suffix: str = "weight_scale_inv"
    group_size: int = 0
    zero_offset: int = 0  # gptq: added to the stored zero points (1 in GPTQ's v1 format, which stores zero - 1)
    # fp8: "block" (weight_block), or compressed-tensors' "channel" (a scale per output row) and "tensor" (one per
    # projection); channel and tensor scales cover whole rows, each repeated per row at load (quant_params.py)
    strategy: str = "block"
    # the quant_method config.json declares where it differs from `method` ("compressed-tensors"): --quantization
    # may name either
    declared: str = ""

    def named_by(self, requested: str) -> bool:
        return requested in (self.method, self.declared)


def _refuse(source: str, what: str) -> ValueError:
    return ValueError(f"{source}: quantization {what} is not supported; supported: {SUPPORTED_QUANTIZATION}")


def parse_quantization(cfg: Mapping[str, Any], source: str = "config.json") -> QuantSpec | None:
    """config.json dict -> QuantSpec (None: an unquantized checkpoint). ValueError naming an unsupported method."""
    q = cfg.get("quantization_config") or cfg.get("compression_config")
    if q is None and isinstance(cfg.get("text_config"), Mapping):
        q = cfg["text_config"].get("quantization_config")
    if not q:
        return None
    if not isinstance(q, Mapping):
        raise ValueError(f"{source}: quantization_config must be an object, got {type(q).__name__}")
    method = str(q.get("quant_method") or q.get("quantization_method") or "unknown").lower()
    if method == "compressed-tensors":
        try:
            strategy = fp8_strategy(q)
        except ValueError as e:
            raise _refuse(source, str(e)) from None
        return QuantSpec("fp8", (1, 0), scale_suffix="weight_scale", strategy=strategy, declared=method)
    if method == "awq":
        return _parse_awq(q, source)
    if method == "gptq":
        return _parse_gptq(q, source)
    if method != "fp8":
        bits = f" ({q['bits']}-bit)" if "bits" in q else ""
        raise _refuse(source, f"{method!r}{bits}")
    fmt = str(q.get("fmt", "e4m3"))
    block = q.get("weight_block_size")
    if fmt != "e4m3":
        raise _refuse(source, f"'fp8' with fmt {fmt!r}")
    if not block:
        raise _refuse(source, "'fp8' per-tensor (no weight_block_size)")
    if q.get("activation_scheme", "dynamic") != "dynamic":
        raise _refuse(source, f"'fp8' with activation_scheme {q['activation_scheme']!r}")
    if len(block) != 2 or not all(isinstance(b, int) and b > 0 for b in block):
        raise ValueError(f"{source}: quantization_config.weight_block_size must be two positive ints, got {block!r}")
    return QuantSpec(method="fp8", weight_block=(int(block[0]), int(block[1])))


def _parse_awq(q: Mapping[str, Any], source: str) -> QuantSpec:
    bits, group, version = q.get("bits", q.get("w_bit")), q.get("group_size", q.get("q_group_size")), q.get("version")
    if bits != 4:
        raise _refuse(source, f"'awq' ({bits}-bit)")
    if str(version or "gemm").lower() != "gemm":
        raise _refuse(source, f"'awq' version {version!r}")
    if not q.get("zero_point", True):
        raise _refuse(source, "'awq' without zero points")
    if not isinstance(group, int) or group <= 0:
        raise ValueError(f"{source}: quantization_config.group_size must be a positive int, got {group!r}")
    return QuantSpec(method="awq", group_size=group)


def _parse_gptq(q: Mapping[str, Any], source: str) -> QuantSpec:
    bits, group, fmt = q.get("bits"), q.get("group_size"), str(q.get("checkpoint_format") or "gptq")
    if bits != 4:
        raise _refuse(source, f"'gptq' ({bits}-bit)")
    if q.get("desc_act"):
        raise _refuse(source, "'gptq' with desc_act (act-order)")
    if fmt not in ("gptq", "gptq_v2"):
        raise _refuse(source, f"'gptq' checkpoint_format {fmt!r}")
    if not isinstance(group, int) or group <= 0:
        raise _refuse(source, f"'gptq' with group_size {group!r}")
    return QuantSpec(method="gptq", group_size=group, zero_offset=1 if fmt == "gptq" else 0)


def check_requested(requested: str | None, spec: QuantSpec | None, model: str) -> str | None:
    """--quantization against what the checkpoint declares: None when they agree (or none was asked), else why not."""
    if requested is None:
        return None
    if spec is None and requested != "fp8":
        return (
            f"--quantization {requested}: {model} is not a quantized checkpoint and only fp8 quantizes one at load; "
            "drop --quantization (or serve a checkpoint quantized with it)"
        )
    if spec is None:
        return None  # fp8 at load (model_runner.py)
    if not spec.named_by(requested):
        declared = spec.declared or spec.method
        return f"--quantization {requested}: {model} is quantized with {declared!r}; drop --quantization"
    return None
