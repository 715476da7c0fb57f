"""T2 of the store: local disk (--kvstore-disk-dir). Pages the DRAM tier evicts are demoted here, grouped into
chunk files of --kvstore-chunk-pages pages, and read back (promoted) on a hit.

A chunk file is one header + the page bytes:
    magic "PDKV1\\0", page_bytes u32, n u32, n x (hash u64, crc32 u32), header crc32 u32, n x page_bytes
Each page carries its CRC-32 (checked on every read; a mismatch drops the page) and the header its own (checked when
the index is rebuilt at start; a bad or short file is deleted). The directory holds one namespace (namespace.json:
model + KV layout), so a restarted store serves its old pages at once and never mixes another model's in.

The index is bounded by the byte budget (--kvstore-disk-bytes): the oldest chunk is deleted when a new one would
pass it. Chunks are written by one background thread from a staging buffer; a write error (disk full, a removed
directory) logs a warning and stops demotion (evicted pages are then simply dropped), it never fails a request.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from shared.modelspec.kv_layout import KVLayout
from shared.transfer.checksum import crc32

log = logging.getLogger(__name__)

MAGIC = b"PDKV1\0"
_HEAD = struct.Struct("<6sII")
_ENTRY = struct.Struct("<QI")
_CRC = struct.Struct("<I")


@dataclass
class DiskCounters:
    demoted: int = 0
    read: int = 0
    corrupt: int = 0  # pages (or whole chunks at start) that failed their checksum and were dropped
    write_errors: int = 0
    dropped_chunks: int = 0  # deleted to stay within the byte budget


@dataclass
class _Chunk:
    path: Path
    hashes: list[int]
    live: int  # pages still indexed (promoted ones are forgotten)
    nbytes: int


def open_disk_tier(directory: str | None, capacity_bytes: int, chunk_pages: int) -> DiskTier | None:
    """The disk tier over `directory`, or None without one. Raises ValueError naming the flag when the directory
    cannot be used (not creatable, not writable, no room for one chunk)."""
    if directory is None:
        return None
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".pdrelay-probe"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise ValueError(
            f"--kvstore-disk-dir {directory} is not a writable directory ({e.strerror or e}); "
            "point it at one the service may write, or drop the flag"
        ) from None
    free = shutil.disk_usage(path).free
    if free < capacity_bytes:
        log.warning(
            "kvstore: --kvstore-disk-bytes %d exceeds the %d bytes free in %s; the disk tier may fill "
            "up early (demotion then stops with a warning)",
            capacity_bytes,
            free,
            directory,
        )
    return DiskTier(path, capacity_bytes, chunk_pages)


class DiskTier:
    def __init__(self, directory: Path, capacity_bytes: int, chunk_pages: int) -> None:
        self.dir = directory
        self.capacity_bytes = capacity_bytes
        self.chunk_pages = chunk_pages
        self.counters = DiskCounters()
        self.namespace: tuple[str, KVLayout] | None = None
        self.page_bytes = 0
        self._index: dict[int, tuple[int, int, int]] = {}  # hash -> (chunk id, position, crc)
        self._chunks: OrderedDict[int, _Chunk] = OrderedDict()  # oldest first
        self._staged: list[tuple[int, torch.Tensor, int]] = []  # (hash, page bytes, crc) not written yet
        self._removed: list[int] = []
        self._next_chunk = 1
        self._lock = threading.Lock()
        self._writing = threading.Semaphore(1)
        self._stopped = False  # after a write error: no more demotion
        self._threads: list[threading.Thread] = []
        self._load_namespace()

    # ---- namespace and index -------------------------------------------------------------------------------------
    def _ns_file(self) -> Path:
        return self.dir / "namespace.json"

    def _load_namespace(self) -> None:
        try:
            raw = json.loads(self._ns_file().read_text())
            layout = KVLayout(**raw["layout"])
            self.namespace = (str(raw["model"]), layout)
            self.page_bytes = layout.page_bytes
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("kvstore: unreadable %s (%s); starting the disk tier empty", self._ns_file(), e)
            self._wipe()
            return
        self._rebuild()

    def bind(self, model: str, layout: KVLayout) -> None:
        """The store's namespace; pages of another namespace left in the directory are deleted."""
        if self.namespace == (model, layout):
            return
        if self.namespace is not None:
            log.warning("kvstore: %s held pages of another model or layout; deleting them", self.dir)
            self._wipe()
        self.namespace = (model, layout)
        self.page_bytes = layout.page_bytes
        self._ns_file().write_text(json.dumps({"model": model, "layout": asdict(layout)}))

    def _wipe(self) -> None:
        for p in self.dir.glob("chunk-*.kv"):
            p.unlink(missing_ok=True)
        self._index.clear()
        self._chunks.clear()

    def _rebuild(self) -> None:
        """Index every chunk file; drop the ones whose header fails its checksum or whose size is wrong."""
        files = sorted(self.dir.glob("chunk-*.kv"), key=lambda p: int(p.stem.split("-")[1]))
        for p in files:
            cid = int(p.stem.split("-")[1])
            try:
                entries = self._read_header(p)
            except (OSError, ValueError) as e:
                log.warning("kvstore: dropping corrupt chunk %s (%s)", p.name, e)
                self.counters.corrupt += 1
                p.unlink(missing_ok=True)
                continue
            hashes = [h for h, _ in entries]
            for pos, (h, crc) in enumerate(entries):
                self._index[h] = (cid, pos, crc)
            self._chunks[cid] = _Chunk(p, hashes, len(hashes), p.stat().st_size)
            self._next_chunk = max(self._next_chunk, cid + 1)
        if self._chunks:
            log.info(
                "kvstore: disk tier rebuilt from %s: %d pages in %d chunks",
                self.dir,
                len(self._index),
                len(self._chunks),
            )

    def _read_header(self, p: Path) -> list[tuple[int, int]]:
        with open(p, "rb") as f:
            head = f.read(_HEAD.size)
            if len(head) != _HEAD.size:
                raise ValueError("short header")
            magic, page_bytes, n = _HEAD.unpack(head)
            if magic != MAGIC or page_bytes != self.page_bytes or not 0 < n <= 4096:
                raise ValueError("not a chunk of this namespace")
            body = f.read(n * _ENTRY.size)
            (crc,) = _CRC.unpack(f.read(_CRC.size))
            if crc32(head + body) != crc:
                raise ValueError("header checksum mismatch")
        if p.stat().st_size != self._data_offset(n) + n * page_bytes:
            raise ValueError("truncated")
        return [_ENTRY.unpack_from(body, i * _ENTRY.size) for i in range(n)]

    @staticmethod
    def _data_offset(n: int) -> int:
        return _HEAD.size + n * _ENTRY.size + _CRC.size

    # ---- queries -------------------------------------------------------------------------------------------------
    def __contains__(self, h: int) -> bool:
        with self._lock:
            return h in self._index or any(s[0] == h for s in self._staged)

    @property
    def num_pages(self) -> int:
        return len(self._index) + len(self._staged)

    @property
    def used_bytes(self) -> int:
        return sum(c.nbytes for c in self._chunks.values()) + len(self._staged) * self.page_bytes

    def hashes(self) -> list[int]:
        with self._lock:
            return list(self._index) + [s[0] for s in self._staged]

    def lookup(self, hashes: Sequence[int]) -> int:
        n = 0
        for h in hashes:
            if h not in self:
                break
            n += 1
        return n

    def crc_of(self, h: int) -> int:
        with self._lock:
            if h in self._index:
                return self._index[h][2]
            return next(c for hh, _, c in self._staged if hh == h)

    def take_removed(self) -> list[int]:
        with self._lock:
            out, self._removed = self._removed, []
        return out

    # ---- demotion ------------------------------------------------------------------------------------------------
    def demote(self, h: int, page: torch.Tensor, crc: int) -> None:
        """Called by the DRAM arena for each page it evicts (before its slot is reused): copy it to staging."""
        if self._stopped or self.capacity_bytes < self.page_bytes or h in self:
            return
        with self._lock:
            self._staged.append((h, page.clone(), crc))
            if len(self._staged) > 4 * self.chunk_pages:  # the disk lags behind: bounded staging, oldest dropped
                old_h, _, _ = self._staged.pop(0)
                self._removed.append(old_h)
            full = len(self._staged) >= self.chunk_pages
        if full and self._writing.acquire(blocking=False):
            t = threading.Thread(target=self._write_chunk, name="kvstore-disk", daemon=True)
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()

    def _write_chunk(self) -> None:
        try:
            with self._lock:
                batch = self._staged[: self.chunk_pages]
                cid = self._next_chunk
                self._next_chunk += 1
            n = len(batch)
            head = _HEAD.pack(MAGIC, self.page_bytes, n) + b"".join(_ENTRY.pack(h, c) for h, _, c in batch)
            path = self.dir / f"chunk-{cid}.kv"
            tmp = path.with_suffix(".tmp")
            try:
                with open(tmp, "wb") as f:
                    f.write(head + _CRC.pack(crc32(head)))
                    f.writelines(data.numpy().data for _, data, _ in batch)
                os.replace(tmp, path)  # a chunk appears whole or not at all
            except OSError as e:
                tmp.unlink(missing_ok=True)
                self.counters.write_errors += 1
                self._stopped = True
                log.warning(
                    "kvstore: cannot write to --kvstore-disk-dir %s (%s); demotion to disk stopped, "
                    "evicted pages are dropped",
                    self.dir,
                    e.strerror or e,
                )
                with self._lock:
                    self._removed.extend(h for h, _, _ in batch)
                    del self._staged[:n]
                return
            with self._lock:
                del self._staged[:n]
                for pos, (h, _, c) in enumerate(batch):
                    self._index[h] = (cid, pos, c)
                self._chunks[cid] = _Chunk(path, [h for h, _, _ in batch], n, path.stat().st_size)
                self.counters.demoted += n
                self._enforce_budget()
        finally:
            self._writing.release()

    def _enforce_budget(self) -> None:
        while self._chunks and self.used_bytes > self.capacity_bytes:
            cid, chunk = self._chunks.popitem(last=False)
            chunk.path.unlink(missing_ok=True)
            self.counters.dropped_chunks += 1
            for h in chunk.hashes:
                if self._index.get(h, (0,))[0] == cid:
                    del self._index[h]
                    self._removed.append(h)

    # ---- promotion -----------------------------------------------------------------------------------------------
    def read_pages(self, hashes: Sequence[int]) -> list[tuple[int, torch.Tensor]]:
        """Leading pages present, each verified against its CRC-32 (runs in a worker thread). A corrupt page is
        dropped from the index and ends the read."""
        out: list[tuple[int, torch.Tensor]] = []
        for h in hashes:
            with self._lock:
                staged = next((d for hh, d, _ in self._staged if hh == h), None)
                where = self._index.get(h)
            if staged is not None:
                out.append((h, staged.clone()))
                continue
            if where is None:
                break
            cid, pos, crc = where
            chunk = self._chunks.get(cid)
            try:
                assert chunk is not None
                with open(chunk.path, "rb") as f:
                    f.seek(self._data_offset(len(chunk.hashes)) + pos * self.page_bytes)
                    data = f.read(self.page_bytes)
            except (OSError, AssertionError):
                data = b""
            if len(data) != self.page_bytes or crc32(data) != crc:
                self.counters.corrupt += 1
                log.warning(
                    "kvstore: page %d of %s failed its checksum; dropped",
                    pos,
                    chunk.path.name if chunk else f"chunk {cid}",
                )
                self.forget([h])
                with self._lock:
                    self._removed.append(h)
                break
            self.counters.read += 1
            out.append((h, torch.frombuffer(bytearray(data), dtype=torch.uint8)))
        return out

    def forget(self, hashes: Sequence[int]) -> None:
        """Pages now held elsewhere (promoted to DRAM): unindex them; a chunk with no live page is deleted."""
        with self._lock:
            for h in hashes:
                where = self._index.pop(h, None)
                if where is None:
                    continue
                chunk = self._chunks.get(where[0])
                if chunk is not None:
                    chunk.live -= 1
                    if chunk.live <= 0:
                        chunk.path.unlink(missing_ok=True)
                        del self._chunks[where[0]]

    def close(self) -> None:
        """Wait for chunk writes and write what is staged (a partial chunk), so a restart finds it."""
        for t in self._threads:
            t.join(timeout=5.0)
        while self._staged and not self._stopped and self._writing.acquire(timeout=5.0):
            self._write_chunk()
