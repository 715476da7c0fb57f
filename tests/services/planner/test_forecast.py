"""The throughput mode without processes: Holt's trend on synthetic traffic, sizing from fitted capacities, the
gateway counters it reads, and the policy scaling ahead of the load (and yielding to a measured breach)."""

from __future__ import annotations

import pytest

from services.gateway.metrics import GatewayMetrics
from services.planner.estimate import InstanceLoad, Learned, estimate_decode, estimate_prefill
from services.planner.forecast import (
    Capacity,
    Forecaster,
    Holt,
    TrafficSample,
    size_decode,
    size_prefill,
)
from services.planner.policy import Limits, Outlook, RoleMemory, RoleView, ScaledRole, decide
from services.planner.traffic import GatewayCounters, parse_counters, sample_between
from shared.cluster.bus.planner import Action

P, D = ScaledRole.PREFILL, ScaledRole.DECODE


def test_holt_follows_a_linear_rise_and_reads_it_ahead() -> None:
    h = Holt()
    for t in range(20):
        h.update(1.0 + 0.5 * t)  # +0.5 per interval
    assert h.trend == pytest.approx(0.5, rel=0.05)
    assert h.ahead(2) == pytest.approx(1.0 + 0.5 * 21, rel=0.02)
    flat = Holt()
    for _ in range(10):
        flat.update(3.0)
    assert flat.ahead(5) == pytest.approx(3.0)
    falling = Holt()
    for t in range(10):
        falling.update(max(0.0, 4.0 - t))
    assert falling.ahead(10) == 0.0  # never a negative rate


def test_sizes_follow_the_fitted_capacities() -> None:
    cap = Capacity(prefill_tokens_per_s=400.0, itl_line=(0.05, 0.002), itl_correction=1.0)
    # 2 req/s x 768 tokens = 1536 tok/s of work, 400 tok/s per instance at 75 % busy -> 5.12 -> 6
    assert size_prefill(2.0, 768, cap) == 6
    assert size_prefill(2.0, 32, cap) == 1
    # 5 req/s x 96 tokens x 0.068 s = 32.6 streams in flight; step = 50 + 2 x batch ms <= 68 ms: 9 a piece -> 4
    assert size_decode(5.0, 96, cap, 0.068) == 4
    # the client sees 1.2 x the engine's step: the engine has to aim at 56.7 ms -> 3.4 streams a piece -> 10
    assert size_decode(5.0, 96, Capacity(400.0, (0.05, 0.002), 1.2), 0.068) == 10
    assert size_decode(5.0, 96, Capacity(400.0, None), 0.068) == 0  # no fit yet: no forecast size
    # a target at the step-time floor (50 ms + 2 ms per request vs an aim of 45 ms): as thin as possible
    assert size_decode(0.5, 20, Capacity(400.0, (0.05, 0.002)), 0.045) == 1
    assert size_decode(2.0, 20, Capacity(400.0, (0.05, 0.002)), 0.045) == 2


def ramp_samples(rates: list[float], isl: float, osl: float) -> Forecaster:
    f = Forecaster()
    for r in rates:
        f.update(TrafficSample(interval_s=2.0, arrivals_per_s=r, prompt_tokens=isl, answer_tokens=osl))
    return f


def test_forecast_reads_a_rising_rate_ahead_and_never_below_its_level() -> None:
    cap = Capacity(400.0, (0.05, 0.002))
    assert ramp_samples([1.0], 32, 96).forecast(4.0, 2.0, cap, 0.068) is None  # one sample: no trend yet
    rising = ramp_samples([0.5, 1.0, 1.5, 2.0, 2.5, 3.0], 32, 96).forecast(4.0, 2.0, cap, 0.068)
    assert rising is not None and rising.arrivals_per_s > 3.0  # two intervals ahead of the last sample
    falling = ramp_samples([5.0, 4.0, 3.0, 2.0], 32, 96).forecast(4.0, 2.0, cap, 0.068)
    assert falling is not None
    assert falling.arrivals_per_s == pytest.approx(falling.numbers["rate_level_req_per_s"])
    assert "forecast" in rising.why("decode") and "96-token answers" in rising.why("decode")


def test_gateway_counters_give_arrivals_lengths_and_client_itl() -> None:
    m = GatewayMetrics()
    before = parse_counters(m.render().decode(), at=10.0)
    for _ in range(6):  # 6 requests ended, 4 more are streaming: 10 arrived
        m.count_request("/v1/completions", 200)
        m.prompt_tokens.inc(32)
        m.generation_tokens.inc(96)
    m.count_request("/metrics", 200)  # not a generation request
    for _ in range(4):
        m.in_flight.inc()
    for _ in range(50):
        m.itl.observe(0.07)
    after = parse_counters(m.render().decode(), at=12.0)
    s = sample_between([(before, after)])
    assert s is not None
    assert s.arrivals_per_s == pytest.approx(5.0)
    assert (s.prompt_tokens, s.answer_tokens) == (32.0, 96.0)
    assert s.itl_s == pytest.approx(0.07)
    assert sample_between([]) is None
    assert sample_between([(GatewayCounters(at=5.0), GatewayCounters(at=5.0))]) is None


def test_prompt_lengths_are_read_as_requests_arrive() -> None:
    m = GatewayMetrics()
    before = parse_counters(m.render().decode(), at=10.0)
    for _ in range(4):  # long prompts finish while short ones arrive: the forecast wants the arriving mix
        m.started(32)
    for _ in range(2):
        m.count_request("/v1/completions", 200)
        m.prompt_tokens.inc(768)
        m.generation_tokens.inc(8)
    s = sample_between([(before, parse_counters(m.render().decode(), at=12.0))])
    assert s is not None and s.prompt_tokens == 32.0 and s.answer_tokens == 8.0
    f = ramp_samples([2.0] * 5, 768, 8)
    for _ in range(3):
        f.update(TrafficSample(interval_s=2.0, arrivals_per_s=5.0, prompt_tokens=32, answer_tokens=8))
    fc = f.forecast(4.0, 2.0, Capacity(400.0, (0.05, 0.002)), 0.068)
    # smoothed without a trend: on its way down from 768 to 32 tokens, never below the new length
    assert fc is not None and 32 <= fc.prompt_tokens < 768 * 0.2


def test_client_ttft_counts_when_prompts_wait_at_prefill() -> None:
    waiting = tuple(
        InstanceLoad(f"p{i}", pending_prefill_tokens=800, compute_tokens_per_s=400.0, busy=0.9, step_ms=100.0)
        for i in range(5)
    )
    model = estimate_prefill(waiting, 5, Learned(), 3.0)
    assert model.now_s == pytest.approx(2.1)  # 4000 tokens / (5 x 400 tok/s) + one step: within 3 s
    seen = estimate_prefill(waiting, 5, Learned(), 3.0, client_ttft_s=3.6)
    assert seen.now_s == pytest.approx(3.6) and seen.numbers["client_ttft_ms"] == pytest.approx(3600)
    idle = tuple(InstanceLoad(f"p{i}", compute_tokens_per_s=400.0, busy=0.1, step_ms=100.0) for i in range(5))
    # nothing waits at prefill: a slow first token was someone else's (decode admission, a hop)
    assert estimate_prefill(idle, 5, Learned(), 3.0, client_ttft_s=3.6).now_s == pytest.approx(0.1)


def test_client_itl_corrects_the_decode_estimate() -> None:
    loads = tuple(InstanceLoad(f"d{i}", running=8 + 8 * i, step_ms=60.0 + 16 * i, busy=1.0) for i in range(2))
    plain = estimate_decode(loads, 2, Learned(), 0.08, 0.3)
    learned = Learned()
    seen = estimate_decode(loads, 2, learned, 0.08, 0.3, client_itl_s=0.1)  # engines say 68 ms, clients see 100
    assert learned.itl_correction > 1.0
    assert seen.now_s == pytest.approx(0.1)
    assert seen.at(2) > plain.at(2)  # type: ignore[operator]
    assert seen.needed >= plain.needed


def limits(**kw) -> Limits:  # type: ignore[no-untyped-def]
    base: dict[str, object] = dict(
        ttft_target_s=3.0,
        itl_target_s=0.08,
        min_count={P: 1, D: 1},
        max_count={P: 5, D: 5},
        budget=6,
        scale_up_cooldown_s=4,
        scale_down_cooldown_s=8,
        hysteresis=0.3,
        idle_threshold=0.5,
        max_scale_step=3,
    )
    base.update(kw)
    return Limits(**base)  # type: ignore[arg-type]


def views(p: int, d: int, *, d_running: int = 4, d_step_ms: float = 55.0, p_pending: int = 0) -> dict:  # type: ignore[type-arg]
    pl = tuple(
        InstanceLoad(f"p{i}", pending_prefill_tokens=p_pending // p, compute_tokens_per_s=400.0, busy=0.3, step_ms=80.0)
        for i in range(p)
    )
    dl = tuple(
        InstanceLoad(
            f"d{i}", running=d_running + i, step_ms=d_step_ms + 2 * i, busy=1.0, free_pages=900, total_pages=1000
        )
        for i in range(d)
    )
    return {P: RoleView(P, p, pl), D: RoleView(D, d, dl)}


def test_decode_scales_up_ahead_of_a_rising_rate_before_its_itl_breaks() -> None:
    mem = {P: RoleMemory(), D: RoleMemory()}
    mem[D].learned.itl_points.extend([(1.0, 0.052), (8.0, 0.066)])  # earlier reports: step = 50 + 2 x batch ms
    f = ramp_samples([0.5, 1.0, 1.5, 2.0, 2.5], 32, 96)
    plans = {p.role: p for p in decide(views(1, 1), mem, limits(), 100.0, Outlook(f, 4.0, 2.0, 0.058))}
    d = plans[D]
    assert d.action == Action.SCALE_UP and d.target > 1
    assert d.numbers["est_itl_ms"] < 80  # within the target now: the forecast alone scaled it
    assert d.reason.startswith("forecast") and "ahead of the load" in d.reason
    assert plans[P].action == Action.HOLD  # 32-token prompts: one prefill instance keeps up
    # without the outlook the load mode alone holds
    again = {p.role: p for p in decide(views(1, 1), {P: RoleMemory(), D: RoleMemory()}, limits(), 100.0)}
    assert again[D].action == Action.HOLD


def test_forecast_keeps_instances_the_load_mode_would_drain() -> None:
    f = ramp_samples([8.0] * 6, 32, 96)  # 52 streams in flight at 68 ms: 10 a piece -> 6
    mem = {P: RoleMemory(), D: RoleMemory()}
    quiet = views(1, 5, d_running=1, d_step_ms=50.0)
    plans = {p.role: p for p in decide(quiet, mem, limits(), 100.0)}
    assert plans[D].action == Action.SCALE_DOWN  # measured alone: idle
    mem = {P: RoleMemory(), D: RoleMemory()}
    plans = {p.role: p for p in decide(quiet, mem, limits(), 100.0, Outlook(f, 4.0, 2.0, None))}
    assert plans[D].action != Action.SCALE_DOWN and plans[D].numbers["forecast_needed"] >= 5


def test_a_measured_prefill_breach_takes_the_budget_from_a_forecast() -> None:
    f = ramp_samples([4.0, 4.5, 5.0, 5.0], 32, 96)
    mem = {P: RoleMemory(), D: RoleMemory()}
    # prefill: 30000 pending tokens at 400 tok/s on 1 instance = 75 s >> 3 s; decode at 5 of 6 is calm
    plans = {p.role: p for p in decide(views(1, 5, p_pending=30000), mem, limits(), 100.0, Outlook(f, 4.0, 2.0, 0.058))}
    assert plans[P].action == Action.SCALE_UP and plans[P].target > 1
    assert sum(p.target for p in plans.values()) <= 6


def test_growing_decode_streams_scale_decode_before_any_answer_length_is_known() -> None:
    f = Forecaster()
    cap = Capacity(300.0, (0.05, 0.002))
    for streams, rate in ((2, 0.5), (5, 1.0), (9, 1.5), (14, 2.0)):
        f.update(TrafficSample(interval_s=2.0, arrivals_per_s=rate))  # nothing finished yet: no answer length
        f.update_streams(streams)
    fc = f.forecast(6.0, 2.0, cap, 0.068)
    assert fc is not None and fc.answer_tokens == 0
    # 14 streams now, rising ~4 per interval: ~2x ahead, at 9 streams a piece -> at least 3 instances
    assert fc.decode_needed >= 3 and fc.numbers["forecast_streams"] > 14
    assert "streams" in fc.why("decode")


def test_scraper_skips_an_unreachable_gateway_and_forgets_those_that_left() -> None:
    import asyncio

    import httpx

    from services.planner.traffic import GatewayScraper

    m = GatewayMetrics()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "10.0.0.9":
            raise httpx.ConnectError("refused")
        return httpx.Response(200, text=m.render().decode())

    async def run() -> None:
        s = GatewayScraper(transport=httpx.MockTransport(handler))
        gws = {"gw-1": "127.0.0.1:1", "gw-2": "10.0.0.9:1"}
        assert await s.sample(gws, now=1.0) is None  # first scrape: nothing to compare with
        for _ in range(4):
            m.count_request("/v1/chat/completions", 200)
            m.prompt_tokens.inc(100)
            m.generation_tokens.inc(10)
        got = await s.sample(gws, now=3.0)
        assert got is not None and got.arrivals_per_s == pytest.approx(2.0) and got.prompt_tokens == 100
        assert await s.sample({}, now=5.0) is None and s._last == {}  # the gateways left: nothing kept
        await s.close()

    asyncio.run(run())
