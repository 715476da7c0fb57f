"""/metrics on a service's own event loop, and the engine collector's values (read at scrape time)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from proto.pdrelay.v1 import common_pb2
from shared.config.groups import TelemetryConfig
from shared.engine.types import StepStats
from shared.telemetry.metrics import EngineCollector, ServiceMetrics, error_label
from shared.telemetry.metrics_server import MetricsServer
from shared.telemetry.service import ServiceTelemetry


def _value(text: str, sample: str) -> float:
    m = re.search(rf"^{re.escape(sample)} ([0-9.e+-]+)$", text, re.MULTILINE)
    assert m is not None, f"{sample} missing from:\n{text}"
    return float(m.group(1))


async def test_metrics_server_serves_the_registry():
    reg = CollectorRegistry()
    c = Counter("pdrelay:things", "things", registry=reg)
    c.inc(3)
    server = MetricsServer(reg)
    port = await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            r = await client.get("/metrics")
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
            assert _value(r.text, "pdrelay:things_total") == 3
            c.inc()
            assert _value((await client.get("/metrics?x=1")).text, "pdrelay:things_total") == 4
            assert (await client.get("/")).status_code == 404
            assert (await client.post("/metrics")).status_code == 405
            head = await client.head("/metrics")
            assert head.status_code == 200 and head.content == b""
    finally:
        await server.close()


async def test_service_telemetry_binds_the_configured_port_or_says_so():
    busy = MetricsServer(CollectorRegistry())
    port = await busy.start()
    try:
        cfg = TelemetryConfig(enable_metrics=True, metrics_port=port, otlp_traces_endpoint=None)
        tel = ServiceTelemetry(cfg, role="decode", instance_id="d", cluster="c")
        with pytest.raises(OSError):
            await tel.start_metrics("127.0.0.1")
        off = ServiceTelemetry(TelemetryConfig(enable_metrics=False), role="decode", instance_id="d", cluster="c")
        assert await off.start_metrics("127.0.0.1") == "" and off.metrics_address == ""
        free = ServiceTelemetry(
            TelemetryConfig(enable_metrics=True, metrics_port=0), role="decode", instance_id="d", cluster="c"
        )
        address = await free.start_metrics("127.0.0.1", advertise_host="10.1.2.3")
        assert address.startswith("10.1.2.3:") and int(address.split(":")[1]) > 0
        await free.close()
    finally:
        await busy.close()


def test_engine_collector_reads_stats_at_scrape_time():
    stats = SimpleNamespace(
        num_running=3,
        num_waiting=2,
        num_free_pages=50,
        num_evictable_pages=10,
        num_cached_pages=30,
        num_total_pages=100,
        num_prompt_tokens=400,
        num_cached_prompt_tokens=100,
        num_generated_tokens=77,
        num_preemptions=1,
        num_steps=9,
        totals=StepStats(0.1, 0.2, 3.0, 0.3, 0.4, num_tokens=500),
    )
    current: list[object | None] = [None]
    reg = CollectorRegistry()
    reg.register(EngineCollector(lambda: current[0]))
    assert "pdrelay:kv_pages_total" not in generate_latest(reg).decode()  # absent before the engine exists
    current[0] = stats
    text = generate_latest(reg).decode()
    assert _value(text, "pdrelay:num_requests_running") == 3
    assert _value(text, "pdrelay:num_requests_waiting") == 2
    assert _value(text, "pdrelay:kv_pages_used") == 100 - 50 - 10
    assert _value(text, "pdrelay:kv_pages_free") == 60
    assert _value(text, "pdrelay:kv_cache_usage_perc") == pytest.approx(0.4)
    assert _value(text, "pdrelay:prefix_cache_hit_rate") == pytest.approx(0.25)
    assert _value(text, "pdrelay:prefix_cache_hits_total") == 100
    assert _value(text, "pdrelay:generation_tokens_total") == 77
    assert _value(text, "pdrelay:engine_steps_total") == 9
    assert _value(text, 'pdrelay:engine_step_seconds_total{phase="forward"}') == pytest.approx(3.0)
    assert _value(text, 'pdrelay:engine_step_seconds_total{phase="update"}') == pytest.approx(0.4)
    assert _value(text, "pdrelay:engine_step_tokens_total") == 500


def test_errors_are_counted_by_code_name():
    m = ServiceMetrics()
    m.count_error(common_pb2.ERROR_CODE_OVERLOADED)
    m.count_error(common_pb2.ERROR_CODE_OVERLOADED)
    m.count_error(common_pb2.ERROR_CODE_CHECKSUM_MISMATCH)
    text = generate_latest(m.registry).decode()
    assert _value(text, 'pdrelay:request_errors_total{code="overloaded"}') == 2
    assert _value(text, 'pdrelay:request_errors_total{code="checksum_mismatch"}') == 1
    assert error_label(999) == "999"
