"""T3 of the store: the Mooncake Store (--kvstore-mooncake-master), pages shared across machines.

The Mooncake master holds only object metadata; the bytes live in the segments its clients contribute (this
kvstore contributes --kvstore-mooncake-segment-bytes). One store object is one chunk of up to --kvstore-chunk-pages
pages, so the master's key count stays bounded by the byte budget / chunk size (one object per page is what drove
Mooncake masters out of memory, Mooncake #3452). An object is
    magic "PDKM1\\0", page_bytes u32, n u32, n x (hash u64, crc32 u32), header crc32 u32, n x page_bytes
under the key "pdrelay-kv/<namespace digest>/<first page hash>", so two models never share a key and another
machine's kvstore finds a chunk from the page hash alone (a chunk starting where its own tiers stop).

Pages evicted from DRAM are staged (bounded: the oldest are dropped when the master lags) and put by one
background task. A miss in T1/T2 that T3 holds is fetched and promoted into DRAM by the caller. Every call has a
timeout (--kvstore-mooncake-timeout-s); a failed or timed-out call marks the tier down for RETRY_S, during which
lookups skip it at once and demotion drops pages: T1/T2 keep serving, and T3 comes back when the master does
(the client reconnects by itself; objects a restarted master forgot are dropped from the index on their first miss).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import socket
import struct
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from shared.modelspec.kv_layout import KVLayout
from shared.transfer.checksum import crc32

log = logging.getLogger(__name__)

MAGIC = b"PDKM1\0"
_HEAD = struct.Struct("<6sII")
_ENTRY = struct.Struct("<QI")
_CRC = struct.Struct("<I")
RETRY_S = 2.0  # how long the tier is skipped after a failed call
SETUP_RETRY_S = 2.0
_MAX_SPARE = 64  # reusable staging buffers kept (pages); staging itself holds at most 4 chunks


@dataclass
class RemoteCounters:
    put_chunks: int = 0
    put_bytes: int = 0
    put_failures: int = 0  # puts refused, failed or timed out (their pages are dropped)
    fetched_pages: int = 0  # pages read back (promoted into DRAM by the caller)
    fetch_failures: int = 0  # gets failed or timed out
    missing_chunks: int = 0  # indexed chunks the master no longer has (restarted or evicted)
    corrupt: int = 0  # pages that failed their checksum and were dropped
    dropped_pages: int = 0  # staged pages dropped (tier down or lagging)
    removed_chunks: int = 0  # removed to stay within the byte budget


@dataclass
class _Chunk:
    hashes: list[int]
    nbytes: int


def namespace_digest(model: str, layout: KVLayout) -> str:
    lay = asdict(layout)
    if layout.kind == "mha":  # the field came later: an mha layout keeps the digest (and the stored keys) it had
        del lay["kind"]
    raw = json.dumps({"model": model, "layout": lay}, sort_keys=True, default=str).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def encode_chunk(page_bytes: int, pages: Sequence[tuple[int, torch.Tensor, int]]) -> bytes:
    head = _HEAD.pack(MAGIC, page_bytes, len(pages)) + b"".join(_ENTRY.pack(h, c) for h, _, c in pages)
    # join reads the pages' memory in place: one copy of the chunk, not two (a tobytes() per page, then the join)
    parts: list[bytes | memoryview] = [head, _CRC.pack(crc32(head))]
    parts.extend(d.numpy().data for _, d, _ in pages)
    return b"".join(parts)


def decode_chunk(blob: bytes, page_bytes: int) -> list[tuple[int, int, memoryview]] | None:
    """(hash, crc, page bytes) per page, or None for a malformed object; page CRCs are checked by the caller."""
    if len(blob) < _HEAD.size:
        return None
    magic, pb, n = _HEAD.unpack_from(blob)
    end = _HEAD.size + n * _ENTRY.size
    if magic != MAGIC or pb != page_bytes or len(blob) != end + _CRC.size + n * page_bytes:
        return None
    if _CRC.unpack_from(blob, end)[0] != crc32(blob[:end]):
        return None
    view, base = memoryview(blob), end + _CRC.size
    out = []
    for i in range(n):
        h, c = _ENTRY.unpack_from(blob, _HEAD.size + i * _ENTRY.size)
        out.append((h, c, view[base + i * page_bytes : base + (i + 1) * page_bytes]))
    return out


class MooncakeTier:
    """Chunks of pages in a Mooncake Store. Call from one event loop; the blocking client calls run in a small
    thread pool, each awaited with a timeout."""

    def __init__(
        self,
        *,
        master: str,
        metadata_url: str,
        host: str,
        segment_bytes: int,
        budget_bytes: int,
        chunk_pages: int,
        timeout_s: float,
        client_factory: Callable[[], Any] | None = None,
    ) -> None:
        self.master = master
        self.metadata_url = metadata_url
        self.host = host
        self.segment_bytes = segment_bytes
        self.capacity_bytes = budget_bytes
        self.chunk_pages = chunk_pages
        self.timeout_s = timeout_s
        self._factory = client_factory or _mooncake_client
        self.counters = RemoteCounters()
        self.page_bytes = 0
        self._prefix = ""
        self._client: Any = None
        self._connecting = False
        self._down_until = 0.0
        self._index: dict[int, tuple[str, int]] = {}  # page hash -> (chunk key, position)
        self._chunks: OrderedDict[str, _Chunk] = OrderedDict()  # oldest first
        self._staged: deque[tuple[int, torch.Tensor, int]] = deque()
        self._spare: list[torch.Tensor] = []  # staging buffers of pages already put or dropped, reused
        self._removed: list[int] = []
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvstore-mooncake")
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ---- state ---------------------------------------------------------------------------------------------------
    @property
    def up(self) -> bool:
        return self._client is not None and time.monotonic() >= self._down_until

    @property
    def used_bytes(self) -> int:
        return sum(c.nbytes for c in self._chunks.values())

    @property
    def num_pages(self) -> int:
        return len(self._index)

    def __contains__(self, h: int) -> bool:
        return h in self._index or any(s[0] == h for s in self._staged)

    def take_removed(self) -> list[int]:
        out, self._removed = self._removed, []
        return out

    def bind(self, model: str, layout: KVLayout) -> None:
        self.page_bytes = layout.page_bytes
        self._prefix = f"pdrelay-kv/{namespace_digest(model, layout)}/"

    def key(self, h: int) -> str:
        return f"{self._prefix}{h:016x}"

    # ---- lifecycle -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            if self._client is None:
                await self._connect()
                if self._client is None:
                    await asyncio.sleep(SETUP_RETRY_S)
                    continue
            if len(self._staged) >= self.chunk_pages and self.up and self.page_bytes:
                await self._put_chunk()
                continue
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)
            except TimeoutError:
                pass

    async def _connect(self) -> None:
        host, _, port = self.master.rpartition(":")
        # setup() retries for a long time when the master is down: only call it once the master accepts connections
        if not await asyncio.to_thread(_port_open, host, int(port)) or self._connecting:
            return
        self._connecting = True
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        loop = asyncio.get_running_loop()

        def setup() -> None:
            client, rc = None, -1
            try:
                client = self._factory()
                rc = client.setup(
                    self.host,
                    self.metadata_url,
                    self.segment_bytes,
                    max(32 << 20, 4 * self.chunk_pages * max(self.page_bytes, 1)),
                    "tcp",
                    "",
                    self.master,
                )
            except Exception as e:  # noqa: BLE001 - a client that cannot start leaves the tier off, never the store
                log.warning("kvstore: Mooncake Store client setup failed: %s", e)
            loop.call_soon_threadsafe(_settle, done, client if rc == 0 else None)

        # a plain thread, not the pool: a setup that never returns must not hold a worker the tier needs
        threading.Thread(target=setup, name="kvstore-mooncake-setup", daemon=True).start()
        try:
            client = await done
        finally:
            self._connecting = False
        if client is None:
            log.warning("kvstore: Mooncake Store at %s refused this client; retrying", self.master)
            return
        self._client = client
        log.info("kvstore: Mooncake Store tier T3 at %s (%d MiB segment)", self.master, self.segment_bytes >> 20)

    async def close(self) -> None:
        """Unmount this kvstore's segment (so the master stops handing out its objects), within the timeout."""
        if self._task is not None:
            self._task.cancel()
        client, self._client = self._client, None
        if client is not None and hasattr(client, "close"):
            done = threading.Event()

            def close_client() -> None:
                try:
                    client.close()
                except Exception as e:  # noqa: BLE001 - closing is best effort
                    log.warning("kvstore: closing the Mooncake Store client: %s", e)
                done.set()

            threading.Thread(target=close_client, name="kvstore-mooncake-close", daemon=True).start()
            await asyncio.to_thread(done.wait, self.timeout_s)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- calls ---------------------------------------------------------------------------------------------------
    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) in the pool with the tier's timeout; a timeout or exception marks the tier down."""
        try:
            fut = asyncio.wrap_future(self._pool.submit(fn, *args))
            return await asyncio.wait_for(fut, timeout=self.timeout_s)
        except Exception as e:  # noqa: BLE001 - any client failure (timeouts included) only skips the tier
            self._fail(f"{getattr(fn, '__name__', 'call')}: {e or type(e).__name__}")
            return None

    def _fail(self, why: str) -> None:
        if time.monotonic() >= self._down_until:
            log.warning("kvstore: Mooncake Store call failed (%s); T3 skipped for %.0fs", why, RETRY_S)
        self._down_until = time.monotonic() + RETRY_S

    # ---- demotion ------------------------------------------------------------------------------------------------
    def demote(self, h: int, page: torch.Tensor, crc: int) -> None:
        """Called for each page the DRAM arena evicts (before its slot is reused): stage a copy."""
        if self.capacity_bytes < self.page_bytes or h in self._index:
            return
        if not self.up:
            self.counters.dropped_pages += 1
            return
        # A reused staging buffer, not page.clone(): a fresh 0.7 MiB allocation is a fresh mapping whose pages fault
        # in during the copy and unmap after the put (1.6 ms a page here, the store's largest cost once DRAM is
        # full and every Put evicts).
        fits = bool(self._spare) and self._spare[-1].shape == page.shape
        buf = self._spare.pop() if fits else torch.empty(page.shape, dtype=page.dtype)
        buf.copy_(page)
        self._staged.append((h, buf, crc))
        while len(self._staged) > 4 * self.chunk_pages:  # the master lags: bounded staging, oldest dropped
            self._spare.append(self._staged.popleft()[1])
            self.counters.dropped_pages += 1
        if len(self._staged) >= self.chunk_pages:
            self._wake.set()

    async def _put_chunk(self) -> None:
        batch = [self._staged.popleft() for _ in range(min(self.chunk_pages, len(self._staged)))]
        key = self.key(batch[0][0])
        blob = encode_chunk(self.page_bytes, batch)
        self._spare.extend(d for _, d, _ in batch if len(self._spare) < _MAX_SPARE)
        rc = await self._call(self._client.put, key, blob)
        if rc != 0:
            self.counters.put_failures += 1
            self.counters.dropped_pages += len(batch)
            if rc is not None:
                self._fail(f"put returned {rc}")
            return
        old = self._chunks.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        self._chunks[key] = _Chunk([h for h, _, _ in batch], len(blob))
        for pos, (h, _, _) in enumerate(batch):
            self._index[h] = (key, pos)
        self.counters.put_chunks += 1
        self.counters.put_bytes += len(blob)
        while self._chunks and self.used_bytes > self.capacity_bytes:
            old_key, chunk = self._chunks.popitem(last=False)
            self._unindex(old_key, chunk)
            self._removed.extend(chunk.hashes)
            self.counters.removed_chunks += 1
            # best effort: the master refuses while another client's read lease holds it, then evicts it itself
            await self._call(self._client.remove, old_key)

    def _unindex(self, key: str, chunk: _Chunk) -> None:
        for h in chunk.hashes:
            if self._index.get(h, ("",))[0] == key:
                del self._index[h]

    # ---- promotion -----------------------------------------------------------------------------------------------
    async def fetch(self, hashes: Sequence[int], limit: int) -> list[tuple[int, torch.Tensor, int]]:
        """Leading pages of `hashes` held in T3, at most `limit`, each verified against its CRC-32. A chunk is
        found through this store's index or, for another machine's, by the key of the page where the run stops."""
        out: list[tuple[int, torch.Tensor, int]] = []
        if not self.up or not self.page_bytes:
            return out
        hashes = list(hashes[:limit])
        while len(out) < len(hashes):
            h = hashes[len(out)]
            key, pos = self._index.get(h, (self.key(h), 0))
            # get() answers b"" both for a missing object and a dead master: ask first, so that a master that is
            # down marks the tier down instead of emptying the index
            exists = await self._call(self._client.batch_is_exist, [key])
            if not exists or exists[0] < 0:
                if exists is not None:
                    self._fail(f"batch_is_exist returned {exists}")
                self.counters.fetch_failures += 1
                break
            blob = await self._call(self._client.get, key) if exists[0] == 1 else b""
            if blob is None:
                self.counters.fetch_failures += 1
                break
            pages = decode_chunk(blob, self.page_bytes) if blob else None
            if pages is None:
                if key in self._chunks:
                    self.counters.missing_chunks += 1
                    chunk = self._chunks.pop(key)
                    self._unindex(key, chunk)
                    self._removed.extend(chunk.hashes)
                break
            took = 0
            for ph, crc, data in pages[pos:]:
                if len(out) >= len(hashes) or ph != hashes[len(out)]:
                    break
                if crc32(data) != crc:
                    self.counters.corrupt += 1
                    log.warning("kvstore: a page of Mooncake Store object %s failed its checksum; dropped", key)
                    break
                out.append((ph, torch.frombuffer(bytearray(data), dtype=torch.uint8), crc))
                took += 1
            if took == 0 or pos + took < len(pages):
                break  # the run leaves this chunk mid-way: no later chunk can continue it
        self.counters.fetched_pages += len(out)
        return out


def _mooncake_client() -> Any:
    from mooncake.store import MooncakeDistributedStore

    return MooncakeDistributedStore()


def _settle(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host or "127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
