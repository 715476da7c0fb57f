"""Mooncake Transfer Engine backend (P2P handshake, no metadata server).

Peers address each other as "host:rpc_port"; remote addresses in a write are the peer's own virtual addresses.
Writes are started per descriptor with `transfer_submit_write` and polled with `transfer_check_status`, which do
not block. (`batch_transfer_async_write` is not usable for non-blocking polling: its status call,
`get_batch_transfer_status`, blocks until the whole batch is done, and a second status call on a finished batch
crashes the process.) Coalescing keeps the descriptor count low.

Completion notice: after every descriptor of a write is done, a zero-length synchronous write to the first
destination carries a `TransferNotify(sender name, message)`; Mooncake delivers it to the peer's `get_notifies()`
after the data (same TCP session, in order), which is what the receiver's notifications() returns. Mooncake
carries the message as a str: bytes travel latin-1 decoded (lossless for any byte string).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shared.transfer.base import TransferEngine, TransferStatus
from shared.transfer.descs import RegionHandle
from shared.transfer.endpoint import EndpointInfo
from shared.transfer.errors import BackendUnavailable, PeerError, RegionError, TransferError
from shared.transfer.plan import BoundDescs

INSTALL_HINT = (
    "install it with `pip install mooncake-transfer-engine-non-cuda` and `apt-get install libibverbs1` (the wheel "
    "links libibverbs even for TCP), or run scripts/install.sh; GPU hosts use the CUDA wheel `mooncake-transfer-engine`"
)
_PENDING, _DONE, _TIMED_OUT = 0, 1, -2  # transfer_check_status: 0 in flight, 1 done, -1 failed, -2 timed out


def import_mooncake() -> tuple[Any, Any, Any]:
    """(TransferEngine, TransferNotify, TransferOpcode) or BackendUnavailable; tests monkeypatch this."""
    try:
        from mooncake.engine import TransferEngine as MooncakeTE
        from mooncake.engine import TransferNotify, TransferOpcode
    except ImportError as e:
        raise BackendUnavailable(f"transfer backend 'mooncake' cannot be imported ({e}); {INSTALL_HINT}") from None
    return MooncakeTE, TransferNotify, TransferOpcode


@dataclass
class _McXfer:
    peer: str
    pending: list[int]  # Mooncake transfer ids still in flight
    notify: bytes
    first_src: int
    first_dst: int
    errors: list[str] = field(default_factory=list)


class MooncakeEngine(TransferEngine):
    backend = "mooncake"

    def __init__(self, name: str, host: str, protocol: str = "tcp", ib_devices: tuple[str, ...] = ()) -> None:
        super().__init__(name, host)
        te_cls, self._notify_cls, opcode = import_mooncake()
        self._write_op = opcode.Write
        self._te = te_cls()
        # protocol "rdma" with the HCAs of --ib-device (comma-separated, as Mooncake takes them); "tcp" needs none
        rc = self._te.initialize(host, "P2PHANDSHAKE", protocol, ",".join(ib_devices))
        if rc != 0:
            on = f" on {','.join(ib_devices)}" if ib_devices else ""
            raise BackendUnavailable(
                f"Mooncake could not start on host {host!r} with protocol {protocol!r}{on} (rc {rc}); check that "
                "--transfer-host is an address of this machine"
                + (" and that the CUDA wheel (pip install 'pdrelay[cuda]') is installed for rdma" if on else "")
            )
        self._address = f"{host}:{self._te.get_rpc_port()}"

    @property
    def address(self) -> str:
        """ "host:rpc_port", the name Mooncake peers use for us."""
        return self._address

    # memory
    def _register_region(self, region: RegionHandle) -> Any:
        location = f"cuda:{region.device_id}" if region.device == "cuda" else "*"
        rc = self._te.register_memory(region.addr, region.nbytes, location)
        if rc != 0:
            raise RegionError(f"Mooncake could not register {region.nbytes} bytes at {location} (rc {rc})")
        return region.addr

    def _deregister_region(self, token: Any, region: RegionHandle) -> None:
        rc = self._te.unregister_memory(token)
        if rc != 0:
            raise RegionError(f"Mooncake could not deregister region {region.region_id} (rc {rc})")

    # peers
    def _endpoint_payload(self) -> bytes:
        return self._address.encode()

    def _load_peer(self, info: EndpointInfo, previous: Any | None) -> Any:
        address = info.payload.decode(errors="replace")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise PeerError(f"peer {info.name!r} advertises Mooncake address {address!r}; expected host:port")
        rc = self._te.send_probe(address)
        if rc != 0:
            raise PeerError(f"peer {info.name!r} at {address} is unreachable (Mooncake probe rc {rc}); is it running?")
        # Open the peer's segment now (handshake + segment descriptor) and prime the engine's per-peer handle
        # cache with a zero-length write: otherwise the first transfer_submit_write does this synchronously and
        # blocks for up to 60 s when the peer has stalled since. Zero bytes: no memory is read on either side.
        first = self._te.get_first_buffer_address(address)
        if first and self._te.transfer_sync_write(address, first, first, 0) != 0:
            raise PeerError(f"peer {info.name!r} at {address} answered the probe but refused a zero-length write")
        return address

    def _forget_peer(self, token: Any) -> None:
        pass  # Mooncake keeps no per-peer state we can drop

    # transfers
    def _start_write(self, peer: Any, src: BoundDescs, dst: BoundDescs, notify: bytes) -> Any:
        x = _McXfer(peer, [], notify, src.descs[0][0], dst.descs[0][0])
        for (s_addr, length, _), (d_addr, _, _) in zip(src.descs, dst.descs):
            tid = self._te.transfer_submit_write(peer, s_addr, d_addr, length)
            if tid <= 0:
                if not x.pending:
                    raise TransferError(f"Mooncake refused a write to {peer} (rc {tid}); is the peer still alive?")
                x.errors.append(f"submit to {peer} failed (rc {tid})")
                break
            x.pending.append(tid)
        return x

    def _check_xfer(self, token: Any) -> tuple[TransferStatus, str]:
        x: _McXfer = token
        still: list[int] = []
        for tid in x.pending:
            st = self._te.transfer_check_status(tid)
            if st == _PENDING:
                still.append(tid)
            elif st == _TIMED_OUT:
                x.errors.append("descriptor timed out inside Mooncake (MC_TRANSFER_TIMEOUT, default 30 s)")
            elif st != _DONE:
                x.errors.append(f"descriptor failed (status {st})")
        x.pending = still  # a finished id must never be checked again
        if still:
            return "pending", ""
        if x.errors:
            return "error", f"Mooncake write to {x.peer}: " + "; ".join(x.errors[:3])
        if x.notify:
            note = self._notify_cls(self.name, x.notify.decode("latin-1"))
            rc = self._te.batch_transfer_sync(x.peer, [x.first_src], [x.first_dst], [0], self._write_op, note)
            x.notify = b""
            if rc != 0:
                return "error", f"data written but the completion notice to {x.peer} failed (rc {rc})"
        return "done", ""

    def _release_xfer(self, token: Any) -> None:
        pass  # Mooncake cannot cancel a submitted write; ids are freed by their final status check

    def _drain_notifs(self) -> list[tuple[str, bytes]]:
        out: list[tuple[str, bytes]] = []
        for n in self._te.get_notifies():
            try:
                msg = n.msg.encode("latin-1")
            except UnicodeEncodeError:  # a non-pdrelay sender with plain text
                msg = n.msg.encode()
            out.append((n.name, msg))
        return out

    def _shutdown(self) -> None:
        del self._te
