"""The one interface every KV transfer backend implements: register memory, exchange endpoints, write pages.

The flow of a hand-off (decode receives, prefill writes):
    decode:  region = eng.register(kv_pool); ticket carries eng.endpoint() + eng.describe_pages(region, ids, pb)
    prefill: peer = eng.connect(ticket.endpoint); h = eng.write(peer, my_pages, ticket.pages, notify=b"req:epoch")
             eng.wait(h, timeout_s)            (or poll(h) from an event loop)
    decode:  eng.notifications() -> [(prefill_engine_name, b"req:epoch")]   (also keeps the backend progressing)

This class does the backend-neutral work once (bookkeeping, validation against registered regions on both sides,
coalescing, handle lifetimes, typed errors); a backend implements the small `_hooks` at the bottom. An engine is
used by one thread at a time (a lock makes concurrent calls safe, not parallel). No progress thread: whoever
waits for something calls poll()/wait()/progress()/notifications(), on BOTH sides (NIXL needs the receiver to
progress too, at least until the first transfer has connected).
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from shared.transfer.descs import DEVICES, Device, PageDesc, RegionHandle, describe, describe_pages
from shared.transfer.endpoint import EndpointInfo, decode_endpoint, encode_endpoint
from shared.transfer.errors import PeerError, RegionError, TransferError, TransferTimeout
from shared.transfer.plan import BoundDescs, plan_write

TransferStatus = Literal["pending", "done", "error"]
PeerId = str  # the peer engine's name, as its endpoint declares it
_FINISHED_KEPT = 4096  # terminal states remembered for late poll() calls; older ones are forgotten


@dataclass(frozen=True)
class TransferHandle:
    """One started write. `num_descs` counts descriptors after coalescing (what the backend actually moved)."""

    xfer_id: int
    peer: PeerId
    nbytes: int
    num_descs: int


@dataclass
class _Region:
    handle: RegionHandle
    token: Any  # backend registration handle
    keepalive: Any  # the tensor, so its memory cannot be freed while registered


@dataclass
class _Peer:
    info: EndpointInfo
    blob: bytes
    token: Any  # backend peer handle (NIXL agent name, Mooncake "host:port")
    regions: list[RegionHandle]


@dataclass
class _Xfer:
    handle: TransferHandle
    token: Any
    region_ids: frozenset[int]
    started: float = field(default_factory=time.monotonic)


class TransferEngine(ABC):
    """Abstract KV transfer engine; create one with `shared.transfer.create_engine(backend, name=..., host=...)`."""

    backend: ClassVar[str]

    def __init__(self, name: str, host: str) -> None:
        if not name or any(c.isspace() for c in name):
            raise ValueError(f"transfer engine name {name!r} must be non-empty without spaces; use the instance id")
        if not host:
            raise ValueError("transfer host must be non-empty; set --transfer-host to the address peers can reach")
        self._name = name
        self._host = host
        self._lock = threading.RLock()
        self._closed = False
        self._next_region = 1
        self._next_xfer = 1
        self._regions: dict[int, _Region] = {}
        self._peers: dict[PeerId, _Peer] = {}
        self._xfers: dict[int, _Xfer] = {}
        self._finished: OrderedDict[int, tuple[TransferStatus, str]] = OrderedDict()
        self._notifs: list[tuple[str, bytes]] = []

    # ---- identity ------------------------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def host(self) -> str:
        return self._host

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self._name!r}, host={self._host!r}, regions={len(self._regions)})"

    def __enter__(self) -> TransferEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- memory --------------------------------------------------------------------------------------------------

    def register(
        self, tensor_or_ptr: Any, nbytes: int | None = None, *, device: Device = "cpu", device_id: int = 0
    ) -> RegionHandle:
        """Register memory for transfers: a contiguous tensor (device taken from it) or a raw pointer + nbytes.

        GPU memory ("cuda") is registered as NIXL VRAM / a Mooncake "cuda:<id>" location.
        """
        keepalive = None
        if hasattr(tensor_or_ptr, "data_ptr"):
            t = tensor_or_ptr
            if not t.is_contiguous():
                raise ValueError("register() needs a contiguous tensor (the KV pool is one page-major buffer)")
            size = t.numel() * t.element_size()
            if nbytes is not None and not 0 < nbytes <= size:
                raise ValueError(f"nbytes={nbytes} must be in (0, {size}] for this tensor; omit it for all of it")
            addr, nbytes = t.data_ptr(), size if nbytes is None else nbytes
            device = "cuda" if t.device.type == "cuda" else "cpu"
            if t.device.type not in DEVICES:
                raise ValueError(f"cannot register a tensor on {t.device}; supported devices: {DEVICES}")
            device_id = t.device.index or 0
            keepalive = t
        else:
            addr = int(tensor_or_ptr)
            if nbytes is None or nbytes <= 0:
                raise ValueError(f"register(ptr) needs nbytes > 0 (got {nbytes})")
        if device not in DEVICES:
            raise ValueError(f"device {device!r} is not one of {DEVICES}")
        if addr <= 0 or device_id < 0:
            raise ValueError(f"cannot register address {addr:#x} on {device}:{device_id}")
        with self._lock:
            self._check_open()
            new = RegionHandle(self._next_region, addr, nbytes, device, device_id)
            for r in self._regions.values():
                if r.handle.addr < new.end and new.addr < r.handle.end:
                    raise ValueError(
                        f"[{addr:#x}, {new.end:#x}) overlaps registered region {r.handle.region_id}; "
                        "deregister it first or register one buffer once"
                    )
            token = self._register_region(new)
            self._next_region += 1
            self._regions[new.region_id] = _Region(new, token, keepalive)
            return new

    def deregister(self, handle: RegionHandle) -> None:
        """Release a region; refused while a started write still reads from it."""
        with self._lock:
            self._check_open()
            reg = self._regions.get(handle.region_id)
            if reg is None or reg.handle != handle:
                raise RegionError(f"region {handle.region_id} is not registered with engine {self._name!r}")
            busy = [x.handle.xfer_id for x in self._xfers.values() if handle.region_id in x.region_ids]
            if busy:
                raise TransferError(
                    f"region {handle.region_id} is in use by transfers {busy}; wait() for them before deregistering"
                )
            del self._regions[handle.region_id]
            self._deregister_region(reg.token, reg.handle)

    def regions(self) -> list[RegionHandle]:
        with self._lock:
            return [r.handle for r in self._regions.values()]

    def describe(self, region: RegionHandle, offsets_and_lengths: Iterable[tuple[int, int]]) -> list[PageDesc]:
        """(offset, length) ranges of a registered region -> PageDescs (what a hand-off ticket carries)."""
        return describe(region, offsets_and_lengths)

    def describe_pages(self, region: RegionHandle, page_ids: Iterable[int], page_bytes: int) -> list[PageDesc]:
        """Whole pages of a page-major KV pool: page i is bytes [i * page_bytes, (i + 1) * page_bytes)."""
        return describe_pages(region, page_ids, page_bytes)

    # ---- peers ---------------------------------------------------------------------------------------------------

    def endpoint(self) -> bytes:
        """What a peer needs to reach us and write into our registered regions; fetch it after register()."""
        with self._lock:
            self._check_open()
            return encode_endpoint(self.backend, self._name, self._endpoint_payload(), self.regions())

    def connect(self, peer_endpoint: bytes) -> PeerId:
        """Load a peer's endpoint; idempotent and cached. A changed endpoint of a known peer replaces the old one."""
        with self._lock:
            self._check_open()
            info = decode_endpoint(bytes(peer_endpoint), self.backend)
            old = self._peers.get(info.name)
            if old is not None and old.blob == peer_endpoint:
                return info.name
            if info.name == self._name:
                raise PeerError(f"endpoint names this engine itself ({self._name!r}); engine names must be unique")
            token = self._load_peer(info, None if old is None else old.token)
            self._peers[info.name] = _Peer(info, bytes(peer_endpoint), token, info.region_handles())
            return info.name

    def connected(self, peer_endpoint: bytes) -> PeerId | None:
        """The peer's name when connect() loaded exactly this endpoint and it is still current, else None: a
        cheap check (no decoding, no backend call) so callers run only a real connect() off their event loop."""
        with self._lock:
            for name, p in self._peers.items():
                if p.blob == peer_endpoint:
                    return name
            return None

    def disconnect(self, peer: PeerId) -> None:
        with self._lock:
            p = self._peers.pop(peer, None)
            if p is not None:
                self._forget_peer(p.token)

    def peers(self) -> list[PeerId]:
        with self._lock:
            return list(self._peers)

    # ---- transfers -----------------------------------------------------------------------------------------------

    def write(
        self, peer: PeerId, src: Sequence[PageDesc], dst: Sequence[PageDesc], notify: bytes = b""
    ) -> TransferHandle:
        """Start writing src[i] (our memory) into dst[i] (the peer's); returns at once. `notify` reaches the
        peer's notifications() after all the data has landed (empty: no notification)."""
        with self._lock:
            self._check_open()
            p = self._peers.get(peer)
            if p is None:
                raise PeerError(
                    f"unknown peer {peer!r}; call connect(peer_endpoint) first (known: {list(self._peers)})"
                )
            plan = plan_write(src, dst, self.regions(), p.regions, engine=self._name, peer=peer)
            token = self._start_write(p.token, plan.src, plan.dst, bytes(notify))
            handle = TransferHandle(self._next_xfer, peer, plan.nbytes, len(plan.src.descs))
            self._next_xfer += 1
            self._xfers[handle.xfer_id] = _Xfer(handle, token, plan.src_region_ids)
            return handle

    def poll(self, handle: TransferHandle) -> TransferStatus:
        """Non-blocking status; also moves the backend forward."""
        with self._lock:
            return self._poll(handle)[0]

    def wait(self, handle: TransferHandle, timeout_s: float) -> None:
        """Block until the write is done; raises TransferError on failure, TransferTimeout after timeout_s."""
        deadline = time.monotonic() + timeout_s
        spins = 0
        while True:
            with self._lock:
                status, detail = self._poll(handle)
                if status != "pending":
                    self._finished.pop(handle.xfer_id, None)
            if status == "done":
                return
            if status == "error":
                raise TransferError(
                    f"transfer {handle.xfer_id} to {handle.peer!r} ({handle.nbytes} bytes) failed: {detail}"
                )
            now = time.monotonic()
            if now >= deadline:
                raise TransferTimeout(
                    f"transfer {handle.xfer_id} to {handle.peer!r} ({handle.nbytes} bytes) not done after {timeout_s} s; "
                    "is the peer alive and progressing? wait again or raise the timeout"
                )
            # Spin briefly (small writes finish in microseconds), then yield the core: on a shared box the peer
            # (and, for TCP, the backend's own threads) need it to make progress.
            spins += 1
            time.sleep(0 if spins < 200 else min(0.0005, deadline - now))

    def notifications(self) -> list[tuple[PeerId, bytes]]:
        """Completion notices received since the last call, as (sender engine name, notify bytes)."""
        with self._lock:
            self._check_open()
            self._notifs.extend(self._drain_notifs())
            out, self._notifs = self._notifs, []
            return out

    def progress(self) -> None:
        """Move every started transfer and the receive side forward (call it periodically when idle-waiting)."""
        with self._lock:
            self._check_open()
            for xfer_id in list(self._xfers):
                self._poll(self._xfers[xfer_id].handle)
            self._notifs.extend(self._drain_notifs())

    def close(self) -> None:
        """Cancel what is in flight, deregister everything, forget peers; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for x in self._xfers.values():
                self._release_xfer(x.token)
            self._xfers.clear()
            for p in self._peers.values():
                self._forget_peer(p.token)
            self._peers.clear()
            for r in self._regions.values():
                self._deregister_region(r.token, r.handle)
            self._regions.clear()
            self._shutdown()

    # ---- internals -----------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise TransferError(f"transfer engine {self._name!r} is closed; create a new one")

    def _poll(self, handle: TransferHandle) -> tuple[TransferStatus, str]:
        x = self._xfers.get(handle.xfer_id)
        if x is None:
            if handle.xfer_id in self._finished:
                return self._finished[handle.xfer_id]
            raise TransferError(f"unknown transfer handle {handle.xfer_id} (already waited for, or never started)")
        try:
            status, detail = self._check_xfer(x.token)
        except TransferError as e:
            status, detail = "error", str(e)
        if status != "pending":
            del self._xfers[handle.xfer_id]
            self._release_xfer(x.token)
            self._finished[handle.xfer_id] = (status, detail)
            while len(self._finished) > _FINISHED_KEPT:
                self._finished.popitem(last=False)
        return status, detail

    # ---- backend hooks -------------------------------------------------------------------------------------------

    @abstractmethod
    def _register_region(self, region: RegionHandle) -> Any: ...

    @abstractmethod
    def _deregister_region(self, token: Any, region: RegionHandle) -> None: ...

    @abstractmethod
    def _endpoint_payload(self) -> bytes: ...

    @abstractmethod
    def _load_peer(self, info: EndpointInfo, previous: Any | None) -> Any: ...

    @abstractmethod
    def _forget_peer(self, token: Any) -> None: ...

    @abstractmethod
    def _start_write(self, peer: Any, src: BoundDescs, dst: BoundDescs, notify: bytes) -> Any: ...

    @abstractmethod
    def _check_xfer(self, token: Any) -> tuple[TransferStatus, str]: ...

    @abstractmethod
    def _release_xfer(self, token: Any) -> None: ...

    @abstractmethod
    def _drain_notifs(self) -> list[tuple[str, bytes]]: ...

    @abstractmethod
    def _shutdown(self) -> None: ...
