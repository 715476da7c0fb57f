"""The gateways' view of the traffic, for the forecast: each evaluation scrapes every gateway's /metrics and turns
the change of its counters since the last scrape into one TrafficSample.

    arrivals        finished generation requests + change of the in-flight gauge (requests are counted when they
                    end; in flight + finished counts them when they arrive, which a backlog would otherwise hide)
    prompt          prompt tokens of the requests admitted, per request (of those that finished from a gateway
                    without the admission counters)
    answer          generated tokens of the requests that finished, per request (unknown before the end)
    ITL             time between token chunks, summed over all streams, per gap (what clients see, including what
                    the engines' step times leave out: hops, queueing in the gateway and in the decode servicer)

A gateway that cannot be scraped is skipped for that interval (and its counters re-read from scratch next time).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.planner.forecast import TrafficSample

log = logging.getLogger(__name__)
# one line per scrape at INFO would drown the decision log
logging.getLogger("httpx").setLevel(logging.WARNING)

GENERATION_ENDPOINTS = frozenset({"/v1/completions", "/v1/chat/completions"})


@dataclass(frozen=True)
class GatewayCounters:
    """Cumulative counters of one gateway at one moment."""

    at: float  # monotonic seconds
    finished: float = 0.0
    in_flight: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    itl_sum: float = 0.0
    itl_count: float = 0.0
    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    admitted: float = 0.0
    admitted_prompt_tokens: float = 0.0


def parse_counters(text: str, at: float) -> GatewayCounters:
    v: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "pdrelay:http_requests_total":
                if s.labels.get("endpoint") in GENERATION_ENDPOINTS:
                    v["finished"] = v.get("finished", 0.0) + s.value
            else:
                v[s.name] = s.value
    return GatewayCounters(
        at,
        v.get("finished", 0.0),
        v.get("pdrelay:http_requests_in_flight", 0.0),
        v.get("pdrelay:prompt_tokens_total", 0.0),
        v.get("pdrelay:generation_tokens_total", 0.0),
        v.get("pdrelay:inter_token_latency_seconds_sum", 0.0),
        v.get("pdrelay:inter_token_latency_seconds_count", 0.0),
        v.get("pdrelay:time_to_first_token_seconds_sum", 0.0),
        v.get("pdrelay:time_to_first_token_seconds_count", 0.0),
        v.get("pdrelay:admitted_requests_total", 0.0),
        v.get("pdrelay:admitted_prompt_tokens_total", 0.0),
    )


def sample_between(pairs: list[tuple[GatewayCounters, GatewayCounters]]) -> TrafficSample | None:
    """One sample from (previous, current) counters of every gateway scraped twice; None without any."""
    if not pairs:
        return None
    dt = max(c.at - p.at for p, c in pairs)
    if dt <= 0:
        return None
    d = {
        k: sum(getattr(c, k) - getattr(p, k) for p, c in pairs)
        for k in (
            "finished",
            "in_flight",
            "prompt_tokens",
            "generation_tokens",
            "itl_sum",
            "itl_count",
            "ttft_sum",
            "ttft_count",
            "admitted",
            "admitted_prompt_tokens",
        )
    }
    arrivals = max(0.0, d["finished"] + d["in_flight"])
    done = d["finished"]
    # prompts as they arrive (a gateway that counts admissions); else those of the requests that finished
    prompt = (
        d["admitted_prompt_tokens"] / d["admitted"]
        if d["admitted"] > 0
        else (d["prompt_tokens"] / done if done > 0 else 0.0)
    )
    return TrafficSample(
        interval_s=dt,
        arrivals_per_s=arrivals / dt,
        prompt_tokens=prompt,
        answer_tokens=d["generation_tokens"] / done if done > 0 else 0.0,
        itl_s=d["itl_sum"] / d["itl_count"] if d["itl_count"] > 0 else None,
        ttft_s=d["ttft_sum"] / d["ttft_count"] if d["ttft_count"] > 0 else None,
    )


class GatewayScraper:
    """Scrapes the gateways' /metrics (plain HTTP on their API address) once per evaluation."""

    def __init__(self, timeout_s: float = 1.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._http = httpx.AsyncClient(timeout=timeout_s, transport=transport)
        self._last: dict[str, GatewayCounters] = {}
        self._warned: set[str] = set()

    async def sample(self, addresses: dict[str, str], now: float) -> TrafficSample | None:
        """addresses: gateway instance id -> "host:port" of its HTTP API."""
        pairs: list[tuple[GatewayCounters, GatewayCounters]] = []
        for iid, addr in addresses.items():
            try:
                r = await self._http.get(f"http://{addr}/metrics")
                r.raise_for_status()
                cur = parse_counters(r.text, now)
            except (httpx.HTTPError, ValueError) as e:
                if iid not in self._warned:
                    self._warned.add(iid)
                    log.warning("planner: cannot read %s's metrics at %s (%s); forecasting without it", iid, addr, e)
                self._last.pop(iid, None)
                continue
            prev = self._last.get(iid)
            self._last[iid] = cur
            if prev is not None and cur.finished >= prev.finished:  # a restarted gateway starts from zero
                pairs.append((prev, cur))
        for gone in [k for k in self._last if k not in addresses]:
            del self._last[gone]  # gateways that left: bounded state
        return sample_between(pairs)

    async def close(self) -> None:
        await self._http.aclose()
