"""The encoder choice for images (EPD), without a cluster: the encoder known to hold the media hash, else the
least-loaded one (its NATS report plus the images sent since), rendezvous hashing as the tie-break. And the gRPC
Generate API's refusal of media (images come over HTTP)."""

from __future__ import annotations

import pytest

from proto.pdrelay.v1 import common_pb2, gateway_pb2
from services.gateway.grpc.api import plan_of
from services.gateway.openai.errors import ApiError
from services.gateway.routing.encoders import EncoderRouter
from services.gateway.routing.media_affinity import MediaAffinity
from shared.cluster.bus.load import LoadReport, LoadSnapshot, LoadTable
from shared.cluster.instance import Capacity, EncoderInfo, InstanceInfo, InstanceState, Modality
from tests.services.gateway.test_embeddings_routing import StaticMembership

HASHES = [f"{i:032x}" for i in range(400)]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _enc(i: int, epoch: int = 1, model: str = "vlm") -> InstanceInfo:
    return InstanceInfo(
        cluster="c",
        role="encoder",
        instance_id=f"enc-{i}",
        grpc_address=f"127.0.0.1:{5000 + i}",
        epoch=epoch,
        state=InstanceState.READY,
        capacity=Capacity(max_running_requests=4),
        encoder=EncoderInfo(modalities=(Modality.IMAGE,), vision_model=model),
    )


def _report(loads: LoadTable, i: int, running: int, epoch: int = 1) -> None:
    loads._on_report(
        LoadReport(
            instance_id=f"enc-{i}", role="encoder", epoch=epoch, seq=1, ts=0.0, load=LoadSnapshot(running=running)
        ),
        None,
    )  # type: ignore[arg-type]


def _affinity(infos: list[InstanceInfo], loads: LoadTable | None = None, clock: Clock | None = None) -> MediaAffinity:
    return MediaAffinity(EncoderRouter(StaticMembership(infos), loads or LoadTable()), clock=clock or Clock())


def _pick(a: MediaAffinity, h: str, model: str = "vlm") -> str:
    c = a.pick(h, a.encoders(model))
    assert c is not None
    return c.instance_id


def test_idle_encoders_split_hashes_by_rendezvous() -> None:
    encs = [_enc(i) for i in range(4)]
    picks = {h: _pick(_affinity(encs), h) for h in HASHES}
    assert picks == {h: _pick(_affinity(list(reversed(encs))), h) for h in HASHES}  # order-independent
    counts = {e.instance_id: list(picks.values()).count(e.instance_id) for e in encs}
    assert min(counts.values()) > 60  # spread over all four
    fewer = [e for e in encs if e.instance_id != "enc-2"]
    moved = [h for h in HASHES if _pick(_affinity(fewer), h) != picks[h]]
    assert moved and all(picks[h] == "enc-2" for h in moved)  # only the lost encoder's images move
    assert _affinity([]).pick("x", []) is None
    assert _affinity(encs).encoders("other-model") == []


def test_new_images_go_to_the_least_loaded_encoder() -> None:
    loads = LoadTable()
    _report(loads, 0, running=4)
    _report(loads, 1, running=0)
    _report(loads, 2, running=2)
    a = _affinity([_enc(0), _enc(1), _enc(2)], loads)
    assert {_pick(a, h) for h in HASHES[:50]} == {"enc-1"}
    # images this gateway sent since enc-1's report count as its load: once it is as busy as enc-2 they share
    media = [common_pb2.MediaInput(media_hash=h) for h in HASHES[:6]]
    a.assign(media, "vlm")
    got = [m.encoder.instance_id for m in media]
    assert got[:2] == ["enc-1", "enc-1"] and set(got[2:]) == {"enc-1", "enc-2"}
    assert media[0].encoder.grpc_address == "127.0.0.1:5001"


def test_the_encoder_holding_the_hash_wins_over_load() -> None:
    loads = LoadTable()
    clock = Clock()
    infos = [_enc(0), _enc(1)]
    a = _affinity(infos, loads, clock)
    h = HASHES[7]
    first = common_pb2.MediaInput(media_hash=h)
    a.assign([first], "vlm")
    holder = first.encoder.instance_id
    other = 1 - int(holder[-1])
    _report(loads, int(holder[-1]), running=4)  # the holder is now the busiest
    again = common_pb2.MediaInput(media_hash=h)
    a.assign([again], "vlm")
    assert again.encoder.instance_id == holder  # its cache holds the image: skip the tower
    assert _pick(a, HASHES[8]) == f"enc-{other}"  # a new image goes by load
    # a restarted holder (newer epoch) starts with an empty cache: the image goes by load again
    infos[int(holder[-1])] = _enc(int(holder[-1]), epoch=2)
    _report(loads, int(holder[-1]), running=4, epoch=2)
    assert _pick(a, h) == f"enc-{other}"


def test_sent_images_stop_counting_after_the_report_window() -> None:
    clock = Clock()
    a = _affinity([_enc(0), _enc(1)], clock=clock)
    h = HASHES[0]
    first = _pick(a, h)
    a.assign([common_pb2.MediaInput(media_hash=f"{i}") for i in range(8)], "vlm")
    assert set(a._sent) == {"enc-0", "enc-1"}
    clock.t += 10.0  # long past --max-load-age: only reports count, and both are idle
    assert _pick(_affinity([_enc(0), _enc(1)], clock=clock), h) == first
    fresh_hash = "f" * 32
    assert _pick(a, fresh_hash) == _pick(_affinity([_enc(0), _enc(1)]), fresh_hash)


def test_the_remembered_holders_are_bounded() -> None:
    a = MediaAffinity(EncoderRouter(StaticMembership([_enc(0)]), LoadTable()), remembered=10, clock=Clock())
    a.assign([common_pb2.MediaInput(media_hash=h) for h in HASHES[:25]], "vlm")
    assert list(a.holders) == HASHES[15:25]


def test_grpc_generate_refuses_media_naming_the_field() -> None:
    req = gateway_pb2.GenerateRequest(text="hi", media=[common_pb2.MediaInput(media_hash="ab")])
    with pytest.raises(ApiError) as e:
        plan_of(req, 512)
    assert e.value.status == 400 and e.value.param == "media" and "HTTP" in e.value.message
