"""Host buffers for transfers: fresh, 2 MiB-aligned anonymous memory advised for transparent huge pages.

Why: between processes on one host NIXL/UCX moves pages with the kernel's process_vm_writev (UCX `cma`), which
pins and copies the peer's memory page by page. With 4 KiB pages it ran at ~3 GB/s here (0.2-0.4x memcpy); with
both buffers on transparent huge pages it ran at memcpy speed (16 MiB: 16.6 GB/s vs memcpy 16.5 GB/s; 64 MiB:
7.6 vs 7.6). Huge pages also cut TLB misses for the attention kernels reading the KV pool. Allocate the KV pool (and
any staging buffer) with alloc_host_buffer; where the kernel's THP mode is "never" it is an ordinary buffer.
"""

from __future__ import annotations

import ctypes
import logging
import math
import mmap
import os
import sys
import threading
import time
from collections.abc import Sequence

import torch

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14; not in the mmap module
POPULATE_CHUNK_BYTES = 64 << 20  # one madvise per 64 MiB: the buffer becomes resident in order, front first


def alloc_host_buffer(
    shape: Sequence[int], dtype: torch.dtype = torch.float32, *, huge_pages: bool = True
) -> torch.Tensor:
    """A zeroed CPU tensor of `shape` whose storage starts on a 2 MiB boundary of a fresh private mapping.

    The mapping is advised MADV_HUGEPAGE before anything touches it, so first-touch faults allocate huge pages
    (THP mode "always" or "madvise"). The tensor keeps the mapping alive; it is freed with the last view.
    """
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = numel * itemsize
    if nbytes <= 0:
        raise ValueError(f"alloc_host_buffer needs a non-empty shape (got {tuple(shape)})")
    m = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge_pages and hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(m, dtype=torch.uint8)  # [nbytes + 2 MiB], holds a reference to the mapping
    offset = -raw.data_ptr() % HUGE_PAGE
    return raw[offset : offset + nbytes].view(dtype).view(*shape)  # anonymous memory is already zero


def populate(addr: int, nbytes: int) -> bool:
    """Fault in [addr, addr + nbytes) of a private anonymous mapping as if written, without changing its bytes.

    Why: the first write into a fresh huge-page-advised page allocates (and with THP defrag "madvise", may first
    compact) a 2 MiB page. When that first write is a peer's transfer, the kernel does it inside the writer's
    process_vm_writev: a 45 MiB hand-off into never-touched pages took 50-300 ms here instead of ~5 ms into
    touched ones (fresh 45 MiB: 40-420 ms to fault in, under load). Populating the pages a transfer is about to
    land in, off its critical path, moves that cost out of the write. MADV_POPULATE_WRITE never modifies the
    contents, so it is safe while other threads or a peer write the same pages. Returns False where the kernel
    lacks it (nothing is touched then: a manual touch would race with those writers).
    """
    if nbytes <= 0 or not sys.platform.startswith("linux"):
        return False
    page = mmap.PAGESIZE
    lo = addr - addr % page
    hi = addr + nbytes
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_POPULATE_WRITE)  # releases the GIL
    return rc == 0


def lower_this_thread() -> None:
    """Run the calling thread (a Linux task of its own) at nice 19: background work that yields to the engine's
    threads whenever they run."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (OSError, AttributeError):
        pass


def populate_in_background(buffer: torch.Tensor, what: str) -> threading.Thread:
    """Fault a whole alloc_host_buffer tensor in, front to back, on a daemon thread at nice 19.

    For buffers peers write into whose pages are not tracked one by one (the kvstore's DRAM tier): a peer's first
    write into a page left unbacked faults it in inside the peer's process_vm_writev, on the writer's thread and
    its transfer call (see populate). The thread holds the tensor, so the mapping outlives every madvise on it.
    """

    def run() -> None:
        lower_this_thread()
        start = time.monotonic()
        addr, nbytes = buffer.data_ptr(), buffer.numel() * buffer.element_size()
        for off in range(0, nbytes, POPULATE_CHUNK_BYTES):
            if not populate(addr + off, min(POPULATE_CHUNK_BYTES, nbytes - off)):
                return  # unsupported here: first writes fault pages in themselves
        log.info("%s resident: %d MiB in %.1f s", what, nbytes >> 20, time.monotonic() - start)

    t = threading.Thread(target=run, name="populate", daemon=True)
    t.start()
    return t
