"""Reading /proc/self/smaps in tests: how much of a mapping is resident, and on huge pages."""

from __future__ import annotations

from pathlib import Path


def mapping_kib(addr: int, field: str) -> int:
    """`field` (e.g. "Rss", "AnonHugePages") in KiB of the mapping of this process that holds `addr`; 0 if none."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0
