"""KV transfer benchmark: GB/s of page-batch writes per backend between two processes, next to memcpy.

    python -m bench.transfer [--backends nixl,mooncake] [--sizes 64K,256K,1M,4M,16M,64M] [--page-kib 64]
                             [--layout allocator|scattered|contiguous]
    pdrelay bench transfer ...   (same flags)

This process is the writer; each backend gets a fresh reader subprocess that registers a zeroed pool and keeps
its engine progressing. A batch of N pages is written from N source pages to N destination pages, with a
completion notice, timed from write() to wait() returning. Where the pages sit is the layout:
- allocator (default, what a real hand-off moves): both page lists come from the engine's PageAllocator after a
  seeded churn of requests of random lengths, prefill's side allocated chunk by chunk and decode's reserved at
  once (bench/kv_churn.py); the allocator hands out contiguous runs, so pairs coalesce into few descriptors;
- scattered (worst case): random source and destination pages, every page its own descriptor;
- contiguous (best case): pages 0..N-1 on both sides, one descriptor.
The table prints the descriptors a batch becomes after coalescing next to its GB/s. Pools hold 4x the largest
batch (room for the churn) and sit on transparent huge pages as shared/engine/hostmem.py allocates them
(--no-huge-pages for plain 4 KiB pages). A size that is not a whole number of pages is rounded down to one.

The baseline is a plain single-threaded torch copy of the same number of bytes in this process, measured in the
same run, interleaved round by round; a ratio is the median over rounds of memcpy time / backend time (the box is
shared and its load drifts), GB/s are medians over rounds.

A third reference, `cma`, is the kernel's process_vm_writev moving the same pages (one iovec per coalesced
descriptor) into the same reader (Linux), batching up to 1024 per system call: the single-copy path UCX's cma
transport uses between processes, hence the ceiling for NIXL on one host. It pins the peer's pages as it copies:
~0.3-0.5x memcpy with 4 KiB pages here, close to memcpy with huge pages.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.kv_churn import Churn, decode_pages, num_descriptors, prefill_pages

DEFAULT_SIZES = "64K,256K,1M,4M,16M,64M"
TARGET_RATIO, TARGET_MIN_BYTES = 0.7, 16 << 20  # NIXL should reach 0.7x memcpy from 16 MiB batches up
LAYOUTS = ("allocator", "scattered", "contiguous")
POOL_BATCHES = 4  # pools hold this many of the largest batch: room for the allocator churn to fragment


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = units.get(t[-1:], 1)
    digits = t[:-1] if t[-1:] in units else t
    if not digits.isdigit() or int(digits) <= 0:
        raise ValueError(f"size {text!r} is not a positive size like 64K, 16M or 1048576")
    return int(digits) * mult


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The benchmark's flags (shared by `python -m bench.transfer` and `pdrelay bench transfer`)."""
    p.add_argument("--backends", default="nixl,mooncake", help="comma-separated backends (default: nixl,mooncake)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"batch sizes, K/M suffixes (default: {DEFAULT_SIZES})")
    p.add_argument(
        "--page-kib",
        type=int,
        default=64,
        help="page size in KiB; a batch is the whole pages that fit in its size (default 64; the bundled "
        "model's KV page is 720)",
    )
    p.add_argument("--iters", type=int, default=0, help="repetitions per size (default: adaptive, 3-30)")
    p.add_argument("--host", default="127.0.0.1", help="address the engines advertise (default 127.0.0.1)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--seed", type=int, default=0, help="seed of the page churn / shuffle")
    p.add_argument(
        "--no-huge-pages",
        dest="huge_pages",
        action="store_false",
        help="allocate the pools with plain 4 KiB pages (default: transparent huge pages, see shared/engine/hostmem.py)",
    )
    p.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="allocator",
        help="allocator (default): pages from the engine's page allocator after a seeded churn of requests, as a "
        "real hand-off gets them; scattered: random pages on both sides (worst case, one descriptor per page); "
        "contiguous: pages 0..n-1 on both sides (best case, one descriptor)",
    )


def run(ns: argparse.Namespace) -> int:
    """Run the benchmark described by parsed flags; prints a table, returns an exit code."""
    try:
        backends = [b.strip() for b in ns.backends.split(",") if b.strip()]
        sizes = sorted({parse_size(s) for s in ns.sizes.split(",") if s.strip()})
        page_bytes = ns.page_kib << 10
        if ns.page_kib <= 0:
            raise ValueError(f"--page-kib {ns.page_kib} must be > 0; try 64")
        small = [s for s in sizes if s < page_bytes]
        if small:
            raise ValueError(f"--sizes {small} are smaller than one page of --page-kib {ns.page_kib} KiB")
        from shared.transfer.factory import BACKENDS

        unknown = [b for b in backends if b not in BACKENDS]
        if unknown or not backends:
            raise ValueError(f"--backends {unknown or ns.backends!r}: choose from {BACKENDS}")
    except ValueError as e:
        print(f"bench transfer: {e}", file=sys.stderr)
        return 2
    result = measure(backends, sizes, page_bytes, ns.iters, ns.host, ns.seed, ns.layout, ns.huge_pages)
    print_table(result)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def measure(
    backends: list[str],
    sizes: list[int],
    page_bytes: int,
    iters: int,
    host: str,
    seed: int,
    layout: str = "allocator",
    huge_pages: bool = True,
) -> dict[str, Any]:
    import torch

    from shared.engine.hostmem import alloc_host_buffer
    from shared.transfer import PageDesc, create_engine
    from shared.transfer.descs import coalesce_pairs

    torch.set_num_threads(1)  # memcpy on one core, like the single-threaded transfer it is compared with
    max_pages = max(sizes) // page_bytes
    pool_pages = POOL_BATCHES * max_pages
    # the writer's pool, page-major: page i = bytes [i * page_bytes, (i + 1) * page_bytes); [pool_bytes / 4] fp32
    src = alloc_host_buffer([pool_pages * page_bytes // 4], huge_pages=huge_pages)
    src.copy_(torch.randn(src.shape))
    copy_dst = alloc_host_buffer(src.shape, huge_pages=huge_pages)
    copy_dst.fill_(0)
    # size: as asked (what the target refers to); bytes: the whole pages moved
    rows: list[dict[str, Any]] = [
        {"size": s, "bytes": s // page_bytes * page_bytes, "pages": s // page_bytes} for s in sizes
    ]
    pages = _page_lists(layout, [r["pages"] for r in rows], pool_pages, seed)  # the same for every backend
    for row, (src_ids, dst_ids) in zip(rows, pages):
        row["descriptors"] = num_descriptors(src_ids, dst_ids)
    times: dict[tuple[int, str], list[float]] = {}  # (row index, "memcpy" | "cma" | backend) -> seconds per batch
    ratios: dict[tuple[int, str], list[float]] = {}  # (row index, "cma" | backend) -> memcpy time / its time

    for backend in backends:
        reader = _Reader(backend, pool_pages * page_bytes, host, huge_pages)
        try:
            with create_engine(backend, name=f"bench-writer-{os.getpid()}", host=host) as eng:
                region = eng.register(src)
                peer = eng.connect(reader.endpoint)
                for i, row in enumerate(rows):
                    src_ids, dst_ids = pages[i]
                    s = eng.describe_pages(region, src_ids, page_bytes)
                    d = [PageDesc(reader.base + p * page_bytes, page_bytes) for p in dst_ids]
                    numel = row["bytes"] // 4

                    def one_write() -> None:
                        eng.wait(eng.write(peer, s, d, notify=b"bench"), timeout_s=60)

                    fns: dict[str, Any] = {"memcpy": lambda: copy_dst[:numel].copy_(src[:numel]), backend: one_write}
                    # the kernel reference gets the coalescing NIXL gets: one iovec per merged descriptor
                    cma = _cma_writer(reader.proc.pid, *coalesce_pairs(s, d)) if (i, "cma") not in times else None
                    if cma is not None:
                        fns["cma"] = cma
                    _paired(fns, _iters(iters, row["bytes"]), i, times, ratios)
        finally:
            reader.close()

    for i, row in enumerate(rows):
        for key in ["memcpy", "cma", *backends]:
            if (i, key) in times:
                row[f"{key}_gbps"] = row["bytes"] / statistics.median(times[i, key]) / 1e9
            if (i, key) in ratios:
                row[f"{key}_ratio"] = statistics.median(ratios[i, key])
    return {"page_bytes": page_bytes, "layout": layout, "huge_pages": huge_pages, "backends": backends, "rows": rows}


def _page_lists(layout: str, counts: list[int], pool_pages: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(source page ids, destination page ids) for a batch of each count of pages, placed as the layout says."""
    churn = Churn(pool_pages=pool_pages, max_request_pages=max(counts))
    rng = random.Random(seed)
    out = []
    for i, n in enumerate(counts):
        if layout == "contiguous":
            out.append((list(range(n)), list(range(n))))
        elif layout == "allocator":  # two instances with their own histories
            base = seed * 7919 + 2 * i
            out.append((prefill_pages(churn, n, base), decode_pages(churn, n, base + 1)))
        else:
            out.append((rng.sample(range(pool_pages), n), rng.sample(range(pool_pages), n)))
    return out


def _cma_writer(pid: int, src: list[Any], dst: list[Any]) -> Any:
    """A callable doing process_vm_writev(src pages -> the reader's dst pages), or None where unavailable."""
    if not sys.platform.startswith("linux"):
        return None

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    libc = ctypes.CDLL(None, use_errno=True)
    libc.process_vm_writev.restype = ctypes.c_ssize_t
    batches = []
    for i in range(0, len(src), 1024):  # IOV_MAX
        s, d = src[i : i + 1024], dst[i : i + 1024]
        local = (IoVec * len(s))(*[IoVec(x.addr, x.length) for x in s])
        remote = (IoVec * len(d))(*[IoVec(x.addr, x.length) for x in d])
        batches.append((local, remote, len(s), sum(x.length for x in s)))

    def write() -> None:
        for local, remote, n, nbytes in batches:
            if libc.process_vm_writev(pid, local, n, remote, n, 0) != nbytes:
                raise OSError(ctypes.get_errno(), "process_vm_writev")

    try:
        write()
    except OSError:  # e.g. ptrace restrictions (Yama): no reference then
        return None
    return write


def _iters(requested: int, nbytes: int) -> int:
    if requested > 0:
        return requested
    return max(3, min(30, (256 << 20) // nbytes))  # ~256 MiB moved per size, at least 3 samples


def _paired(
    fns: dict[str, Any],
    n: int,
    row: int,
    times: dict[tuple[int, str], list[float]],
    ratios: dict[tuple[int, str], list[float]],
) -> None:
    """Time every function once per round, n rounds, interleaved: on a shared box the load drifts within
    seconds, so a ratio is the median of per-round ratios (each against the memcpy of the same round)."""
    for fn in fns.values():
        fn()  # warm-up: connection setup, first touch
    for _ in range(n):
        t: dict[str, float] = {}
        for key, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            t[key] = time.perf_counter() - t0
            times.setdefault((row, key), []).append(t[key])
        for key, s in t.items():
            if key != "memcpy":
                ratios.setdefault((row, key), []).append(t["memcpy"] / s)


def print_table(result: dict[str, Any]) -> None:
    backends = result["backends"]
    head = f"{'batch':>9} {'pages':>6} {'descs':>6} {'memcpy GB/s':>12} {'cma GB/s':>9} {'x memcpy':>9}"
    head += "".join(f" {b + ' GB/s':>14} {'x memcpy':>9}" for b in backends)
    kib, layout = result["page_bytes"] >> 10, result["layout"]
    mem = "huge-page buffers" if result["huge_pages"] else "4 KiB-page buffers"
    print(f"KV transfer between two processes, {kib} KiB KV pages, {layout}, {mem}, medians")
    print(head)
    for r in result["rows"]:
        line = f"{_fmt_size(r['bytes']):>9} {r['pages']:>6} {r['descriptors']:>6} {r['memcpy_gbps']:>12.2f}"
        line += f" {r['cma_gbps']:>9.2f} {r['cma_ratio']:>8.2f}x" if "cma_gbps" in r else f" {'n/a':>9} {'':>9}"
        for b in backends:
            line += f" {r[b + '_gbps']:>14.2f} {r[b + '_ratio']:>8.2f}x"
        print(line)
    if "nixl" in backends:
        big = [r for r in result["rows"] if r["size"] >= TARGET_MIN_BYTES]
        if big:
            worst = min(r["nixl_ratio"] for r in big)
            verdict = "met" if worst >= TARGET_RATIO else "MISSED"
            print(f"target nixl >= {TARGET_RATIO}x memcpy for batches >= 16 MiB: {verdict} (worst {worst:.2f}x)")


def _fmt_size(n: int) -> str:
    if n >= 1 << 20:
        return f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n / (1 << 20):.1f} MiB"
    return f"{n >> 10} KiB" if n % (1 << 10) == 0 else f"{n} B"


class _Reader:
    """The receiving process: `python -m bench.transfer --reader BACKEND POOL_BYTES HOST HUGE_PAGES`."""

    def __init__(self, backend: str, pool_bytes: int, host: str, huge_pages: bool) -> None:
        cmd = [sys.executable, "-m", "bench.transfer", "--reader", backend, str(pool_bytes), host, str(int(huge_pages))]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {backend} reader process exited before it was ready (rc {self.proc.wait()})")
        ready = json.loads(line)
        self.endpoint = bytes.fromhex(ready["endpoint"])
        self.base: int = ready["base"]

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


def reader_main(backend: str, pool_bytes: int, host: str, huge_pages: bool) -> int:
    import torch

    from shared.engine.hostmem import alloc_host_buffer
    from shared.transfer import create_engine

    torch.set_num_threads(1)
    pool = alloc_host_buffer([pool_bytes // 4], huge_pages=huge_pages)
    pool.fill_(0)  # touch every page now, not during the first timed write
    with create_engine(backend, name=f"bench-reader-{os.getpid()}", host=host) as eng:
        region = eng.register(pool)
        print(json.dumps({"endpoint": eng.endpoint().hex(), "base": region.addr}), flush=True)
        while True:
            # Progress continuously (NIXL without a progress thread needs the receiver to), with a short idle
            # wait on stdin so the writer keeps most of a core.
            eng.progress()
            eng.notifications()
            if select.select([sys.stdin], [], [], 0.0002)[0] and sys.stdin.readline().strip() in ("quit", ""):
                return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--reader"]:
        return reader_main(args[1], int(args[2]), args[3], args[4] == "1")
    p = argparse.ArgumentParser(prog="python -m bench.transfer", description=__doc__.split("\n")[0])
    add_arguments(p)
    return run(p.parse_args(args))


if __name__ == "__main__":
    sys.exit(main())
