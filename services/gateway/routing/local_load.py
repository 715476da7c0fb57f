"""What this gateway has in flight on each instance, since the instances' own load reports (every ~200 ms) lag a
burst: requests and prompt tokens in flight, prompt tokens whose first token has not come back (by the prefill rate
observed there), and the page hashes of prompts being computed. `Lease` is one attempt's share of it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from services.gateway.routing.views import RoutePlan

RATE_DECAY = 0.8  # weight of the past in the observed prefill rate (about the last 5 prefills count)


@dataclass
class LocalLoad:
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


class LocalLoads:
    """LocalLoad per instance id."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._by_id: dict[str, LocalLoad] = {}

    def get(self, instance_id: str) -> LocalLoad:
        """The instance's counters (zeros, not stored, for one with nothing of ours in flight)."""
        return self._by_id.get(instance_id) or LocalLoad()

    def of(self, instance_id: str) -> LocalLoad:
        """The instance's counters, created for an attempt that is about to count on them."""
        loc = self._by_id.get(instance_id)
        if loc is None:
            loc = self._by_id[instance_id] = LocalLoad()
        return loc

    def forget(self, instance_id: str) -> None:
        """The instance left: its counters mean nothing now (kept while attempts of ours still hold them)."""
        loc = self._by_id.get(instance_id)
        if loc is not None and loc.inflight == 0:
            del self._by_id[instance_id]

    def lease(self, plan: RoutePlan, tokens: int) -> Lease:
        return Lease(self, plan, tokens)


class Lease:
    """What one attempt holds on its instances' local counters; `first_token()` then `release()` (idempotent)."""

    __slots__ = ("_loads", "plan", "_tokens", "_uncached", "_prefilling", "_released", "_started")

    def __init__(self, loads: LocalLoads, plan: RoutePlan, tokens: int) -> None:
        self._loads, self.plan = loads, plan
        self._tokens = tokens
        self._uncached = max(0, tokens - plan.cached_tokens)
        self._prefilling = True
        self._released = False
        for iid in plan.instance_ids:
            loc = loads.of(iid)
            loc.inflight += 1
            loc.inflight_tokens += tokens
        loc = loads.of(self._prefill_id)
        loc.pending_prefill_tokens += self._uncached
        self._started = loads.clock()
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
        loc = self._loads.of(self._prefill_id)
        loc.pending_prefill_tokens -= self._uncached
        loc.prefilling.pop(id(self), None)
        if observed:  # a release before the first token (failure, cancel) says nothing of the rate
            loc.observe_prefill(self._uncached, self._loads.clock() - self._started)
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
            loc = self._loads.of(iid)
            loc.inflight -= 1
            loc.inflight_tokens -= self._tokens
