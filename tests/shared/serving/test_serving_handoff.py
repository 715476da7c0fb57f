"""The hand-off protocol pieces shared by decode and prefill (shared/serving/handoff.py, convert.py): epochs,
fencing, answer acceptance, ticket page descriptors and layouts."""

from __future__ import annotations

import pytest

from proto.pdrelay.v1 import common_pb2, worker_pb2
from shared.modelspec.kv_layout import KVLayout
from shared.serving.convert import layout_from_pb, layout_to_pb
from shared.serving.handoff import (
    EpochClock,
    FencingLedger,
    accept_response,
    descs_from_pb,
    paged_descriptors,
    pages_needed,
)
from shared.transfer.descs import PageDesc

LAYOUT = KVLayout("float32", 16, 2, 2, 16)  # page_bytes = 2 * 2 * 16 * 2 * 16 * 4 = 8192


def answer(rid: str, epoch: int, token: int = 7) -> worker_pb2.PrefillResponse:
    return worker_pb2.PrefillResponse(request_id=rid, epoch=epoch, first_token_id=token)


# ---- EpochClock ---------------------------------------------------------------------------------------------------
def test_epochs_increase_within_and_across_registrations():
    clock = EpochClock()
    seen = [clock.next(3) for _ in range(100)]
    assert seen == sorted(seen) and len(set(seen)) == 100
    assert all(e >> 32 == 3 for e in seen)
    # a restarted decode has a new clock but a higher registration epoch: every epoch is above the old ones
    restarted = EpochClock()
    assert restarted.next(4) > max(seen)
    # the clock of one instance keeps increasing when its registration epoch rises (re-registration)
    assert clock.next(5) > restarted.next(4)


# ---- FencingLedger ------------------------------------------------------------------------------------------------
def test_ledger_new_busy_replay_stale():
    led = FencingLedger()
    assert led.check("r", 10) == ("new", None)
    led.begin("r", 10)
    assert led.is_current("r", 10) and not led.is_current("r", 9)
    assert led.check("r", 10) == ("busy", None)
    assert led.check("r", 9) == ("stale", None)
    resp = answer("r", 10)
    led.finish("r", 10, resp)
    state, cached = led.check("r", 10)
    assert state == "replay" and cached is resp
    assert led.check("r", 9) == ("stale", None)
    assert led.check("r", 11) == ("new", None)  # a retry of decode (new epoch) runs again
    assert led.check("other", 1) == ("new", None)


def test_ledger_failed_attempt_may_rerun_but_still_fences_older_epochs():
    led = FencingLedger()
    led.begin("r", 10)
    led.finish("r", 10, None)
    assert led.check("r", 10) == ("new", None), "a failed epoch may run again (same ticket, network retry)"
    # the failed epoch still fences: an older ticket arriving late must not write into reused pages
    assert led.check("r", 9) == ("stale", None)


def test_ledger_ignores_the_finish_of_a_superseded_epoch():
    led = FencingLedger()
    led.begin("r", 10)
    led.begin("r", 11)  # decode retried here with a newer epoch while 10 was still running
    led.finish("r", 10, answer("r", 10))
    assert led.check("r", 11) == ("busy", None)
    assert led.check("r", 10) == ("stale", None)
    led.finish("r", 11, answer("r", 11, token=9))
    assert led.check("r", 11)[1].first_token_id == 9  # type: ignore[union-attr]


def test_ledger_forgets_the_oldest_request_ids_beyond_its_size():
    led = FencingLedger(size=3)
    for i in range(5):
        led.begin(f"r{i}", 5)
        led.finish(f"r{i}", 5, answer(f"r{i}", 5))
    assert led.check("r0", 4) == ("new", None)  # forgotten
    assert led.check("r4", 4) == ("stale", None)
    assert led.check("r2", 5)[0] == "replay"


# ---- accept_response ----------------------------------------------------------------------------------------------
def test_accept_response_names_what_is_wrong():
    assert accept_response(answer("r", 5), "r", 5) is None
    why = accept_response(answer("q", 5), "r", 5)
    assert why is not None and "'q'" in why and "'r'" in why
    why = accept_response(answer("r", 4), "r", 5)
    assert why is not None and "epoch 4" in why and "5" in why and "stale" in why


# ---- page descriptors ---------------------------------------------------------------------------------------------
def test_paged_descriptors_round_trip_to_addresses():
    pb = paged_descriptors(0x10000, LAYOUT.page_bytes, [5, 0, 9])
    assert pb.memory_kind == common_pb2.MEMORY_KIND_DRAM
    got = descs_from_pb(pb, LAYOUT)
    pb_bytes = LAYOUT.page_bytes
    assert got == [
        PageDesc(0x10000 + 5 * pb_bytes, pb_bytes),
        PageDesc(0x10000, pb_bytes),
        PageDesc(0x10000 + 9 * pb_bytes, pb_bytes),
    ]
    assert paged_descriptors(1, 2, [0], device_id=3, on_gpu=True).memory_kind == common_pb2.MEMORY_KIND_VRAM


def test_regions_descriptors():
    pb = common_pb2.PageDescriptors(
        regions=common_pb2.RegionList(addresses=[100, 900000], lengths=[LAYOUT.page_bytes] * 2)
    )
    assert descs_from_pb(pb, LAYOUT) == [PageDesc(100, LAYOUT.page_bytes), PageDesc(900000, LAYOUT.page_bytes)]


@pytest.mark.parametrize(
    "pages, match",
    [
        (common_pb2.PageDescriptors(), "no destination pages"),
        (paged_descriptors(4096, 4096, [1, 2]), "4096 bytes but the layout says 8192"),
        (
            common_pb2.PageDescriptors(regions=common_pb2.RegionList(addresses=[1, 2], lengths=[8192])),
            "2 addresses but 1 lengths",
        ),
        (
            common_pb2.PageDescriptors(regions=common_pb2.RegionList(addresses=[1, 2], lengths=[8192, 100])),
            "100 bytes is not one whole page of 8192",
        ),
    ],
)
def test_malformed_descriptors_are_value_errors(pages: common_pb2.PageDescriptors, match: str):
    with pytest.raises(ValueError, match=match):
        descs_from_pb(pages, LAYOUT)


def test_pages_needed():
    assert [pages_needed(n, 16) for n in (1, 15, 16, 17, 32, 33)] == [1, 1, 1, 2, 2, 3]


# ---- layouts on the wire ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_layout_round_trip(dtype: str):
    layout = KVLayout(dtype, 16, 30, 3, 64)
    assert layout_from_pb(layout_to_pb(layout)) == layout


def test_layout_from_pb_refuses_malformed_layouts():
    good = layout_to_pb(LAYOUT)
    no_dtype = common_pb2.KVLayout()
    no_dtype.CopyFrom(good)
    no_dtype.dtype = common_pb2.DTYPE_UNSPECIFIED
    with pytest.raises(ValueError, match="no known dtype"):
        layout_from_pb(no_dtype)
    zero = common_pb2.KVLayout()
    zero.CopyFrom(good)
    zero.head_dim = 0
    with pytest.raises(ValueError, match="zero dimension"):
        layout_from_pb(zero)
    other = KVLayout("float32", 8, 2, 2, 16)
    assert not LAYOUT.compatible_with(other) and LAYOUT.compatible_with(layout_from_pb(good))
