"""The endpoint blob a peer needs to reach us, as carried opaquely (bytes) in registrations and hand-off messages.

It wraps the backend's own connection info (NIXL agent metadata; Mooncake "host:rpc_port") in a small typed
envelope that adds what the backends do not expose portably: which backend produced it, the engine name, and the
registered regions. The regions let a writer reject a destination outside the peer's registered memory before
anything is sent, and tell it each destination's memory kind (NIXL needs DRAM vs VRAM for the remote list).
"""

from __future__ import annotations

import msgspec

from shared.transfer.descs import DEVICES, RegionHandle
from shared.transfer.errors import PeerError

ENDPOINT_VERSION = 1


class RegionInfo(msgspec.Struct, frozen=True, array_like=True):
    addr: int
    nbytes: int
    device: str
    device_id: int


class EndpointInfo(msgspec.Struct, frozen=True):
    version: int
    backend: str  # "nixl" | "mooncake"
    name: str  # the engine (agent) name; notifications name their sender by it
    payload: bytes  # backend connection info
    regions: tuple[RegionInfo, ...]

    def region_handles(self) -> list[RegionHandle]:
        # region_id -1: a peer's region is never deregistered through us
        return [RegionHandle(-1, r.addr, r.nbytes, r.device, r.device_id) for r in self.regions]  # type: ignore[arg-type]  # device: "cpu"|"cuda" as str on the wire


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(EndpointInfo)


def encode_endpoint(backend: str, name: str, payload: bytes, regions: list[RegionHandle]) -> bytes:
    info = EndpointInfo(
        ENDPOINT_VERSION,
        backend,
        name,
        payload,
        tuple(RegionInfo(r.addr, r.nbytes, r.device, r.device_id) for r in regions),
    )
    return _encoder.encode(info)


def decode_endpoint(blob: bytes, expect_backend: str) -> EndpointInfo:
    """Parse a peer's endpoint; raises PeerError naming what is wrong (garbage, version, backend mismatch)."""
    try:
        info = _decoder.decode(blob)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise PeerError(
            f"peer endpoint ({len(blob)} bytes) is not a pdrelay transfer endpoint: {e}; "
            "pass the bytes the peer's TransferEngine.endpoint() returned"
        ) from None
    if info.version != ENDPOINT_VERSION:
        raise PeerError(f"peer endpoint version {info.version} != {ENDPOINT_VERSION}; run the same pdrelay version")
    if info.backend != expect_backend:
        raise PeerError(
            f"peer {info.name!r} uses transfer backend {info.backend!r} but this engine is {expect_backend!r}; "
            "start both sides with the same --transfer-backend"
        )
    for r in info.regions:
        if r.device not in DEVICES:
            raise PeerError(f"peer {info.name!r} advertises a region on device {r.device!r}; expected one of {DEVICES}")
    return info
