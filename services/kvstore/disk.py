"""T2 of the store: local disk (--kvstore-disk-dir). Opened by the service; None when the flag is unset."""

from __future__ import annotations

from typing import Any


def open_disk_tier(directory: str | None, capacity_bytes: int, chunk_pages: int) -> Any:
    """The disk tier over `directory`, or None without one. Raises ValueError naming the flag when the directory
    cannot be used."""
    if directory is None:
        return None
    raise ValueError(f"--kvstore-disk-dir {directory}: the disk tier is not available in this build; drop the flag")


DiskTier = Any
