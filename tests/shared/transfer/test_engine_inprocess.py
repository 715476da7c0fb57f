"""Two engines of one backend in this process: writes, notifications, endpoint refresh, and every typed error."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pytest
import torch

from shared.transfer import (
    BackendUnavailable,
    PageDesc,
    PeerError,
    RegionError,
    TransferEngine,
    TransferError,
    TransferHandle,
    TransferTimeout,
    create_engine,
)
from shared.transfer.endpoint import encode_endpoint

BACKENDS = ["nixl", "mooncake"]
PAGE_FLOATS = 1024  # 4 KiB pages
PAGE_BYTES = PAGE_FLOATS * 4


@pytest.fixture(scope="module", params=BACKENDS)
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[TransferEngine, TransferEngine]]:
    """(writer, reader), shared by a module's tests: a Mooncake engine takes ~1 s to close."""
    w = create_engine(request.param, name=f"w-{request.param}", host="127.0.0.1")
    r = create_engine(request.param, name=f"r-{request.param}", host="127.0.0.1")
    yield w, r
    w.close()
    r.close()


@pytest.fixture
def pools(pair: tuple[TransferEngine, TransferEngine]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """A fresh registered source pool on the writer and a zeroed one on the reader; deregistered afterwards."""
    w, r = pair
    src = torch.randn(16, PAGE_FLOATS)  # [num_pages, page_floats]
    dst = torch.zeros(16, PAGE_FLOATS)
    w.register(src)
    r.register(dst)
    r.notifications()  # drop what an earlier test left
    yield src, dst
    for eng in (w, r):
        for region in eng.regions():
            eng.deregister(region)


def drive(w: TransferEngine, r: TransferEngine, h: TransferHandle, timeout_s: float = 10.0) -> str:
    """Poll the writer while progressing the reader (NIXL without a progress thread needs both)."""
    deadline = time.monotonic() + timeout_s
    while (status := w.poll(h)) == "pending" and time.monotonic() < deadline:
        r.progress()
    return status


def recv_notifs(r: TransferEngine, timeout_s: float = 5.0) -> list[tuple[str, bytes]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = r.notifications()
        if got:
            return got
        time.sleep(0.001)
    return []


def test_write_scattered_pages_and_notify(pair, pools) -> None:
    w, r = pair
    src, dst = pools
    peer = w.connect(r.endpoint())
    src_ids, dst_ids = [0, 1, 2, 9, 4], [5, 6, 7, 0, 15]  # pages 0-2 -> 5-7 coalesce into one descriptor
    h = w.write(
        peer,
        w.describe_pages(w.regions()[0], src_ids, PAGE_BYTES),
        r.describe_pages(r.regions()[0], dst_ids, PAGE_BYTES),
        notify=b"req-1:epoch-0",
    )
    assert (h.nbytes, h.num_descs) == (5 * PAGE_BYTES, 3)
    assert drive(w, r, h) == "done"
    assert w.poll(h) == "done"  # the terminal state is remembered
    w.wait(h, timeout_s=1)  # ... until wait() collects it
    with pytest.raises(TransferError, match="unknown transfer handle"):
        w.poll(h)
    assert recv_notifs(r) == [(w.name, b"req-1:epoch-0")]
    expected = torch.zeros_like(dst)
    expected[dst_ids] = src[src_ids]
    assert torch.equal(dst, expected)


def test_connect_is_cached_and_refreshed_when_the_peer_registers_more(pair, pools) -> None:
    w, r = pair
    src, _ = pools
    peer = w.connect(r.endpoint())
    assert w.connect(r.endpoint()) == peer
    old_endpoint = r.endpoint()
    assert w.connected(old_endpoint) == peer and w.connected(b"never-loaded") is None
    extra = torch.zeros(4, PAGE_FLOATS)
    extra_region = r.register(extra)  # not in the endpoint the writer loaded: refused until it reconnects
    assert w.connected(r.endpoint()) is None  # a changed endpoint needs a real connect()
    dst = r.describe_pages(extra_region, [3], PAGE_BYTES)
    src_desc = w.describe_pages(w.regions()[0], [8], PAGE_BYTES)
    with pytest.raises(RegionError, match="outside the memory peer"):
        w.write(peer, src_desc, dst)
    assert w.connect(r.endpoint()) == peer  # the changed endpoint replaces the old one
    assert w.connected(r.endpoint()) == peer and w.connected(old_endpoint) is None
    h = w.write(peer, src_desc, dst)
    assert drive(w, r, h) == "done"
    w.wait(h, 1)
    assert torch.equal(extra[3], src[8]) and not extra[:3].any()


def test_garbage_and_foreign_endpoints_raise_peer_error(pair) -> None:
    w, _ = pair
    with pytest.raises(PeerError, match="not a pdrelay transfer endpoint"):
        w.connect(b"\x00garbage")
    with pytest.raises(PeerError, match="--transfer-backend"):
        other = "mooncake" if w.backend == "nixl" else "nixl"
        w.connect(encode_endpoint(other, "x", b"whatever", []))
    bad_payload = b"\x00not-nixl-metadata" if w.backend == "nixl" else b"127.0.0.1:1"  # nothing listens on port 1
    with pytest.raises(PeerError):
        w.connect(encode_endpoint(w.backend, "ghost", bad_payload, []))
    assert "ghost" not in w.peers()


def test_write_errors_are_typed(pair, pools) -> None:
    w, r = pair
    peer = w.connect(r.endpoint())
    src = w.describe_pages(w.regions()[0], [0], PAGE_BYTES)
    dst = r.describe_pages(r.regions()[0], [0], PAGE_BYTES)
    with pytest.raises(PeerError, match="unknown peer 'nobody'"):
        w.write("nobody", src, dst)
    with pytest.raises(ValueError, match="one destination per source"):
        w.write(peer, src, dst + dst)
    with pytest.raises(ValueError, match="source length"):
        w.write(peer, src, [PageDesc(dst[0].addr, PAGE_BYTES // 2)])
    with pytest.raises(RegionError, match="outside the memory peer"):
        w.write(peer, src, [PageDesc(dst[0].addr + 16 * PAGE_BYTES, PAGE_BYTES)])
    with pytest.raises(ValueError, match="outside region"):
        w.describe_pages(w.regions()[0], [16], PAGE_BYTES)
    region = w.regions()[0]
    w.deregister(region)
    with pytest.raises(RegionError, match="deregistered"):
        w.write(peer, src, dst)
    with pytest.raises(RegionError, match="not registered"):
        w.deregister(region)


def test_register_validates_its_input(pair) -> None:
    w, _ = pair
    with pytest.raises(ValueError, match="contiguous"):
        w.register(torch.zeros(8, 8).t())
    with pytest.raises(ValueError, match="nbytes > 0"):
        w.register(12345)
    with pytest.raises(ValueError, match="device"):
        w.register(12345, 64, device="tpu")  # type: ignore[arg-type]
    t = torch.zeros(64)
    region = w.register(t)
    try:
        assert (region.addr, region.nbytes, region.device) == (t.data_ptr(), 256, "cpu")
        with pytest.raises(ValueError, match="overlaps"):
            w.register(t[8:])
    finally:
        w.deregister(region)


def test_nixl_receiver_that_never_progresses_times_out(pair, pools) -> None:
    w, r = pair
    if w.backend != "nixl":
        pytest.skip("Mooncake's receiver progresses on its own threads")
    src, dst = pools
    peer = w.connect(r.endpoint())
    h = w.write(
        peer, w.describe_pages(w.regions()[0], [3], PAGE_BYTES), r.describe_pages(r.regions()[0], [4], PAGE_BYTES)
    )
    with pytest.raises(TransferTimeout, match="not done after 0.3 s"):
        w.wait(h, timeout_s=0.3)
    with pytest.raises(TransferError, match="in use by transfers"):
        w.deregister(w.regions()[0])
    assert drive(w, r, h) == "done"  # the same transfer completes once the receiver progresses
    w.wait(h, 1)
    assert torch.equal(dst[4], src[3])


def test_closed_engine_refuses_calls() -> None:
    eng = create_engine("nixl", name="short-lived", host="127.0.0.1")
    eng.close()
    eng.close()  # idempotent
    with pytest.raises(TransferError, match="closed"):
        eng.endpoint()
    with pytest.raises(TransferError, match="closed"):
        eng.register(torch.zeros(4))


@pytest.mark.parametrize(
    ("backend", "modules", "hint"),
    [
        ("nixl", ("nixl_cu12", "nixl_cu12._api"), "pip install nixl-cu12"),
        ("mooncake", ("mooncake", "mooncake.engine"), "apt-get install libibverbs1"),
    ],
)
def test_missing_backend_names_the_install_command(monkeypatch, backend, modules, hint) -> None:
    for m in modules:  # None in sys.modules makes `import m` raise ImportError, as when the wheel is absent
        monkeypatch.setitem(sys.modules, m, None)
    with pytest.raises(BackendUnavailable, match=hint) as e:
        create_engine(backend, name="x", host="127.0.0.1")
    assert "pip install" in str(e.value)


def test_unknown_backend_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="not one of \\('nixl', 'mooncake'\\)"):
        create_engine("rdma-magic", name="x", host="127.0.0.1")
