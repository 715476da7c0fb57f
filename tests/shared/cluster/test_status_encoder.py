"""`pdrelay status` names what each encoder serves (its modalities and the models behind them) and each engine
instance's tensor-parallel size."""

from __future__ import annotations

from shared.cluster.instance import EncoderInfo, InstanceInfo, Modality
from shared.cluster.status import ClusterStatus, StatusRow, _serves, format_table


def _info(enc: EncoderInfo | None, role: str = "encoder") -> InstanceInfo:
    return InstanceInfo(cluster="c", role=role, instance_id="x", grpc_address="127.0.0.1:1", encoder=enc)


def test_status_lists_an_encoders_modalities_and_models() -> None:
    both = EncoderInfo(
        modalities=(Modality.EMBEDDING, Modality.IMAGE), embedding_model="all-MiniLM-L6-v2", vision_model="tiny-llava"
    )
    assert _serves(_info(both)) == "embedding all-MiniLM-L6-v2, image tiny-llava"
    assert _serves(_info(EncoderInfo(modalities=(Modality.IMAGE,), vision_model="v"))) == "image v"
    assert _serves(_info(None, role="prefill")) == ""
    rows = [
        StatusRow(
            role="encoder",
            instance_id="encoder-1",
            state="ready",
            epoch=1,
            grpc="127.0.0.1:1",
            serves=_serves(_info(both)),
        ),
        StatusRow(role="prefill", instance_id="prefill-1", state="ready", epoch=1, grpc="127.0.0.1:2"),
    ]
    text = format_table(ClusterStatus(cluster="c", etcd_url="e", nats_url="n", rows=rows))
    assert "  encoder-1 serves embedding all-MiniLM-L6-v2, image tiny-llava" in text.splitlines()
    assert "prefill-1 serves" not in text


def test_status_shows_each_engine_instances_tp_size() -> None:
    rows = [
        StatusRow(role="decode", instance_id="decode-1", state="ready", epoch=1, grpc="127.0.0.1:3", tp_size=1),
        StatusRow(role="prefill", instance_id="prefill-1", state="ready", epoch=1, grpc="127.0.0.1:2", tp_size=2),
        StatusRow(role="kvstore", instance_id="kv-1", state="ready", epoch=1, grpc="127.0.0.1:4"),
    ]
    lines = format_table(ClusterStatus(cluster="c", etcd_url="e", nats_url="n", rows=rows)).splitlines()
    assert lines[1].split()[:6] == ["ROLE", "INSTANCE", "STATE", "EPOCH", "GRPC", "TP"]
    assert [line.split()[5] for line in lines[2:5]] == ["1", "2", "-"]
