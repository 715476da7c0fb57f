"""Memory descriptors: registered regions, page descriptors, and the pure functions over them.

A hand-off ticket carries page descriptors as plain (addr, length) pairs in the receiver's virtual address space;
everything here is backend-neutral and unit-testable without a transfer engine.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Device = Literal["cpu", "cuda"]
DEVICES: tuple[Device, ...] = ("cpu", "cuda")


@dataclass(frozen=True)
class PageDesc:
    """One contiguous byte range: `length` bytes at virtual address `addr` (ours or a peer's)."""

    addr: int
    length: int

    @property
    def end(self) -> int:
        return self.addr + self.length


@dataclass(frozen=True)
class RegionHandle:
    """A registered memory region; `region_id` is unique within one engine, addresses are process-virtual."""

    region_id: int
    addr: int
    nbytes: int
    device: Device = "cpu"
    device_id: int = 0

    @property
    def end(self) -> int:
        return self.addr + self.nbytes

    def contains(self, desc: PageDesc) -> bool:
        return self.addr <= desc.addr and desc.end <= self.end


def describe(region: RegionHandle, offsets_and_lengths: Iterable[tuple[int, int]]) -> list[PageDesc]:
    """Byte ranges of `region` given as (offset, length) -> descriptors; raises ValueError when one falls outside."""
    out: list[PageDesc] = []
    for offset, length in offsets_and_lengths:
        if offset < 0 or length <= 0 or offset + length > region.nbytes:
            raise ValueError(
                f"range (offset={offset}, length={length}) is outside region {region.region_id} of "
                f"{region.nbytes} bytes; offsets must be >= 0, lengths > 0, and offset + length <= {region.nbytes}"
            )
        out.append(PageDesc(region.addr + offset, length))
    return out


def describe_pages(region: RegionHandle, page_ids: Iterable[int], page_bytes: int) -> list[PageDesc]:
    """Descriptors of whole pages of a page-major pool (page i is bytes [i * page_bytes, (i + 1) * page_bytes))."""
    if page_bytes <= 0:
        raise ValueError(f"page_bytes must be > 0 (got {page_bytes}); pass KVLayout.page_bytes")
    return describe(region, ((p * page_bytes, page_bytes) for p in page_ids))


def coalesce(descs: Sequence[PageDesc]) -> list[PageDesc]:
    """Merge runs of adjacent descriptors (pages i, i+1, ... of one pool) into one descriptor each, keeping order."""
    out: list[PageDesc] = []
    for d in descs:
        if out and out[-1].end == d.addr:
            out[-1] = PageDesc(out[-1].addr, out[-1].length + d.length)
        else:
            out.append(d)
    return out


def coalesce_pairs(
    src: Sequence[PageDesc], dst: Sequence[PageDesc], keys: Sequence[Hashable] | None = None
) -> tuple[list[PageDesc], list[PageDesc]]:
    """Merge pair i into pair i-1 when BOTH its source and its destination continue the previous ones.

    Contiguous source pages written to contiguous destination pages become one descriptor per side, which cuts
    per-descriptor overhead (one UCX rendezvous / one Mooncake task instead of many). With `keys`, pairs merge
    only when their keys are equal too (the engine passes region ids: a merged descriptor must not straddle two
    regions that happen to be adjacent in memory).
    """
    check_pairs(src, dst)
    if keys is not None and len(keys) != len(src):
        raise ValueError(f"coalesce_pairs: got {len(keys)} keys for {len(src)} pairs")
    out_src: list[PageDesc] = []
    out_dst: list[PageDesc] = []
    last_key: Hashable = None
    for i, (s, d) in enumerate(zip(src, dst)):
        key = keys[i] if keys is not None else None
        if out_src and out_src[-1].end == s.addr and out_dst[-1].end == d.addr and key == last_key:
            out_src[-1] = PageDesc(out_src[-1].addr, out_src[-1].length + s.length)
            out_dst[-1] = PageDesc(out_dst[-1].addr, out_dst[-1].length + d.length)
        else:
            out_src.append(s)
            out_dst.append(d)
        last_key = key
    return out_src, out_dst


def check_pairs(src: Sequence[PageDesc], dst: Sequence[PageDesc]) -> None:
    """A write moves src[i] to dst[i]: equal counts, equal lengths, positive lengths."""
    if len(src) != len(dst):
        raise ValueError(f"write needs one destination per source: got {len(src)} sources, {len(dst)} destinations")
    for i, (s, d) in enumerate(zip(src, dst)):
        if s.length <= 0 or s.length != d.length:
            raise ValueError(
                f"descriptor pair {i}: source length {s.length} != destination length {d.length} (or <= 0); "
                "both sides must describe pages of the same KVLayout.page_bytes"
            )


def find_region(regions: Iterable[RegionHandle], desc: PageDesc) -> RegionHandle | None:
    """The region holding all of `desc`, or None (linear: an engine holds a handful of regions)."""
    for r in regions:
        if r.contains(desc):
            return r
    return None


def total_bytes(descs: Iterable[PageDesc]) -> int:
    return sum(d.length for d in descs)
