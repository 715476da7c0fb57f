"""The generated package imports the way the services use it, and messages round-trip on the wire."""

from __future__ import annotations

import pytest

from proto.pdrelay.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, worker_pb2, worker_pb2_grpc


def _ticket() -> worker_pb2.HandoffTicket:
    return worker_pb2.HandoffTicket(
        request_id="req-7",
        epoch=3,
        decode_instance_id="decode-a",
        decode_instance_epoch=11,
        decode_peer=common_pb2.TransferPeer(
            backend=common_pb2.TRANSFER_BACKEND_NIXL, agent_name="decode-a", agent_metadata=bytes(range(256))
        ),
        pages=common_pb2.PageDescriptors(
            memory_kind=common_pb2.MEMORY_KIND_DRAM,
            paged=common_pb2.PagedRegion(base_address=2**47 + 4096, page_bytes=368640, page_ids=[5, 9, 2]),
        ),
        layout=common_pb2.KVLayout(
            dtype=common_pb2.DTYPE_BFLOAT16, page_size=16, num_layers=30, num_kv_heads=3, head_dim=64
        ),
        prompt_token_ids=[1, 2, 3, 49151],
        sampling=common_pb2.SamplingParams(temperature=0.0, top_k=20, stop=["\n\n"], max_tokens=64, seed=2**63),
        trace=common_pb2.TraceContext(traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    )


def test_ticket_round_trips_with_every_field() -> None:
    t = _ticket()
    back = worker_pb2.HandoffTicket.FromString(t.SerializeToString())
    assert back == t
    assert back.pages.WhichOneof("layout") == "paged"
    assert list(back.pages.paged.page_ids) == [5, 9, 2]
    assert back.decode_peer.agent_metadata == bytes(range(256))


def test_optional_sampling_fields_distinguish_unset_from_zero() -> None:
    greedy = common_pb2.SamplingParams(temperature=0.0)
    default = common_pb2.SamplingParams()
    assert greedy.HasField("temperature") and not default.HasField("temperature")
    # unset and zero must survive the wire differently, or "greedy" would silently become "temperature 1.0"
    assert common_pb2.SamplingParams.FromString(greedy.SerializeToString()).HasField("temperature")
    assert not common_pb2.SamplingParams.FromString(default.SerializeToString()).HasField("temperature")


def test_token_ids_reject_negative_values() -> None:
    with pytest.raises(ValueError):
        worker_pb2.DecodeRequest(prompt_token_ids=[-1])


def test_services_declare_the_documented_methods() -> None:
    def methods(pb2, service: str) -> set[str]:
        return {m.name for m in pb2.DESCRIPTOR.services_by_name[service].methods}

    assert methods(gateway_pb2, "Gateway") == {"Generate", "Tokenize", "ListModels", "Health", "Embed"}
    assert methods(worker_pb2, "Decode") == {"Generate"}
    assert methods(worker_pb2, "Prefill") == {"Prefill"}
    assert methods(worker_pb2, "Encoder") == {"Encode", "Embed"}
    assert methods(worker_pb2, "KVStore") == {"Lookup", "Put", "CommitPut", "Get", "Stats"}
    gen = worker_pb2.DESCRIPTOR.services_by_name["Decode"].methods_by_name["Generate"]
    assert gen.server_streaming and not gen.client_streaming
    assert gen.input_type.full_name == "pdrelay.v1.DecodeRequest"


def test_grpc_stub_modules_expose_servicers_and_registration() -> None:
    for mod, svc in (
        (worker_pb2_grpc, "Decode"),
        (worker_pb2_grpc, "Prefill"),
        (worker_pb2_grpc, "KVStore"),
        (worker_pb2_grpc, "Encoder"),
        (gateway_pb2_grpc, "Gateway"),
    ):
        assert hasattr(mod, f"{svc}Stub") and hasattr(mod, f"{svc}Servicer")
        assert callable(getattr(mod, f"add_{svc}Servicer_to_server"))
