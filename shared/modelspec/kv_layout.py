"""The layout of a KV pool: what an engine, the kvstore and the control plane agree on before pages move.

An instance advertises it in etcd (shared.cluster.instance) and the hand-off checks it, so it lives here, in the
leaf every one of them imports, rather than in the engine that allocates the pool.
"""

from __future__ import annotations

from dataclasses import dataclass

# What one page holds per layer:
#   "mha": K and V of every KV head (Llama, Qwen, Gemma, ...);
#   "mla": one latent row per token and no V (DeepSeek-V2/V3's multi-head latent attention): the RMS-normed
#          compressed KV (kv_lora_rank) followed by the roped shared key (qk_rope_head_dim); every head's keys and
#          values are decompressed from it at attention time, so the cache is one "head" of that width.
KV_LAYOUT_KINDS = ("mha", "mla")


@dataclass(frozen=True)
class KVLayout:
    """How a KV pool is laid out in memory; the hand-off protocol negotiates on this.

    The pool is one contiguous buffer, page-major, so that one page of one sequence (all layers, K and V) is one
    contiguous region a transfer engine can move with a single descriptor:
        buffer: [num_pages, num_layers, planes, page_size, num_kv_heads, head_dim]
    planes is 2 (K, V) for kind "mha"; 1 (the latent) for kind "mla", whose num_kv_heads is 1 and head_dim the
    latent row's width (kv_lora_rank + qk_rope_head_dim).
    """

    dtype: str  # "float32" | "bfloat16" | "float16" | "fp8_e4m3" (one byte: float8_e4m3fn pages, see kv_pool.py)
    page_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kind: str = "mha"  # KV_LAYOUT_KINDS; last and defaulted, so every "mha" layout reads and compares as before

    def __post_init__(self) -> None:
        if self.kind not in KV_LAYOUT_KINDS:
            raise ValueError(f"KV layout kind {self.kind!r} is unknown; use one of: {', '.join(KV_LAYOUT_KINDS)}")
        if self.kind == "mla" and self.num_kv_heads != 1:
            raise ValueError(
                f"an mla KV layout holds one latent row per token (num_kv_heads 1, got {self.num_kv_heads})"
            )

    @property
    def planes(self) -> int:
        """Tensors per layer in a page: K and V (mha), or the latent alone (mla)."""
        return 2 if self.kind == "mha" else 1

    @property
    def dtype_bytes(self) -> int:
        return {"float32": 4, "fp8_e4m3": 1}.get(self.dtype, 2)

    @property
    def page_bytes(self) -> int:
        return self.num_layers * self.planes * self.page_size * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def compatible_with(self, other: KVLayout) -> bool:
        return self == other
