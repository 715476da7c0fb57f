"""Per-layer fp8 KV scales from a checkpoint: `model.layers.N.self_attn.k_scale` and `v_scale` (one float each, the
spelling of vLLM's and llm-compressor's fp8-KV exports), or one `kv_scale` for both (older exports).

A checkpoint without them runs with scale 1.0: fp8 e4m3 holds +-448 with 3 mantissa bits, and the K/V of the models
served here sit well inside that range (the bundled model's |K| stays under ~20), so the scale only matters for
outliers. The weight loader ignores these tensors (weights.py), whatever the KV dtype.
"""

from __future__ import annotations

import re
from pathlib import Path

from safetensors import safe_open

# the names, as suffixes the weight loader skips too
KV_SCALE_SUFFIXES = ("self_attn.k_scale", "self_attn.v_scale", "self_attn.kv_scale")
_NAME = re.compile(r"^model\.layers\.(\d+)\.self_attn\.(k_scale|v_scale|kv_scale)$")


def read_kv_scales(files: list[Path], num_layers: int) -> tuple[list[float], list[float]] | None:
    """(k_scales, v_scales) per layer from the checkpoint's files, or None when it has none. ValueError naming the
    layers a partial set leaves out."""
    k: dict[int, float] = {}
    v: dict[int, float] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                m = _NAME.match(name)
                if m is None:
                    continue
                layer, which = int(m.group(1)), m.group(2)
                value = float(f.get_tensor(name).float().reshape(-1)[0])
                if which in ("k_scale", "kv_scale"):
                    k[layer] = value
                if which in ("v_scale", "kv_scale"):
                    v[layer] = value
    if not k and not v:
        return None
    missing = sorted(set(range(num_layers)) - (set(k) & set(v)))
    if missing:
        raise ValueError(
            f"the checkpoint's fp8 KV scales leave out layer(s) {missing[:8]}; it needs k_scale and "
            "v_scale for every layer (or none)"
        )
    return [k[i] for i in range(num_layers)], [v[i] for i in range(num_layers)]
