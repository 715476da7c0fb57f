"""The router: from the ready pools, a policy, the KV index and the breakers, choose where a request goes.

Pool selection (per request, from what is ready for the request's model):
    decode + prefill ready  -> disaggregated: a decode instance and the prefill instance it hands the prompt to
    else worker ready       -> colocated: one worker does both
    else decode ready       -> decode-local: decode prefills itself (empty PrefillTarget)
    else                    -> NoRoute (nothing can serve the request)

A pair is admitted as a unit: when an attempt fails on the prefill side (see failures.py) the caller excludes that
prefill and asks for a new plan, which may keep the decode, so a decode never waits on a prefill that refused.
The router also counts what this gateway has in flight per instance (local_load.py), which it measures for each
candidate beside its KV overlap before a policy ranks them (policies.Scored). KV overlap is credited only for
instances whose KV index entry is exact (kv_index.py); the others are ranked by load. The prompt's overlap with
every instance comes from one walk of the KV index per page size, and a large pool is cut to a shortlist before
scoring (shortlist.py). Everything here is synchronous and pure apart from the clock inside the breakers and the
shortlist's random sample.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Collection, Mapping

from services.gateway.routing.breaker import BreakerBoard
from services.gateway.routing.kv_index import KVIndex, Overlaps, PromptHashes, leading_pages
from services.gateway.routing.local_load import Lease, LocalLoad, LocalLoads
from services.gateway.routing.policies import RankingPolicy, Scored
from services.gateway.routing.shortlist import Shortlist
from services.gateway.routing.views import Candidate, Mode, Pools, RoutePlan, RouteRequest


class NoRouteReason(enum.StrEnum):
    NONE_READY = "none_ready"  # no servable pool
    BREAKERS_OPEN = "breakers_open"  # every candidate's circuit breaker is open
    EXCLUDED = "excluded"  # every candidate already failed or refused this request


class NoRoute(Exception):
    """No instance can take the request now; `reason` says why."""

    def __init__(self, message: str, reason: NoRouteReason) -> None:
        super().__init__(message)
        self.reason = reason


class _PromptOverlaps:
    """One request's overlaps with the KV index, one index walk per page size."""

    def __init__(self, kv_index: KVIndex, hashes: PromptHashes) -> None:
        self._kv_index = kv_index
        self.hashes = hashes
        self._by_page_size: dict[int, Overlaps] = {}

    def at(self, page_size: int) -> Overlaps:
        got = self._by_page_size.get(page_size)
        if got is None:
            got = self._by_page_size[page_size] = self._kv_index.overlaps(self.hashes.for_page_size(page_size))
        return got

    def pages(self, page_size: int) -> Mapping[str, int]:
        return self.at(page_size).pages


def _scored(cands: list[Candidate], overlaps: _PromptOverlaps, loads: LocalLoads, prompt_len: int) -> list[Scored]:
    """What a policy scores of each candidate for one request: its KV overlap with the prompt (KV index, plus
    prompts of ours it is computing now), what a kvstore holds past it, and this gateway's own in-flight work."""
    now = loads.clock()
    out = []
    for c in cands:
        loc = loads.get(c.instance_id)
        cached = store = 0
        if c.page_size > 0:
            ov = overlaps.at(c.page_size)
            pages = ov.pages.get(c.instance_id, 0)
            if loc.computing:
                pages = max(pages, leading_pages(overlaps.hashes.for_page_size(c.page_size), loc.computing))
            cached = min(pages * c.page_size, prompt_len)
            store = max(0, min(ov.store_pages * c.page_size, prompt_len) - cached)
        out.append(
            Scored(
                c,
                cached_tokens=cached,
                store_tokens=store,
                inflight=loc.inflight,
                inflight_tokens=loc.inflight_tokens,
                pending_prefill_tokens=loc.remaining_prefill_tokens(now),
            )
        )
    return out


class Router:
    def __init__(
        self,
        policy: RankingPolicy,
        *,
        kv_index: KVIndex | None = None,
        breakers: BreakerBoard | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.clock = clock
        self.kv_index = kv_index if kv_index is not None else KVIndex()
        self.breakers = breakers if breakers is not None else BreakerBoard()
        self.loads = LocalLoads(clock)  # what this gateway has in flight per instance
        self.shortlist = Shortlist()

    # ------------------------------------------------------------------ planning

    def plan(
        self, req: RouteRequest, pools: Pools, exclude: Collection[str] = (), hashes: PromptHashes | None = None
    ) -> RoutePlan:
        """The best plan for `req` avoiding `exclude`; raises NoRoute when there is none."""
        if not pools.servable:
            raise NoRoute(
                "no decode or worker instance is ready" + (" (only prefill instances are)" if pools.prefill else ""),
                NoRouteReason.NONE_READY,
            )
        overlaps = _PromptOverlaps(self.kv_index, hashes or PromptHashes(req.prompt_token_ids))
        hashes = overlaps.hashes
        n = len(req.prompt_token_ids)

        def allowed(c: Candidate) -> bool:
            return c.instance_id not in exclude and self.breakers.allows(c.instance_id)

        def usable(pool: str, cands: tuple[Candidate, ...]) -> list[Scored]:
            return _scored(self.shortlist.pick(pool, cands, allowed, overlaps.pages, exclude), overlaps, self.loads, n)

        usable_decode = usable("decode", pools.decode)
        usable_prefill = usable("prefill", pools.prefill)
        usable_worker = usable("worker", pools.worker)
        policy = self.policy
        # Disaggregated first when both halves exist; a pool whose members are all excluded falls through to the
        # next mode (a request whose prefills all refused may still be served colocated or decode-local).
        if usable_decode and usable_prefill:
            decode = policy.rank_decode(usable_decode, req)[0]
            prefill = policy.rank_prefill(usable_prefill, req)[0]
            return RoutePlan(
                Mode.DISAGGREGATED, decode.cand, prefill.cand, prefill.cached_tokens, _hashes(hashes, prefill.cand)
            )
        if usable_worker:
            worker = policy.rank_worker(usable_worker, req)[0]
            return RoutePlan(Mode.COLOCATED, worker.cand, None, worker.cached_tokens, _hashes(hashes, worker.cand))
        if usable_decode:
            decode = policy.rank_decode(usable_decode, req)[0]
            return RoutePlan(Mode.DECODE_LOCAL, decode.cand, None, decode.cached_tokens, _hashes(hashes, decode.cand))
        everyone = [c.instance_id for c in (*pools.decode, *pools.worker)]
        if all(iid in exclude for iid in everyone):
            raise NoRoute(
                f"every instance that could serve the request failed or refused it ({', '.join(everyone)})",
                NoRouteReason.EXCLUDED,
            )
        raise NoRoute(
            f"the circuit breakers of every ready instance are open ({', '.join(everyone)}); they are failing requests",
            NoRouteReason.BREAKERS_OPEN,
        )

    # ------------------------------------------------------------------ attempts

    def begin(self, plan: RoutePlan, prompt_tokens: int) -> Lease:
        """An attempt of `plan` starts: count it locally and let half-open breakers know this is their probe."""
        for iid in plan.instance_ids:
            self.breakers.get(iid).on_attempt()
        return self.loads.lease(plan, prompt_tokens)

    def succeeded(self, instance_ids: Collection[str]) -> None:
        for iid in instance_ids:
            self.breakers.get(iid).on_success()

    def failed(self, blame: Collection[str], involved: Collection[str]) -> None:
        """Breaker bookkeeping of a failed attempt: `blame` recorded a server-side failure; the others in
        `involved` are released from any half-open probe without a verdict."""
        for iid in involved:
            if iid in blame:
                self.breakers.get(iid).on_failure()
            else:
                self.breakers.get(iid).on_abandoned()

    def abandoned(self, instance_ids: Collection[str]) -> None:
        for iid in instance_ids:
            self.breakers.get(iid).on_abandoned()

    # ------------------------------------------------------------------ membership

    def forget(self, instance_id: str) -> None:
        """The instance left: drop its breaker, KV entries and (now meaningless) local counters."""
        self.breakers.remove(instance_id)
        self.kv_index.remove(instance_id)
        self.loads.forget(instance_id)

    def local(self, instance_id: str) -> LocalLoad:
        return self.loads.get(instance_id)


def _hashes(hashes: PromptHashes, cand: Candidate) -> tuple[int, ...]:
    """The prompt's page hashes at the candidate's page size: the pages it holds once it computed the prompt."""
    return tuple(hashes.for_page_size(cand.page_size)) if cand.page_size > 0 else ()
