"""bf16 KV pages through the store's tiers: the bytes a bf16 pool holds come back byte for byte from the DRAM arena
and the disk tier, and a bf16 layout is a namespace of its own (its pages never serve an fp32 pool)."""

from __future__ import annotations

from pathlib import Path

import torch

from shared.engine.kv_pool import KVPool
from shared.modelspec.kv_layout import KVLayout
from tests.services.kvstore.tier_round_trip import assert_pages_round_trip

BF16 = KVLayout(dtype="bfloat16", page_size=4, num_layers=2, num_kv_heads=2, head_dim=8)
FP32 = KVLayout(dtype="float32", page_size=4, num_layers=2, num_kv_heads=2, head_dim=8)


def _pool() -> KVPool:
    """A bf16 pool whose pages hold values a bf16 cache really holds (rounded from fp32, every bit pattern used)."""
    pool = KVPool(BF16, 6)
    g = torch.Generator().manual_seed(0)
    pool.buffer.copy_(torch.randn(pool.buffer.shape, generator=g).to(torch.bfloat16))
    return pool


def test_bf16_pages_round_trip_the_arena_and_the_disk_tier_byte_for_byte(tmp_path: Path) -> None:
    assert BF16.page_bytes * 2 == FP32.page_bytes  # half the bytes of the same fp32 layout
    assert_pages_round_trip(_pool(), tmp_path)


def test_a_bf16_layout_is_its_own_namespace() -> None:
    assert not BF16.compatible_with(FP32) and BF16 != FP32
