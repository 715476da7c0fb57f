"""KV pages from VRAM to VRAM: two transfer engines in this process, each over a KV pool on the GPU (NIXL VRAM
descriptors / Mooncake cuda locations), checksummed on the device with WORDSUM64. Runs wherever CUDA and a backend
wheel exist (bench/gpu_check.sh runs the same hand-off between two processes on one GPU)."""

from __future__ import annotations

import time

import pytest
import torch

from proto.pdrelay.v1 import common_pb2
from shared.engine.kv_pool import KVPool
from shared.modelspec.kv_layout import KVLayout
from shared.serving.handoff import descs_from_pb, handoff_checksums
from shared.serving.kv_transfer import KVTransfer
from shared.transfer import BackendUnavailable
from shared.transfer.checksum import PageChecksum

LAYOUT = KVLayout(dtype="bfloat16", page_size=16, num_layers=4, num_kv_heads=2, head_dim=64)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["nixl", "mooncake"])
def test_vram_to_vram_hand_off(backend: str) -> None:
    src_pool, dst_pool = KVPool(LAYOUT, 32, "cuda"), KVPool(LAYOUT, 32, "cuda")
    src_pool.buffer.copy_(torch.randn(src_pool.buffer.shape, device="cuda").to(src_pool.buffer.dtype))
    dst_pool.buffer.zero_()
    try:
        writer = KVTransfer(backend, f"vram-w-{backend}", "127.0.0.1", src_pool)
        reader = KVTransfer(backend, f"vram-r-{backend}", "127.0.0.1", dst_pool)
    except BackendUnavailable as e:
        pytest.skip(f"{backend}: {e}")
    try:
        assert writer.checksums == handoff_checksums("cuda") and writer.checksums[0] == PageChecksum.WORDSUM64
        src, dst = [3, 7, 8, 20], [30, 1, 2, 9]
        desc = reader.descriptors(dst)
        assert desc.memory_kind == common_pb2.MEMORY_KIND_VRAM
        peer = writer.connect(reader.peer_pb())
        handle = writer.write_pages(peer, src, descs_from_pb(desc, LAYOUT), b"vram")
        deadline = time.monotonic() + 30
        while (status := writer.engine.poll(handle)) == "pending" and time.monotonic() < deadline:
            reader.engine.progress()
        assert status == "done"
        torch.cuda.synchronize()
        assert torch.equal(dst_pool.buffer[dst], src_pool.buffer[src])
        for algorithm in (PageChecksum.WORDSUM64, PageChecksum.XXH3_64):
            assert writer.checksum(src, algorithm) == reader.checksum(dst, algorithm)
    finally:
        writer.engine.close()
        reader.engine.close()
