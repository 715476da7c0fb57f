"""fp8 KV pages (--kv-cache-dtype fp8_e4m3) through the store's tiers: the bytes an fp8 pool holds come back byte
for byte from the DRAM arena and the disk tier, and an fp8 layout is a namespace of its own (its pages never serve
a bf16 or fp32 pool, nor the other way round)."""

from __future__ import annotations

from pathlib import Path

import torch

from shared.engine.kv_pool import KVPool
from shared.modelspec.kv_layout import KVLayout
from tests.services.kvstore.tier_round_trip import assert_pages_round_trip

FP8 = KVLayout(dtype="fp8_e4m3", page_size=4, num_layers=2, num_kv_heads=2, head_dim=8)
BF16 = KVLayout(dtype="bfloat16", page_size=4, num_layers=2, num_kv_heads=2, head_dim=8)


def _pool() -> KVPool:
    """An fp8 pool whose pages hold every e4m3 bit pattern but NaN's (random bytes, NaN codes cleared)."""
    pool = KVPool(FP8, 6)
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (pool.nbytes,), generator=g, dtype=torch.int32).to(torch.uint8)
    raw[(raw & 0x7F) == 0x7F] = 0  # 0x7f / 0xff are e4m3fn's NaNs
    pool.buffer.view(-1).view(torch.uint8).copy_(raw)
    return pool


def test_fp8_pages_round_trip_the_arena_and_the_disk_tier_byte_for_byte(tmp_path: Path) -> None:
    assert FP8.page_bytes * 2 == BF16.page_bytes  # half the bytes of the same bf16 layout
    assert_pages_round_trip(_pool(), tmp_path)


def test_an_fp8_layout_is_its_own_namespace_and_crosses_the_wire() -> None:
    from shared.serving.convert import layout_from_pb, layout_to_pb

    assert not FP8.compatible_with(BF16) and not BF16.compatible_with(FP8)
    assert layout_from_pb(layout_to_pb(FP8)) == FP8  # the ticket and the store's RPCs carry the dtype
