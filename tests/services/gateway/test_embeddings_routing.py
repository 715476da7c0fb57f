"""Encoder routing and the embeddings API's input checks, without a cluster (a static membership)."""

from __future__ import annotations

import pytest

from services.gateway.http.embeddings import inputs_of
from services.gateway.openai.errors import ApiError
from services.gateway.routing.encoders import EncoderRouter
from shared.cluster.bus.load import LoadReport, LoadSnapshot, LoadTable
from shared.cluster.instance import Capacity, EncoderInfo, InstanceInfo, InstanceState, Modality


class StaticMembership:
    stale = False

    def __init__(self, infos: list[InstanceInfo]) -> None:
        self.infos = infos

    def ready(self, role: str | None = None) -> list[InstanceInfo]:
        return [i for i in self.infos if (role is None or i.role == role) and i.state == InstanceState.READY]

    def instances(self, role: str | None = None) -> list[InstanceInfo]:
        return [i for i in self.infos if role is None or i.role == role]

    def on_event(self, cb):  # type: ignore[no-untyped-def]
        return lambda: None


def _enc(iid: str, model: str = "mini", modalities=(Modality.EMBEDDING,), state=InstanceState.READY) -> InstanceInfo:
    return InstanceInfo(
        cluster="c",
        role="encoder",
        instance_id=iid,
        grpc_address=f"127.0.0.1:{len(iid)}",
        epoch=1,
        state=state,
        model=model,
        capacity=Capacity(max_running_requests=8),
        encoder=EncoderInfo(modalities=tuple(modalities), embedding_model=model, embedding_dim=384, max_seq_len=256),
    )


def test_router_filters_by_modality_model_and_state_and_picks_by_load() -> None:
    infos = [
        _enc("e1"),
        _enc("e2"),
        _enc("e3", model="other"),
        _enc("e4", modalities=(Modality.IMAGE,)),
        _enc("e5", state=InstanceState.DRAINING),
    ]
    loads = LoadTable()
    loads._on_report(
        LoadReport(instance_id="e1", role="encoder", epoch=1, seq=1, ts=0.0, load=LoadSnapshot(running=3, queued=2)),
        None,
    )  # type: ignore[arg-type]
    r = EncoderRouter(StaticMembership(infos), loads)
    cands = r.candidates(Modality.EMBEDDING, "mini")
    assert sorted(c.instance_id for c in cands) == ["e1", "e2"]
    assert r.pick(cands).instance_id == "e2"  # e1 reported 5 busy of 8
    assert r.pick(cands, exclude={"e2"}).instance_id == "e1"
    assert r.pick(cands, exclude={"e1", "e2"}) is None
    assert set(r.embedding_models()) == {"mini", "other"}
    # equal loads take turns; requests this gateway has outstanding count too
    idle = [c for c in r.candidates(Modality.EMBEDDING, "mini") if c.instance_id == "e2"] + [
        c for c in r.candidates(Modality.EMBEDDING, "other")
    ]
    picks = {r.pick(idle).instance_id for _ in range(4)}
    assert picks == {"e2", "e3"}
    r.begin("e2")
    assert all(r.pick(idle).instance_id == "e3" for _ in range(3))
    r.end("e2")
    assert "e2" not in r.inflight


@pytest.mark.parametrize(
    "value, texts, tokens",
    [
        ("hi", ("hi",), ()),
        (["a", "b"], ("a", "b"), ()),
        ([1, 2, 3], (), ((1, 2, 3),)),
        ([[1, 2], [3]], (), ((1, 2), (3,))),
    ],
)
def test_inputs_of_accepts_the_four_openai_shapes(value, texts, tokens) -> None:  # type: ignore[no-untyped-def]
    assert inputs_of(value) == (texts, tokens)


@pytest.mark.parametrize(
    "value, match",
    [
        ("", "empty string"),
        ([], "empty list"),
        (["a", ""], r"input\[1\] is an empty string"),
        (["a", [1]], "not a mix"),
        ([[1], []], r"input\[1\] is an empty list"),
        ([-3], "token id -3"),
        ([1.5], "not a mix"),
        (["x"] * 2049, "at most 2048"),
    ],
)
def test_inputs_of_refuses_bad_shapes(value, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ApiError, match=match) as e:
        inputs_of(value)
    assert e.value.status == 400 and e.value.param == "input"
