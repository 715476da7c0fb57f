"""Which encoder embeds an image: the one its media hash maps to among the ready image encoders of the model
(rendezvous hashing), so the same image always meets the encoder whose cache holds it and a new encoder or a lost
one moves only its share of the hashes. Pure: the caller passes the ready encoders."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from proto.pdrelay.v1 import common_pb2
from services.gateway.routing.encoders import serves
from shared.cluster.instance import InstanceInfo, Modality


def image_encoders(ready: Sequence[InstanceInfo], model: str) -> list[InstanceInfo]:
    return [i for i in ready if serves(i, Modality.IMAGE, model) and i.grpc_address]


def _score(media_hash: str, instance_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{media_hash}/{instance_id}".encode(), digest_size=8).digest(), "little")


def pick_encoder(media_hash: str, encoders: Sequence[InstanceInfo]) -> InstanceInfo | None:
    if not encoders:
        return None
    return max(encoders, key=lambda e: _score(media_hash, e.instance_id))


def assign_encoders(media: Sequence[common_pb2.MediaInput], encoders: Sequence[InstanceInfo]) -> None:
    """Set each item's EncoderTarget (left unset without encoders: prefill then encodes it itself)."""
    for m in media:
        e = pick_encoder(m.media_hash, encoders)
        if e is not None:
            m.encoder.CopyFrom(common_pb2.EncoderTarget(instance_id=e.instance_id, grpc_address=e.grpc_address))
