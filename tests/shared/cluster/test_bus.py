"""The NATS bus against a real nats-server: typed channels, malformed payloads, outages and restarts."""

from __future__ import annotations

import asyncio
import threading
import time

import msgspec
import pytest

from shared.cluster.bus import subjects
from shared.cluster.bus.cancel import Cancel, publish_cancel, subscribe_cancel
from shared.cluster.bus.client import Bus, Meta
from shared.cluster.bus.drain import DrainCommand, send_drain, subscribe_drain
from shared.cluster.bus.kv_events import KVEventBatch, KVEventPublisher, KVOpKind, subscribe_kv_events
from shared.cluster.bus.load import LoadReport, LoadReporter, LoadSnapshot, LoadTable, subscribe_load
from shared.cluster.bus.scale import ScaleReply, ScaleRequest, request_scale, serve_scale
from shared.cluster.errors import ControlPlaneUnavailable
from shared.cluster.localcluster.servers import free_port

pytestmark = pytest.mark.timeout(60)


async def _until(pred, timeout: float = 5.0, step: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(step)


def test_subject_names_and_validation() -> None:
    assert subjects.kv_events("c1", "decode-1") == "pdrelay.c1.kv.decode-1"
    assert subjects.load("c1") == "pdrelay.c1.load.*"
    assert subjects.cancel("c1") == "pdrelay.c1.cancel"
    assert subjects.drain("c1", "p-2") == "pdrelay.c1.drain.p-2"
    for bad in ("a.b", "a b", ">", ""):
        with pytest.raises(ValueError, match="may only contain"):
            subjects.drain("c1", bad)
    with pytest.raises(ValueError, match="outage policy"):
        Bus("nats://127.0.0.1:1", outage_policy="queue")


async def test_unreachable_nats_names_the_url() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(ControlPlaneUnavailable) as e:
        await Bus(url).connect(timeout_s=1.0)
    assert time.monotonic() - t0 < 4
    msg = str(e.value)
    assert url in msg and "--nats-url" in msg and "pdrelay up" in msg and "nats-server -a 127.0.0.1" in msg


async def test_typed_channels_round_trip(nats_server) -> None:
    async with Bus(nats_server.url, name="a") as a, Bus(nats_server.url, name="b") as b:
        got_cancel: list[Cancel] = []
        got_drain: list[DrainCommand] = []
        await subscribe_cancel(b, "c", lambda m, meta: got_cancel.append(m))
        await subscribe_drain(b, "c", "d-1", lambda m, meta: got_drain.append(m))
        await asyncio.sleep(0.05)  # SUB reaches the server before the publishes
        assert await publish_cancel(a, "c", "req-1", reason="client_disconnected", origin="gw")
        assert await send_drain(a, "c", "d-2", reason="other instance")
        assert await send_drain(a, "c", "d-1", reason="scale_down", timeout_s=3)
        await _until(lambda: got_cancel and got_drain)
        await asyncio.sleep(0.1)
        assert got_cancel == [Cancel(request_id="req-1", reason="client_disconnected", origin="gw")]
        assert [d.instance_id for d in got_drain] == ["d-1"] and got_drain[0].timeout_s == 3
        with pytest.raises(ValueError):
            await publish_cancel(a, "c", "")


async def test_headers_hook_travels_with_messages(nats_server) -> None:
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with Bus(nats_server.url, headers_hook=lambda: {"traceparent": tp}) as a, Bus(nats_server.url) as b:
        metas: list[Meta] = []
        await subscribe_cancel(b, "c", lambda m, meta: metas.append(meta))
        await asyncio.sleep(0.05)
        await publish_cancel(
            a,
            "c",
            "r",
        )
        await _until(lambda: metas)
        assert metas[0].headers.get("traceparent") == tp and metas[0].subject == "pdrelay.c.cancel"


async def test_malformed_payloads_are_dropped_and_counted(nats_server) -> None:
    async with Bus(nats_server.url) as a, Bus(nats_server.url) as b:
        got: list[Cancel] = []
        await subscribe_cancel(b, "c", lambda m, meta: got.append(m))
        await asyncio.sleep(0.05)
        subj = subjects.cancel("c")
        await a.publish_raw(subj, b"\xc1 not msgpack")
        await a.publish_raw(subj, msgspec.msgpack.encode({"request_id": 7}))  # wrong field type
        await a.publish_raw(subj, msgspec.msgpack.encode({"reason": "no id"}))  # missing required field
        await a.publish(subj, DrainCommand(instance_id="x"))  # another channel's type
        await publish_cancel(a, "c", "ok-1")
        await _until(lambda: got)
        await asyncio.sleep(0.1)
        assert [c.request_id for c in got] == ["ok-1"]
        assert b.stats.malformed == 4 and b.stats.received == 5


async def test_handler_exceptions_do_not_stop_the_subscription(nats_server) -> None:
    async with Bus(nats_server.url) as a:
        seen: list[str] = []

        def handler(m: Cancel, meta: Meta) -> None:
            seen.append(m.request_id)
            if m.request_id == "boom":
                raise RuntimeError("consumer bug")

        await subscribe_cancel(a, "c", handler)
        await asyncio.sleep(0.05)
        for rid in ("a", "boom", "b"):
            await publish_cancel(a, "c", rid)
        await _until(lambda: len(seen) == 3)
        assert seen == ["a", "boom", "b"] and a.stats.handler_errors == 1


async def test_kv_event_batches_keep_order_and_accept_other_threads(nats_server) -> None:
    async with Bus(nats_server.url) as a, Bus(nats_server.url) as b:
        events: list[KVEventBatch] = []
        await subscribe_kv_events(b, "c", lambda e, meta: events.append(e))
        await asyncio.sleep(0.05)
        pub = KVEventPublisher(a, "c", "p-1", epoch=4, page_size=16, batch_window_s=0.01)
        pub.stored([1, 2])
        pub.stored([3])
        pub.evicted([1])
        t = threading.Thread(target=pub.stored, args=([9],))  # the engine may call from its own thread
        t.start()
        t.join()
        await _until(lambda: events)
        ev = events[0]
        assert (ev.instance_id, ev.epoch, ev.seq, ev.page_size) == ("p-1", 4, 1, 16)
        assert [(op.kind, op.block_hashes) for op in ev.ops] == [
            (KVOpKind.STORED, (1, 2, 3)),
            (KVOpKind.EVICTED, (1,)),
            (KVOpKind.STORED, (9,)),
        ]
        pub.set_epoch(5)
        pub.stored([2**64 - 1])  # block hashes are full uint64
        await _until(lambda: len(events) == 2)
        assert events[1].epoch == 5 and events[1].seq == 1
        assert [op.kind for op in events[1].ops] == [KVOpKind.CLEARED, KVOpKind.STORED]
        assert events[1].ops[1].block_hashes == (2**64 - 1,)
        await pub.close()


async def test_load_reports_arrive_periodically_and_latest_wins(nats_server) -> None:
    async with Bus(nats_server.url) as a, Bus(nats_server.url) as b:
        table = await LoadTable().subscribe(b, "c")
        await asyncio.sleep(0.05)
        running = [0]
        rep = LoadReporter(
            a, "c", "d-1", "decode", lambda: LoadSnapshot(running=running[0], free_pages=10), interval_s=0.05, epoch=3
        ).start()
        await _until(lambda: "d-1" in table.latest)
        running[0] = 7
        await _until(lambda: table.latest["d-1"].load.running == 7)
        r = table.latest["d-1"]
        assert r.seq >= 2 and r.epoch == 3 and r.role == "decode"
        # an older report arriving late does not overwrite the newer one
        table._on_report(
            LoadReport(instance_id="d-1", role="decode", epoch=3, seq=1, ts=0, load=LoadSnapshot()), Meta("x", {})
        )
        assert table.latest["d-1"].load.running == 7
        await rep.close()
        await asyncio.sleep(0.3)
        assert "d-1" not in table.fresh(max_age_s=0.2)
        await table.close()


async def test_request_reply_for_scale(nats_server) -> None:
    async with Bus(nats_server.url) as sup, Bus(nats_server.url) as cli:
        await serve_scale(sup, "c", lambda req, meta: ScaleReply(ok=True, counts=dict(req.targets)))
        await asyncio.sleep(0.05)
        reply = await request_scale(cli, "c", {"prefill": 3})
        assert reply.ok and reply.counts == {"prefill": 3}
        with pytest.raises(TimeoutError):
            await request_scale(cli, "other", {"prefill": 1}, timeout_s=0.3)
        assert isinstance(ScaleRequest(targets={}), ScaleRequest)


async def test_nats_restart_publishers_and_subscribers_recover(nats_server) -> None:
    buffered = Bus(nats_server.url, outage_policy="buffer", reconnect_wait_s=0.2)
    dropping = Bus(nats_server.url, outage_policy="drop", reconnect_wait_s=0.2)
    sub = Bus(nats_server.url, reconnect_wait_s=0.2)
    for bus in (buffered, dropping, sub):
        await bus.connect()
    got: list[str] = []
    own: list[str] = []
    await subscribe_cancel(sub, "c", lambda m, meta: got.append(m.request_id))
    await subscribe_cancel(buffered, "c", lambda m, meta: own.append(m.request_id))
    await asyncio.sleep(0.05)
    await publish_cancel(buffered, "c", "before")
    await _until(lambda: "before" in got and "before" in own)

    nats_server.kill()
    await _until(lambda: not buffered.connected and not dropping.connected and not sub.connected)
    # publishing during the outage never raises: buffered, or dropped and counted
    assert await publish_cancel(buffered, "c", "during") is True
    assert await publish_cancel(dropping, "c", "dropped") is False
    assert dropping.stats.dropped == 1 and buffered.stats.buffered_during_outage == 1

    await asyncio.to_thread(nats_server.start)
    await _until(lambda: buffered.connected and dropping.connected and sub.connected, timeout=10)
    # the buffering client's own subscription was restored before its buffer was flushed
    await _until(lambda: "during" in own)
    for i in range(50):  # the other clients reconnect on their own schedule; new messages flow again
        await publish_cancel(dropping, "c", f"after-{i}")
        if any(x.startswith("after") for x in got):
            break
        await asyncio.sleep(0.1)
    assert any(x.startswith("after") for x in got)
    assert "dropped" not in got and "dropped" not in own
    assert buffered.stats.reconnects >= 1 and sub.stats.reconnects >= 1
    for bus in (buffered, dropping, sub):
        await bus.close()


async def test_full_outage_buffer_drops_instead_of_raising(nats_server) -> None:
    bus = Bus(nats_server.url, outage_policy="buffer", pending_bytes=2048, reconnect_wait_s=0.2)
    await bus.connect()
    nats_server.kill()
    await _until(lambda: not bus.connected)
    results = [await publish_cancel(bus, "c", "x" * 100) for _ in range(100)]
    assert results[0] is True and results[-1] is False
    assert bus.stats.dropped > 0 and bus.stats.dropped + bus.stats.buffered_during_outage == 100
    await bus.close()


async def test_a_repeated_load_report_waits_for_the_heartbeat_and_a_change_goes_at_once(nats_server) -> None:
    async with Bus(nats_server.url) as a, Bus(nats_server.url) as b:
        got: list[tuple[float, LoadReport]] = []
        sub = await subscribe_load(b, "c", lambda r, meta: got.append((time.monotonic(), r)))
        await asyncio.sleep(0.05)
        running = [0]
        # interval 0.05 s: a heartbeat every 5th tick (0.25 s) while nothing changes
        rep = LoadReporter(a, "c", "d-1", "decode", lambda: LoadSnapshot(running=running[0]), interval_s=0.05).start()
        await asyncio.sleep(1.0)
        idle = len(got)
        assert 3 <= idle <= 6, [r.seq for _, r in got]  # ~4 heartbeats, not ~20 reports
        assert [r.seq for _, r in got] == list(range(1, idle + 1))  # held-back reports take no sequence number
        running[0] = 3
        changed = time.monotonic()
        await _until(lambda: got[-1][1].load.running == 3)
        assert got[-1][0] - changed < 0.2  # one interval, not a heartbeat
        await rep.close()
        await sub.unsubscribe()


class _RecordingBus:
    def __init__(self) -> None:
        self.sent: list[LoadReport] = []

    async def publish(self, subject: str, msg: LoadReport) -> bool:
        self.sent.append(msg)
        return True


@pytest.mark.parametrize(("interval_s", "every"), [(0.2, 2), (0.1, 5), (0.05, 5), (0.3, 1), (1.0, 1)])
async def test_the_heartbeat_is_counted_in_ticks_and_at_most_half_a_second(interval_s: float, every: int) -> None:
    # `pdrelay status` listens for 0.6 s: an idle instance must report within that, whatever the tick phase
    bus = _RecordingBus()
    rep = LoadReporter(bus, "c", "d-1", "decode", LoadSnapshot, interval_s=interval_s)  # type: ignore[arg-type]
    sent = []
    for _ in range(3 * every):
        before = len(bus.sent)
        await rep.report_now(unless_repeat=True)
        sent.append(len(bus.sent) - before)
    assert sent == ([1] + [0] * (every - 1)) * 3
    assert every * interval_s <= 0.5 or every == 1
    await rep.report_now()  # an explicit report is never held back
    assert len(bus.sent) == 4
