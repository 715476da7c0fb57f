"""Turn a write request (src[i] -> dst[i]) into what a backend moves: validated, coalesced, memory kind attached.

One pass over the pairs in plain integer arithmetic: a 64 MiB hand-off of 64 KiB pages is 1024 pairs, and the
first version (dataclass properties, several passes) spent ~3-7 ms of Python on it, as long as the copy itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.transfer.descs import Device, PageDesc, RegionHandle
from shared.transfer.errors import RegionError


@dataclass(frozen=True)
class BoundDescs:
    """One side of a write after coalescing: (addr, length, device_id) triples, all of one memory kind."""

    descs: list[tuple[int, int, int]]
    device: Device


@dataclass(frozen=True)
class WritePlan:
    src: BoundDescs
    dst: BoundDescs
    nbytes: int
    src_region_ids: frozenset[int]


def plan_write(
    src: Sequence[PageDesc],
    dst: Sequence[PageDesc],
    local: Sequence[RegionHandle],
    remote: Sequence[RegionHandle],
    *,
    engine: str,
    peer: str,
) -> WritePlan:
    """Check every pair (equal positive lengths, source inside our regions, destination inside the peer's) and
    merge pair i into pair i-1 when both sides continue it within the same regions (see descs.coalesce_pairs)."""
    if not src:
        raise ValueError("write() needs at least one page descriptor")
    if len(src) != len(dst):
        raise ValueError(f"write needs one destination per source: got {len(src)} sources, {len(dst)} destinations")
    loc = [(r.addr, r.addr + r.nbytes) for r in local]
    rem = [(r.addr, r.addr + r.nbytes) for r in remote]
    s_out: list[list[int]] = []  # [addr, length, local region index]
    d_out: list[list[int]] = []  # [addr, length, remote region index]
    # The bounds of the regions the previous pair hit, as locals: pages of one pool hit the same region, so the
    # common pair costs two comparisons per side (a 1024-pair plan is ~0.3 ms of Python otherwise).
    li = ri = -1
    l_lo = l_hi = r_lo = r_hi = 0
    prev_s = prev_d = -1
    last_s: list[int] = []
    last_d: list[int] = []
    for i in range(len(src)):
        s, d = src[i], dst[i]
        sa, n, da = s.addr, s.length, d.addr
        if n <= 0 or n != d.length:
            raise ValueError(
                f"descriptor pair {i}: source length {n} != destination length {d.length} (or <= 0); "
                "both sides must describe pages of the same KVLayout.page_bytes"
            )
        same_regions = True
        if not (l_lo <= sa and sa + n <= l_hi):
            li = _find(loc, sa, n)
            if li < 0:
                raise RegionError(
                    f"source descriptor {i} [{sa:#x}, +{n}) is not inside memory registered with {engine!r} "
                    "(never registered, or deregistered); register the KV pool before writing from it"
                )
            l_lo, l_hi = loc[li]
            same_regions = False
        if not (r_lo <= da and da + n <= r_hi):
            ri = _find(rem, da, n)
            if ri < 0:
                raise RegionError(
                    f"destination descriptor {i} [{da:#x}, +{n}) is outside the memory peer {peer!r} registered; "
                    "the ticket's pages must come from the peer's describe_pages() on its current endpoint"
                )
            r_lo, r_hi = rem[ri]
            same_regions = False
        if sa == prev_s and da == prev_d and same_regions:
            last_s[1] += n
            last_d[1] += n
        else:
            last_s, last_d = [sa, n, li], [da, n, ri]
            s_out.append(last_s)
            d_out.append(last_d)
        prev_s, prev_d = sa + n, da + n
    used_local = {x[2] for x in s_out}
    return WritePlan(
        _bind(s_out, local, "source"),
        _bind(d_out, remote, "destination"),
        sum(x[1] for x in s_out),
        frozenset(local[k].region_id for k in used_local),
    )


def _find(spans: list[tuple[int, int]], addr: int, n: int) -> int:
    for k, (lo, hi) in enumerate(spans):
        if lo <= addr and addr + n <= hi:
            return k
    return -1


def _bind(out: list[list[int]], regions: Sequence[RegionHandle], side: str) -> BoundDescs:
    kinds = {regions[k].device for k in {x[2] for x in out}}
    if len(kinds) != 1:
        raise ValueError(f"{side} descriptors mix device kinds {sorted(kinds)}; split the write by device")
    return BoundDescs([(a, n, regions[k].device_id) for a, n, k in out], kinds.pop())
