"""MLA latent pages through the store's tiers: a pool of the "mla" layout kind (one latent row per token and layer)
round-trips the DRAM arena and the disk tier byte for byte, and the kind is part of the namespace: a restarted disk
tier comes back bound to the mla layout, and an mha layout of the same numbers does not get its pages."""

from __future__ import annotations

from pathlib import Path

import torch

from services.kvstore.arena import page_crc
from services.kvstore.disk import open_disk_tier
from shared.engine.kv_pool import KVPool
from shared.modelspec.kv_layout import KVLayout
from tests.services.kvstore.tier_round_trip import assert_pages_round_trip

MLA = KVLayout(dtype="float32", page_size=4, num_layers=2, num_kv_heads=1, head_dim=20, kind="mla")
MHA_SAME_NUMBERS = KVLayout(dtype="float32", page_size=4, num_layers=2, num_kv_heads=1, head_dim=20)


def _pool() -> KVPool:
    pool = KVPool(MLA, 6)
    pool.buffer.copy_(torch.randn(pool.buffer.shape, generator=torch.Generator().manual_seed(0)))
    return pool


def test_mla_pages_round_trip_the_arena_and_the_disk_tier_byte_for_byte(tmp_path: Path) -> None:
    assert MLA.page_bytes * 2 == MHA_SAME_NUMBERS.page_bytes  # no V half
    assert_pages_round_trip(_pool(), tmp_path / "rt")


def test_the_kind_is_part_of_the_disk_namespace(tmp_path: Path) -> None:
    pool = _pool()
    disk = open_disk_tier(str(tmp_path), 1 << 20, 2)
    assert disk is not None
    disk.bind("m", MLA)
    data = pool.pages_bytes([1])
    disk.demote(7, data, page_crc(data))
    for th in disk._threads:
        th.join(5)
    disk.close()
    again = open_disk_tier(str(tmp_path), 1 << 20, 2)  # a restart: the namespace is read back from the directory
    assert again is not None and again.namespace == ("m", MLA)
    assert dict(again.read_pages([7]))[7].equal(data)
    again.bind("m", MHA_SAME_NUMBERS)  # another kind: the latent pages are dropped, never served to it
    assert again.hashes() == []
    again.close()


def test_a_store_of_the_other_kind_says_which_it_holds() -> None:
    from services.kvstore.store import Namespace

    assert "latent rows (mla), head dim 20" in Namespace("m", MLA).describe()
    assert "1 KV heads, head dim 20" in Namespace("m", MHA_SAME_NUMBERS).describe()
