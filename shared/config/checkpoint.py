"""What the memory plan needs to know about a checkpoint, read before any weight is loaded: the shapes in
config.json and the tensor sizes in the safetensors headers (8 bytes of header length, then a JSON header per
file; the weights themselves are never read, so a header-only file plans as well as the real one).

It lives in the config package because the plan is part of resolving a config (`pdrelay up --dry-run` and
`pdrelay config show --plan` must not import an engine); the engine reads the same files with safetensors.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A safetensors header is at most this large (the format's own limit is 100 MB).
_MAX_HEADER = 100 << 20
# Tensors the engine holds in --dtype; every other dtype (F8_E4M3 weights, packed I32 int4, ...) is held as stored.
_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
_STORED_BYTES = {"F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1, "I16": 2, "I32": 4, "U32": 4, "I64": 8}


@dataclass(frozen=True)
class ModelShape:
    """A decoder checkpoint's numbers: parameter count from its headers, the rest from config.json.

    num_params counts the floating-point tensors (held in --dtype); stored_bytes are the bytes of the others, held as
    the checkpoint stores them (quantized weights: fp8 at 1 byte, AWQ/GPTQ int4 packed in int32s)."""

    name: str
    num_params: int
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    stored_bytes: int = 0
    # K and V per layer in a KV page; 1 for MLA's latent rows (then num_kv_heads is 1 and head_dim the row's width)
    kv_planes: int = 2

    def weights_bytes(self, dtype_bytes: int, tp_size: int = 1) -> int:
        """Bytes of the weights one rank holds when served in a dtype of `dtype_bytes` (split evenly over TP)."""
        return -(-(self.num_params * dtype_bytes + self.stored_bytes) // tp_size)

    def kv_heads_per_rank(self, tp_size: int) -> int:
        """KV heads one TP rank holds (heads are replicated when there are fewer than ranks)."""
        return max(1, self.num_kv_heads // tp_size)


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a model directory (the index's shards, model.safetensors, or *.safetensors)."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return sorted({model_dir / f for f in weight_map.values()})
    single = model_dir / "model.safetensors"
    return [single] if single.is_file() else sorted(model_dir.glob("*.safetensors"))


def header_params(path: Path) -> int:
    """Elements of every tensor a safetensors file holds, read from its header alone."""
    return sum(math.prod(t["shape"]) for t in _header(path).values())


def header_sizes(path: Path) -> tuple[int, int]:
    """(elements of the floating-point tensors, bytes of the others) of a safetensors file, from its header."""
    floats = stored = 0
    for t in _header(path).values():
        n = math.prod(t["shape"])
        if t.get("dtype") in _FLOAT_DTYPES:
            floats += n
        else:
            stored += n * _STORED_BYTES.get(t.get("dtype"), 4)
    return floats, stored


def _header(path: Path) -> dict[str, Any]:
    """The tensor entries of a safetensors file's JSON header."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path} is not a safetensors file (shorter than its 8-byte header length)")
        (size,) = struct.unpack("<Q", raw)
        if size > _MAX_HEADER:
            raise ValueError(f"{path} is not a safetensors file (header length {size})")
        header: dict[str, Any] = json.loads(f.read(size))
    return {name: t for name, t in header.items() if name != "__metadata__"}


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    # a vision-language checkpoint plans by its text decoder (the vision tower's weights still count: headers)
    return dict(cfg.get("text_config") or {}) if cfg.get("model_type") == "llava" else cfg


def read_model_shape(model_dir: str | Path) -> ModelShape:
    """config.json + the safetensors headers of `model_dir`. ValueError naming what is missing."""
    d = Path(model_dir)
    config = d / "config.json"
    if not config.is_file():
        raise ValueError(f"{d} has no config.json; point --model at a Hugging Face model directory")
    cfg = _text_config(json.loads(config.read_text()))
    files = checkpoint_files(d)
    missing = [f.name for f in files if not f.is_file()]
    if not files or missing:
        what = f"lists shards that are missing: {', '.join(missing)}" if missing else "has no *.safetensors weights"
        raise ValueError(f"{d} {what}; the memory plan reads the tensor sizes from the safetensors headers")
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    sizes = [header_sizes(f) for f in files]
    kv_heads, planes = int(cfg.get("num_key_value_heads") or heads), 2
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    if cfg.get("kv_lora_rank"):  # DeepSeek's MLA: one latent row per token and layer (shared/modelspec/kv_layout.py)
        kv_heads, head_dim, planes = 1, int(cfg["kv_lora_rank"]) + int(cfg["qk_rope_head_dim"]), 1
    return ModelShape(
        name=d.name,
        num_params=sum(n for n, _ in sizes),
        stored_bytes=sum(b for _, b in sizes),
        num_layers=int(cfg["num_hidden_layers"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        kv_planes=planes,
        vocab_size=int(cfg["vocab_size"]),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
    )
