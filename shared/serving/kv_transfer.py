"""A service's transfer engine over its KV pool: created after the engine, the pool registered once, progress
driven from the event loop (no backend progress thread: NIXL's busy-spins a core).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from proto.pdrelay.v1 import common_pb2
from shared.config.choices import TransferBackend
from shared.config.groups import TransferConfig
from shared.engine.kv_pool import KVPool
from shared.serving.convert import BACKEND_TO_PB
from shared.serving.handoff import handoff_checksums, paged_descriptors
from shared.transfer import create_engine
from shared.transfer.base import TransferEngine, TransferHandle
from shared.transfer.checksum import PageChecksum, checksum_pages
from shared.transfer.descs import PageDesc, RegionHandle
from shared.transfer.errors import TransferError, TransferTimeout
from shared.transfer.options import TransferOptions
from shared.transfer.pace import ProgressPace

log = logging.getLogger(__name__)


class KVTransfer:
    def __init__(
        self,
        backend: TransferBackend | str,
        name: str,
        host: str,
        pool: KVPool,
        options: TransferOptions | None = None,
    ) -> None:
        self.backend = TransferBackend(backend)  # an unknown name fails here, before any engine starts
        self.pool = pool
        self.engine: TransferEngine = create_engine(backend, name=name, host=host, options=options)
        self.region: RegionHandle = self.engine.register(pool.buffer)
        # Peers write these pages and hand-offs read them: resident before the first one, not faulted in inside it
        # (the model's own pool started this when it was made; a tensor-parallel runner's full-head pool, which only
        # hand-offs and the kvstore use, starts here).
        pool.populate_in_background()
        self.page_bytes = pool.bytes_per_page
        # The page checksums this side runs, preferred first (where its pages are: WORDSUM64 for a GPU pool):
        # decode offers them in its tickets, prefill picks from the offer when a ticket arrives.
        self.checksums = handoff_checksums(pool.buffer.device.type)
        self._endpoint = self.engine.endpoint()
        self._pace = ProgressPace()  # hand-offs in flight: progress fast while any is, slowly otherwise
        self._task: asyncio.Task[None] | None = None
        # Faults in pages a peer is about to write (KVPool.prefault), off the event loop and the engine thread.
        self._prefaulter = ThreadPoolExecutor(1, thread_name_prefix="kv-prefault")

    def register_extra(self, buffer: torch.Tensor) -> RegionHandle:
        """Register another buffer peers may write into (prefill's image-embedding arena); peers that connect
        afterwards see it in our endpoint."""
        region = self.engine.register(buffer)
        self._endpoint = self.engine.endpoint()
        return region

    # ---- receiving side (decode) -------------------------------------------------------------------------------
    def peer_pb(self) -> common_pb2.TransferPeer:
        """How a writer reaches us: the backend's opaque endpoint (agent metadata + registered regions)."""
        return common_pb2.TransferPeer(
            backend=BACKEND_TO_PB[self.backend], agent_name=self.engine.name, agent_metadata=self._endpoint
        )

    def descriptors(self, page_ids: Sequence[int]) -> common_pb2.PageDescriptors:
        """Descriptors of pool pages a peer will write into. Host pages never touched yet are faulted in now, in
        the background (the peer is still computing): otherwise the kernel faults them in inside the peer's
        write, which made a 45 MiB hand-off ~10x slower than the same write into resident pages."""
        on_gpu = self.pool.buffer.device.type == "cuda"
        if not on_gpu and page_ids:
            self.prefault(page_ids)
        return paged_descriptors(
            self.region.addr,
            self.page_bytes,
            list(page_ids),
            device_id=self.pool.buffer.device.index or 0,
            on_gpu=on_gpu,
        )

    def prefault(self, page_ids: Sequence[int]) -> Future[int]:
        return self._prefaulter.submit(self.pool.prefault, list(page_ids))

    def begin_receive(self) -> None:
        self._pace.begin()

    def end_receive(self) -> None:
        self._pace.end()

    def start_progress(self) -> None:
        if self._task is None:  # idempotent: a kvstore client also needs the receive side progressing
            self._task = asyncio.ensure_future(self._progress_loop())

    async def _progress_loop(self) -> None:
        # The receiver must keep its backend progressing (NIXL/UCX) or a peer's first write never connects.
        while True:
            try:
                self.engine.notifications()  # drains completion notices and progresses the backend
            except TransferError as e:
                log.warning("transfer progress: %s", e)
            # Fast while a write is expected (never holding up a writer; the first write to a new peer needs a
            # few progress calls here), a few times a second otherwise (see shared/transfer/pace.py).
            await self._pace.nap()

    # ---- writing side (prefill) --------------------------------------------------------------------------------
    def connect(self, peer: common_pb2.TransferPeer) -> str:
        return self.engine.connect(peer.agent_metadata)

    def connected(self, peer: common_pb2.TransferPeer) -> str | None:
        """The peer's name when connect() already loaded this very endpoint (no backend call), else None."""
        return self.engine.connected(peer.agent_metadata)

    def write_pages(self, peer: str, src_pages: Sequence[int], dst: list[PageDesc], notify: bytes) -> TransferHandle:
        src = self.engine.describe_pages(self.region, src_pages, self.page_bytes)
        return self.engine.write(peer, src, dst, notify)

    async def wait(self, handle: TransferHandle, timeout_s: float) -> None:
        """Poll from the event loop (other RPCs keep being served); raises TransferError / TransferTimeout."""
        deadline = time.monotonic() + timeout_s
        delay = 0.0
        while True:
            status = self.engine.poll(handle)
            if status == "done":
                return
            if status == "error":
                raise TransferError(f"KV write of {handle.nbytes} bytes to {handle.peer!r} failed")
            if time.monotonic() >= deadline:
                raise TransferTimeout(
                    f"KV write of {handle.nbytes} bytes to {handle.peer!r} not done after "
                    f"{timeout_s:.1f} s (--handoff-timeout-s)"
                )
            await asyncio.sleep(delay)
            delay = min(0.001, delay + 0.0001)

    # ---- both ----------------------------------------------------------------------------------------------------
    def checksum(self, page_ids: Sequence[int], algorithm: PageChecksum = PageChecksum.CRC32) -> int:
        return checksum_pages(self.pool.buffer, page_ids, algorithm)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._prefaulter.shutdown(wait=True)  # a running madvise must not outlive the mapping
        try:
            self.engine.close()
        except TransferError as e:
            log.warning("closing the transfer engine: %s", e)


def transfer_options(t: TransferConfig) -> TransferOptions:
    """The wire settings of a resolved transfer group."""
    return TransferOptions.from_settings(t.transfer_protocol, t.ib_device, t.ucx_transports)
