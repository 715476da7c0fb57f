"""The router: from the ready pools, a policy, the KV index and the breakers, choose where a request goes.

Pool selection (per request, from what is ready for the request's model):
    decode + prefill ready  -> disaggregated: a decode instance and the prefill instance it hands the prompt to
    else worker ready       -> colocated: one worker does both
    else decode ready       -> decode-local: decode prefills itself (empty PrefillTarget)
    else                    -> NoRoute (nothing can serve the request)

A pair is admitted as a unit: when an attempt fails on the prefill side (see failures.py) the caller excludes that
prefill and asks for a new plan, which may keep the decode, so a decode never waits on a prefill that refused.
The router also counts what this gateway has in flight per instance (`Lease`), which the policies add to the
instances' reports. Everything here is synchronous and pure apart from the clock inside the breakers.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from services.gateway.routing.breaker import BreakerBoard
from services.gateway.routing.kv_index import KVIndex, PromptHashes, leading_pages
from services.gateway.routing.policies import RankingPolicy
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


@dataclass
class _Local:
    inflight: int = 0
    inflight_tokens: int = 0
    pending_prefill_tokens: int = 0
    # Page hashes of prompts this gateway sent here that have not produced a first token: the instance will hold
    # them once computed, but its KV events announce a page only after the chunk that fills it (seconds for a long
    # prompt), so without this credit a second request with the same prefix, routed meanwhile, sees no overlap
    # and computes the prefix again elsewhere. hash -> number of such prompts.
    computing: dict[int, int] = field(default_factory=dict)
    # The prefills of ours running here (lease -> uncached tokens, start), and the rate this instance got through
    # them: decayed sums of uncached tokens and of the seconds from hand-off to first token, so big prefills
    # weigh more. A prefill that started seconds ago is partly done; counting it whole made a request whose
    # prefix this instance holds go to an idle one and compute the prefix there again.
    prefilling: dict[int, tuple[int, float]] = field(default_factory=dict)
    rate_tokens: float = 0.0
    rate_seconds: float = 0.0

    def remaining_prefill_tokens(self, now: float) -> int:
        """Uncached tokens of our running prefills not computed yet, by the observed rate: the instance takes
        them first come, first served. All of pending_prefill_tokens before a rate is known."""
        if not self.prefilling or self.rate_tokens <= 0 or self.rate_seconds <= 0:
            return self.pending_prefill_tokens
        rate = self.rate_tokens / self.rate_seconds
        done_at, left = -math.inf, 0.0
        for uncached, started in sorted(self.prefilling.values(), key=lambda v: v[1]):
            done_at = max(done_at, started) + uncached / rate
            left += min(uncached, max(0.0, done_at - now) * rate)
        return int(left)

    def observe_prefill(self, uncached: int, seconds: float) -> None:
        if uncached > 0 and seconds > 0:
            self.rate_tokens = RATE_DECAY * self.rate_tokens + uncached
            self.rate_seconds = RATE_DECAY * self.rate_seconds + seconds


RATE_DECAY = 0.8  # weight of the past in the observed prefill rate (about the last 5 prefills count)


class Lease:
    """What one attempt holds on its instances' local counters; `first_token()` then `release()` (idempotent)."""

    __slots__ = ("_router", "plan", "_tokens", "_uncached", "_prefilling", "_released", "_started")

    def __init__(self, router: Router, plan: RoutePlan, tokens: int) -> None:
        self._router, self.plan = router, plan
        self._tokens = tokens
        self._uncached = max(0, tokens - plan.cached_tokens)
        self._prefilling = True
        self._released = False
        for iid in plan.instance_ids:
            loc = router._local_of(iid)
            loc.inflight += 1
            loc.inflight_tokens += tokens
        loc = router._local_of(self._prefill_id)
        loc.pending_prefill_tokens += self._uncached
        self._started = router.clock()
        loc.prefilling[id(self)] = (self._uncached, self._started)
        for h in plan.prompt_hashes:
            loc.computing[h] = loc.computing.get(h, 0) + 1

    @property
    def _prefill_id(self) -> str:
        return self.plan.prefill_side.instance_id

    def first_token(self) -> None:
        """The prompt is computed: its pages are in the instance's cache now (and its KV events on the way)."""
        self._prefill_over(observed=True)

    def _prefill_over(self, *, observed: bool) -> None:
        if not self._prefilling or self._released:
            return
        self._prefilling = False
        loc = self._router._local_of(self._prefill_id)
        loc.pending_prefill_tokens -= self._uncached
        loc.prefilling.pop(id(self), None)
        if observed:  # a release before the first token (failure, cancel) says nothing of the rate
            loc.observe_prefill(self._uncached, self._router.clock() - self._started)
        for h in self.plan.prompt_hashes:
            left = loc.computing.get(h, 0) - 1
            if left > 0:
                loc.computing[h] = left
            else:
                loc.computing.pop(h, None)

    def release(self) -> None:
        if self._released:
            return
        self._prefill_over(observed=False)
        self._released = True
        for iid in self.plan.instance_ids:
            loc = self._router._local_of(iid)
            loc.inflight -= 1
            loc.inflight_tokens -= self._tokens


class _RequestSignals:
    """policies.Signals for one request: KV overlap of its prompt plus the router's local counters."""

    def __init__(self, router: Router, hashes: PromptHashes, prompt_len: int) -> None:
        self._router = router
        self._hashes = hashes
        self._prompt_len = prompt_len
        self._cached: dict[str, int] = {}
        self._now = router.clock()

    def cached_tokens(self, cand: Candidate) -> int:
        """Prompt tokens the candidate holds (KV index) or is computing for an earlier request of ours."""
        got = self._cached.get(cand.instance_id)
        if got is None:
            if cand.page_size <= 0:
                got = 0
            else:
                hashes = self._hashes.for_page_size(cand.page_size)
                pages = self._router.kv_index.overlap_pages(cand.instance_id, hashes)
                loc = self._router._local.get(cand.instance_id)
                if loc is not None and loc.computing:
                    pages = max(pages, leading_pages(hashes, loc.computing))
                got = min(pages * cand.page_size, self._prompt_len)
            self._cached[cand.instance_id] = got
        return got

    def store_tokens(self, cand: Candidate) -> int:
        """Prompt tokens past the candidate's own prefix that a kvstore holds (loaded, not computed, there)."""
        if cand.page_size <= 0:
            return 0
        pages = self._router.kv_index.store_overlap_pages(self._hashes.for_page_size(cand.page_size))
        return max(0, min(pages * cand.page_size, self._prompt_len) - self.cached_tokens(cand))

    def prompt_hashes(self, cand: Candidate) -> tuple[int, ...]:
        return tuple(self._hashes.for_page_size(cand.page_size)) if cand.page_size > 0 else ()

    def inflight(self, cand: Candidate) -> int:
        return self._router.local(cand.instance_id).inflight

    def pending_prefill_tokens(self, cand: Candidate) -> int:
        loc = self._router._local.get(cand.instance_id)
        return 0 if loc is None else loc.remaining_prefill_tokens(self._now)

    def inflight_tokens(self, cand: Candidate) -> int:
        return self._router.local(cand.instance_id).inflight_tokens


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
        self._local: dict[str, _Local] = {}

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
        sig = _RequestSignals(self, hashes or PromptHashes(req.prompt_token_ids), len(req.prompt_token_ids))
        usable_decode = self._usable(pools.decode, exclude)
        usable_prefill = self._usable(pools.prefill, exclude)
        usable_worker = self._usable(pools.worker, exclude)
        policy = self.policy
        # Disaggregated first when both halves exist; a pool whose members are all excluded falls through to the
        # next mode (a request whose prefills all refused may still be served colocated or decode-local).
        if usable_decode and usable_prefill:
            decode = policy.rank_decode(usable_decode, req, sig)[0]
            prefill = policy.rank_prefill(usable_prefill, req, sig)[0]
            return RoutePlan(
                Mode.DISAGGREGATED, decode, prefill, sig.cached_tokens(prefill), sig.prompt_hashes(prefill)
            )
        if usable_worker:
            worker = policy.rank_worker(usable_worker, req, sig)[0]
            return RoutePlan(Mode.COLOCATED, worker, None, sig.cached_tokens(worker), sig.prompt_hashes(worker))
        if usable_decode:
            decode = policy.rank_decode(usable_decode, req, sig)[0]
            return RoutePlan(Mode.DECODE_LOCAL, decode, None, sig.cached_tokens(decode), sig.prompt_hashes(decode))
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

    def _usable(self, cands: tuple[Candidate, ...], exclude: Collection[str]) -> list[Candidate]:
        return [c for c in cands if c.instance_id not in exclude and self.breakers.allows(c.instance_id)]

    # ------------------------------------------------------------------ attempts

    def begin(self, plan: RoutePlan, prompt_tokens: int) -> Lease:
        """An attempt of `plan` starts: count it locally and let half-open breakers know this is their probe."""
        for iid in plan.instance_ids:
            self.breakers.get(iid).on_attempt()
        return Lease(self, plan, prompt_tokens)

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
        loc = self._local.get(instance_id)
        if loc is not None and loc.inflight == 0:
            del self._local[instance_id]

    def local(self, instance_id: str) -> _Local:
        return self._local.get(instance_id) or _Local()

    def _local_of(self, instance_id: str) -> _Local:
        loc = self._local.get(instance_id)
        if loc is None:
            loc = self._local[instance_id] = _Local()
        return loc
