"""The layout of a KV pool: what an engine, the kvstore and the control plane agree on before pages move.

An instance advertises it in etcd (shared.cluster.instance) and the hand-off checks it, so it lives here, in the
leaf every one of them imports, rather than in the engine that allocates the pool.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVLayout:
    """How a KV pool is laid out in memory; the hand-off protocol negotiates on this.

    The pool is one contiguous buffer, page-major, so that one page of one sequence (all layers, K and V) is one
    contiguous region a transfer engine can move with a single descriptor:
        buffer: [num_pages, num_layers, 2 (K, V), page_size, num_kv_heads, head_dim]
    """

    dtype: str  # "float32" | "bfloat16" | "float16" | "fp8_e4m3" (one byte: float8_e4m3fn pages, see kv_pool.py)
    page_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int

    @property
    def dtype_bytes(self) -> int:
        return {"float32": 4, "fp8_e4m3": 1}.get(self.dtype, 2)

    @property
    def page_bytes(self) -> int:
        return self.num_layers * 2 * self.page_size * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def compatible_with(self, other: KVLayout) -> bool:
        return self == other
