"""KV page pack/unpack (Triton) against index_select / index_copy_ on page-major pools: bit-exact for every dtype,
pages in the requested order, untouched pages left alone, bad ids refused. Interpreter on CPU, compiled in the
`gpu` test at the bundled model's page size."""

from __future__ import annotations

import os

import pytest
import torch

from shared.engine.kv_pool import KVPool
from shared.kernels.triton import kv_pack
from shared.modelspec.kv_layout import KVLayout


@pytest.fixture
def gen() -> torch.Generator:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"random seed {seed}")
    return torch.Generator().manual_seed(seed)


def random_pool(g: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    return torch.randn(shape, generator=g).to(dtype)


def poison(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, 0xAB if dtype == torch.uint8 else float("nan"), dtype=dtype)


# page sizes in bytes: multiples of 4 (int32 words), 2 mod 4 (int16 words), odd (bytes)
@pytest.mark.parametrize(
    "dtype,page_shape",
    [
        (torch.float32, (2, 2, 4, 2, 8)),
        (torch.bfloat16, (3, 2, 4, 1, 8)),
        (torch.float16, (1, 2, 1, 1, 3)),
        (torch.uint8, (1, 1, 1, 1, 5)),
    ],
)
def test_pack_then_unpack_round_trip(gen: torch.Generator, dtype: torch.dtype, page_shape: tuple[int, ...]) -> None:
    pool = random_pool(gen, (12, *page_shape), dtype)
    ids = torch.randperm(12, generator=gen)[:5]  # scattered, in no particular order
    buf = poison((5, *page_shape), dtype)
    assert kv_pack.pack_pages(pool, ids, out=buf) is buf
    assert torch.equal(buf.view(torch.uint8), kv_pack.pack_pages_reference(pool, ids).view(torch.uint8))

    dest = random_pool(gen, (12, *page_shape), dtype)
    dst_ids = torch.randperm(12, generator=gen)[:5]
    expect = dest.clone()
    kv_pack.unpack_pages_reference(buf, expect, dst_ids)
    dest[dst_ids] = poison((5, *page_shape), dtype)  # the pages to be written hold garbage before
    kv_pack.unpack_pages(buf, dest, dst_ids.tolist())
    assert torch.equal(dest.view(torch.uint8), expect.view(torch.uint8))


def test_pack_reads_a_real_kv_pool(gen: torch.Generator) -> None:
    layout = KVLayout(dtype="bfloat16", page_size=4, num_layers=3, num_kv_heads=2, head_dim=8)
    kv = KVPool(layout, 9)
    kv.buffer.copy_(torch.randn(kv.buffer.shape, generator=gen))
    ids = [7, 0, 3]
    packed = kv_pack.pack_pages(kv.buffer, ids)
    assert packed.is_contiguous() and packed.shape == (3, 3, 2, 4, 2, 8)
    # the same bytes the hand-off checksums
    assert packed.view(torch.uint8).reshape(-1).tolist() == kv.pages_bytes(ids).tolist()


def test_bad_page_ids_are_refused() -> None:
    pool = torch.zeros(4, 8)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        kv_pack.pack_pages(pool, [1, 4])
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        kv_pack.unpack_pages(torch.zeros(1, 8), pool, [-1])
    with pytest.raises(ValueError, match="duplicates"):
        kv_pack.unpack_pages(torch.zeros(2, 8), pool, [2, 2])
    with pytest.raises(ValueError, match="duplicates"):
        kv_pack.unpack_pages(torch.zeros(2, 8), pool, torch.tensor([3, 3]))
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        kv_pack.pack_pages(pool, torch.tensor([0, 9]))
    with pytest.raises(ValueError, match="one page per page id"):
        kv_pack.unpack_pages(torch.zeros(3, 8), pool, [0, 1])
    assert kv_pack.pack_pages(pool, []).shape == (0, 8)


@pytest.mark.gpu
def test_gpu_pack_unpack_bundled_layout(gen: torch.Generator) -> None:
    # SmolLM2-135M pages: 30 layers x K/V x 16 tokens x 3 kv heads x 64, bf16 (737 KB a page)
    pool = torch.randn(512, 30, 2, 16, 3, 64, generator=gen).to(torch.bfloat16).cuda()
    ids = torch.randperm(512, generator=gen)[:64].cuda()
    buf = kv_pack.pack_pages(pool, ids)
    assert torch.equal(buf, pool.index_select(0, ids))
    dest = torch.zeros_like(pool)
    kv_pack.unpack_pages(buf, dest, ids)
    others = torch.ones(512, dtype=torch.bool, device="cuda")
    others[ids] = False
    assert torch.equal(dest.index_select(0, ids), buf) and not dest[others].any()
