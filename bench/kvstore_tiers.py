"""Read bandwidth of the kvstore's lower tiers (`python -m bench.kvstore_tiers`).

T2: pages of the bundled model's size (720 KiB) are demoted into chunk files (--chunk-pages per file), then read
back with the tier's own read path (DiskTier.read_pages: seek + read + CRC-32 per page), next to a raw sequential
read of the same files (the same bytes, no checksum). Both cold (each file's page cache dropped first with
posix_fadvise DONTNEED) and warm. T3 (with --mooncake): the same pages put into a Mooncake Store (a local
mooncake_master on 127.0.0.1) in chunk objects and fetched back with MooncakeTier.fetch (CRC-checked).

    python -m bench.kvstore_tiers --mib 64 --rounds 3 --mooncake
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from services.kvstore.disk import open_disk_tier
from shared.modelspec.kv_layout import KVLayout
from shared.transfer.checksum import crc32

LAYOUT = KVLayout(dtype="float32", page_size=16, num_layers=30, num_kv_heads=3, head_dim=64)  # SmolLM2-135M


def _pages(n: int) -> list[tuple[int, torch.Tensor, int]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        t = torch.randint(0, 256, (LAYOUT.page_bytes,), dtype=torch.uint8, generator=g)
        out.append((1000 + i, t, crc32(t.numpy().tobytes())))
    return out


def _drop_cache(files: list[Path]) -> None:
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _raw_read(files: list[Path]) -> int:
    n = 0
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while chunk := fh.read(8 << 20):
                n += len(chunk)
    return n


def bench_disk(pages: list[tuple[int, torch.Tensor, int]], chunk_pages: int, rounds: int) -> dict[str, float]:
    nbytes = len(pages) * LAYOUT.page_bytes
    with tempfile.TemporaryDirectory(prefix="kvstore-tiers-", dir=os.environ.get("TMPDIR")) as d:
        disk = open_disk_tier(d, 4 * nbytes + (64 << 20), chunk_pages)
        assert disk is not None
        disk.bind("bench", LAYOUT)
        for h, t, c in pages:
            disk.demote(h, t, c)
        disk.close()  # waits for the chunk writes
        files = sorted(Path(d).glob("chunk-*.kv"))
        hashes = [h for h, _, _ in pages]
        out: dict[str, list[float]] = {k: [] for k in ("tier_cold", "raw_cold", "tier_warm", "raw_warm")}
        for _ in range(rounds):
            for mode in ("cold", "warm"):
                if mode == "cold":
                    _drop_cache(files)
                t0 = time.perf_counter()
                got = disk.read_pages(hashes)
                out[f"tier_{mode}"].append(time.perf_counter() - t0)
                assert len(got) == len(pages), "the disk tier lost pages"
                if mode == "cold":
                    _drop_cache(files)
                t0 = time.perf_counter()
                raw = _raw_read(files)
                out[f"raw_{mode}"].append(time.perf_counter() - t0)
                assert raw >= nbytes
    return {k: nbytes / statistics.median(v) / 1e9 for k, v in out.items()}


async def bench_mooncake(pages: list[tuple[int, torch.Tensor, int]], chunk_pages: int, rounds: int) -> float:
    from services.kvstore.remote import MooncakeTier
    from shared.cluster.localcluster.servers import MooncakeMaster, free_port

    nbytes = len(pages) * LAYOUT.page_bytes
    with tempfile.TemporaryDirectory(prefix="kvstore-mc-") as d:
        master = MooncakeMaster(Path(d), free_port(), start_timeout_s=60.0)
        master.start()
        tier = MooncakeTier(
            master=master.address,
            metadata_url=master.metadata_url,
            host="127.0.0.1",
            segment_bytes=2 * nbytes + (64 << 20),
            budget_bytes=2 * nbytes,
            chunk_pages=chunk_pages,
            timeout_s=10.0,
        )
        tier.bind("bench", LAYOUT)
        tier.start()
        try:
            while not tier.up:
                await asyncio.sleep(0.05)
            for h, t, c in pages:
                tier.demote(h, t, c)
                while len(tier._staged) >= 2 * chunk_pages:  # let the writer keep up (staging is bounded)
                    await asyncio.sleep(0.005)
            want = len(pages) // chunk_pages
            while tier.counters.put_chunks < want:
                await asyncio.sleep(0.05)
            hashes = [h for h, _, _ in pages[: want * chunk_pages]]
            times = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                got = await tier.fetch(hashes, limit=len(hashes))
                times.append(time.perf_counter() - t0)
                assert len(got) == len(hashes), f"fetched {len(got)} of {len(hashes)} pages"
            return len(hashes) * LAYOUT.page_bytes / statistics.median(times) / 1e9
        finally:
            await tier.close()
            master.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, nargs="+", default=[64])
    ap.add_argument("--chunk-pages", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mooncake", action="store_true", help="also measure T3 (starts a local mooncake_master)")
    a = ap.parse_args()
    print(
        "| size | pages | T2 cold GB/s | raw cold GB/s | T2/raw cold | T2 warm GB/s | raw warm GB/s | T2/raw warm |"
        + (" T3 GB/s |" if a.mooncake else "")
    )
    for mib in a.mib:
        n = max(a.chunk_pages, (mib << 20) // LAYOUT.page_bytes)
        pages = _pages(n)
        r = bench_disk(pages, a.chunk_pages, a.rounds)
        row = (
            f"| {mib} MiB | {n} | {r['tier_cold']:.2f} | {r['raw_cold']:.2f} "
            f"| {r['tier_cold'] / r['raw_cold']:.2f}x | {r['tier_warm']:.2f} | {r['raw_warm']:.2f} "
            f"| {r['tier_warm'] / r['raw_warm']:.2f}x |"
        )
        if a.mooncake:
            row += f" {asyncio.run(bench_mooncake(pages, a.chunk_pages, a.rounds)):.2f} |"
        print(row, flush=True)


if __name__ == "__main__":
    main()
