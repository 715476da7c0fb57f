"""The "mla" KV layout kind (one latent row per token and layer, no V): its page bytes, its pool, and that it
travels with the layout on the wire and in the kvstore's namespace, so a prefill and a decode of different kinds
(or latent widths) refuse each other at the ticket, while every "mha" layout encodes and digests as before."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

import pytest
import torch

from proto.pdrelay.v1 import common_pb2
from services.kvstore.remote import namespace_digest
from shared.engine.kv_pool import KVPool
from shared.modelspec.kv_layout import KVLayout
from shared.serving.convert import layout_from_pb, layout_to_pb

MHA = KVLayout("float32", 16, 2, 2, 16)
# DeepSeek-V3's shape: kv_lora_rank 512 + qk_rope_head_dim 64 per token, 61 layers
V3 = KVLayout("bfloat16", 64, 61, 1, 512 + 64, kind="mla")


def test_mla_page_bytes_have_no_v_half():
    assert V3.planes == 1 and MHA.planes == 2
    assert V3.page_bytes == 61 * 64 * (512 + 64) * 2
    assert MHA.page_bytes == 2 * 2 * 16 * 2 * 16 * 4  # unchanged: 8192
    with pytest.raises(ValueError, match="num_kv_heads 1"):
        KVLayout("float32", 16, 2, 2, 20, kind="mla")
    with pytest.raises(ValueError, match="kind 'gqa' is unknown"):
        KVLayout("float32", 16, 2, 2, 16, kind="gqa")


def test_mla_pool_holds_latent_rows_only():
    lay = KVLayout("float32", 4, 3, 1, 20, kind="mla")
    pool = KVPool(lay, 5)
    assert pool.buffer.shape == (5, 3, 1, 4, 1, 20) and pool.nbytes == 5 * lay.page_bytes == 5 * 3 * 4 * 20 * 4
    rows = torch.randn(3, 1, 20)
    pool.write_latent(1, torch.tensor([2, 2, 4]), torch.tensor([0, 3, 1]), rows)
    assert torch.equal(pool.k(1)[2, 0], rows[0]) and torch.equal(pool.k(1)[4, 1], rows[2])
    assert torch.equal(pool.k_rows(1)[2].view(4, 20)[3], rows[1, 0])
    pool.copy_pages([(2, 0)])
    assert torch.equal(pool.page_view(0), pool.page_view(2))
    assert pool.page_ptr(1) - pool.page_ptr(0) == lay.page_bytes
    with pytest.raises(ValueError, match="latent rows only"):
        pool.v(0)
    with pytest.raises(ValueError, match="latent rows only"):
        pool.v_rows(0)


def test_kinds_and_latent_widths_refuse_each_other():
    mla = KVLayout("float32", 16, 2, 1, 20, kind="mla")
    same_numbers_mha = KVLayout("float32", 16, 2, 1, 20)
    other_rank = KVLayout("float32", 16, 2, 1, 24, kind="mla")  # kv_lora_rank 20 instead of 16
    assert mla.compatible_with(KVLayout("float32", 16, 2, 1, 20, kind="mla"))
    assert not mla.compatible_with(same_numbers_mha) and not same_numbers_mha.compatible_with(mla)
    assert not mla.compatible_with(other_rank)
    # and after the wire: what a prefill reads from a decode's ticket
    assert not layout_from_pb(layout_to_pb(same_numbers_mha)).compatible_with(mla)
    assert not layout_from_pb(layout_to_pb(other_rank)).compatible_with(mla)
    assert layout_from_pb(layout_to_pb(mla)).compatible_with(mla)


def test_kind_round_trips_and_mha_bytes_are_unchanged():
    assert layout_from_pb(layout_to_pb(V3)) == V3
    assert layout_to_pb(V3).kind == common_pb2.KV_LAYOUT_KIND_MLA
    # an mha layout's message is byte for byte what it was before the field existed
    old = common_pb2.KVLayout(dtype=common_pb2.DTYPE_FLOAT32, page_size=16, num_layers=2, num_kv_heads=2, head_dim=16)
    assert layout_to_pb(MHA).SerializeToString() == old.SerializeToString()
    assert layout_from_pb(old) == MHA and layout_from_pb(old).kind == "mha"


def test_malformed_kinds_are_refused_at_the_wire():
    bad = layout_to_pb(V3)
    bad.num_kv_heads = 2
    with pytest.raises(ValueError, match="num_kv_heads 1"):
        layout_from_pb(bad)
    unknown = layout_to_pb(MHA)
    unknown.kind = 7  # type: ignore[assignment]  # a newer peer's kind: proto3 enums keep unknown values
    with pytest.raises(ValueError, match="unknown kind"):
        layout_from_pb(unknown)


def test_kvstore_namespace_carries_the_kind():
    mha_digest_before = hashlib.sha256(
        json.dumps(
            {"model": "m", "layout": {k: v for k, v in asdict(MHA).items() if k != "kind"}}, sort_keys=True
        ).encode()
    ).hexdigest()[:16]
    assert namespace_digest("m", MHA) == mha_digest_before  # existing stores keep their keys
    mla = KVLayout("float32", 16, 2, 1, 16, kind="mla")
    assert namespace_digest("m", mla) != namespace_digest("m", KVLayout("float32", 16, 2, 1, 16))
