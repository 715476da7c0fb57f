"""The endpoint envelope round-trips and rejects what is not ours."""

from __future__ import annotations

import pytest

from shared.transfer.descs import RegionHandle
from shared.transfer.endpoint import decode_endpoint, encode_endpoint
from shared.transfer.errors import PeerError


def test_round_trip_keeps_payload_and_regions() -> None:
    regions = [RegionHandle(1, 0x7F00_0000_0000, 1 << 20), RegionHandle(2, 0x1000, 64, "cuda", 3)]
    blob = encode_endpoint("nixl", "decode-1", b"\x00\xffmeta", regions)
    info = decode_endpoint(blob, "nixl")
    assert (info.name, info.payload) == ("decode-1", b"\x00\xffmeta")
    assert [(r.addr, r.nbytes, r.device, r.device_id) for r in info.region_handles()] == [
        (r.addr, r.nbytes, r.device, r.device_id) for r in regions
    ]


@pytest.mark.parametrize("blob", [b"", b"garbage", b"\x93\x01\x02\x03"])
def test_garbage_is_a_peer_error(blob: bytes) -> None:
    with pytest.raises(PeerError, match="not a pdrelay transfer endpoint"):
        decode_endpoint(blob, "nixl")


def test_backend_mismatch_names_both() -> None:
    blob = encode_endpoint("mooncake", "p", b"127.0.0.1:1", [])
    with pytest.raises(PeerError, match="'mooncake' but this engine is 'nixl'"):
        decode_endpoint(blob, "nixl")
