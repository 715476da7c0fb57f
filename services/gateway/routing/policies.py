"""Routing policies: each ranks the candidates of a pool for one request, best first. Pure, no I/O.

    round_robin  rotate through the pool, ignoring load (a baseline, and what sglang-router calls round_robin)
    least_load   decode/worker by running requests and KV pages in use; prefill by queued prompt tokens
    kv_aware     (default) prefill by predicted cost = queued prefill tokens + prompt tokens not cached there
                 (prefix overlap from the KV index, plus prompts of ours it is computing right now), ties to the
                 instance computing less of the prompt; colocated workers and decodes by queued prefill + uncached
                 prompt tokens + KV tokens held by running requests, the potential prefill blocks + potential
                 decode blocks cost of Dynamo's KV router with unit weights. A decode that holds the prompt's
                 prefix takes only the rest through the hand-off (the prefill still computes the whole prompt, it
                 only skips writing those pages), so decode overlap saves transfer and counts as well as decode load.

Loads come from the instances' reports (every ~200 ms), which lag a burst of requests; a `Scored` candidate adds
what this gateway itself sent since (requests in flight, prompt tokens whose first token has not come back) so that
ten requests arriving within one report interval do not all pick the same "idle" instance. The router measures
those for each candidate before it asks a policy: a policy only reads the data it scores.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from services.gateway.routing.views import Candidate, RouteRequest
from shared.config.choices import RoutingPolicy

ROUTING_POLICIES = tuple(RoutingPolicy)


@dataclass(frozen=True, slots=True)
class Scored:
    """A candidate with what the router measured of it for one request."""

    cand: Candidate
    cached_tokens: int = 0  # prompt tokens it is predicted to hold in its prefix cache (or is computing for us)
    store_tokens: int = 0  # prompt tokens past its own prefix that a kvstore of the cluster holds
    inflight: int = 0  # requests this gateway has in flight on it
    inflight_tokens: int = 0  # prompt tokens of those requests
    # uncached prompt tokens this gateway sent it that it has not computed yet (by the rate observed there)
    pending_prefill_tokens: int = 0

    @property
    def instance_id(self) -> str:
        return self.cand.instance_id


def queued_prefill(s: Scored) -> int:
    """Prompt tokens waiting on the candidate: its report, or what we sent since, whichever is larger."""
    return max(s.cand.load.queued_prefill_tokens, s.pending_prefill_tokens)


def busy_requests(s: Scored) -> int:
    return max(s.cand.load.running + s.cand.load.queued, s.inflight)


def decode_score(s: Scored, req: RouteRequest) -> tuple[float, ...]:
    """Lower is better: (cannot fit the request's KV, request-slot use + KV page use, busy requests)."""
    cand = s.cand
    load = cand.load
    busy = busy_requests(s)
    slots = busy / cand.max_running if cand.max_running > 0 else float(busy)
    pages = 1.0 - load.free_pages / load.total_pages if load.known and load.total_pages > 0 else 0.0
    no_room = 0.0
    if load.known and load.total_pages > 0 and cand.page_size > 0:
        need_tokens = len(req.prompt_token_ids) + (req.max_tokens or 0)
        need_pages = -(-need_tokens // cand.page_size)
        no_room = 1.0 if need_pages > load.free_pages else 0.0
    return (no_room, slots + pages, float(busy))


# A prompt token a kvstore holds costs the instance a transfer into its pool instead of a forward pass: cheap
# work, not free (a hit in its own prefix cache is free). Measured on CPU a token's KV loads in ~1/50 of the time
# computing it takes; 0.1 keeps an instance's own cache clearly preferred.
STORE_TOKEN_COST = 0.1


def uncached_tokens(s: Scored, req: RouteRequest) -> float:
    """Prompt tokens the candidate must compute, a kvstore-held token counting STORE_TOKEN_COST of one."""
    computed = max(0, len(req.prompt_token_ids) - s.cached_tokens - s.store_tokens)
    return computed + STORE_TOKEN_COST * s.store_tokens


def prefill_cost(s: Scored, req: RouteRequest) -> float:
    """Prompt tokens the candidate must compute before this prompt is done: its queue + our uncached part."""
    return queued_prefill(s) + uncached_tokens(s, req)


def active_kv_tokens(s: Scored) -> int:
    """Tokens of KV held by running requests (free_pages in reports counts reclaimable cached pages as free)."""
    cand, load = s.cand, s.cand.load
    reported = (load.total_pages - load.free_pages) * cand.page_size if load.known and cand.page_size > 0 else 0
    return max(reported, s.inflight_tokens)


class RankingPolicy(Protocol):
    """Ranks one pool's candidates for a request, best first."""

    name: str

    def rank_decode(self, cands: Sequence[Scored], req: RouteRequest) -> list[Scored]: ...

    def rank_prefill(self, cands: Sequence[Scored], req: RouteRequest) -> list[Scored]: ...

    def rank_worker(self, cands: Sequence[Scored], req: RouteRequest) -> list[Scored]: ...


class _Rotating:
    """A rotating start offset per pool: breaks ties between equally good candidates fairly."""

    def __init__(self) -> None:
        self._counters: dict[str, itertools.count[int]] = {}

    def rotate(self, pool: str, cands: Sequence[Scored]) -> list[Scored]:
        if not cands:
            return []
        ordered = sorted(cands, key=lambda c: c.instance_id)
        start = next(self._counters.setdefault(pool, itertools.count())) % len(ordered)
        return ordered[start:] + ordered[:start]

    def rank(self, pool: str, keyed: list[tuple[tuple[float, ...], Scored]]) -> list[Scored]:
        """Best key first; the candidates tied for best take turns (rotation among them only)."""
        if not keyed:
            return []
        keyed = sorted(keyed, key=lambda k: (k[0], k[1].instance_id))
        best = [s for key, s in keyed if key == keyed[0][0]]
        return self.rotate(pool, best) + [s for _, s in keyed[len(best) :]]


class RoundRobin(_Rotating):
    name = "round_robin"

    def rank_decode(self, cands: Sequence[Scored], req: RouteRequest) -> list[Scored]:
        return self.rotate("decode", cands)

    def rank_prefill(self, cands: Sequence[Scored], req: RouteRequest) -> list[Scored]:
        return self.rotate("prefill", cands)

    def rank_worker(self, cands: Sequence[Scored], req: RouteRequest) -> list[Scored]:
        return self.rotate("worker", cands)


class LeastLoad(_Rotating):
    name = "least_load"

    def rank_decode(self, cands: Sequence[Scored], req: RouteRequest) -> list[Scored]:
        return self.rank("decode", [(decode_score(s, req), s) for s in cands])

    def rank_prefill(self, cands: Sequence[Scored], req: RouteRequest) -> list[Scored]:
        return self.rank("prefill", [((float(queued_prefill(s)), float(busy_requests(s))), s) for s in cands])

    def rank_worker(self, cands: Sequence[Scored], req: RouteRequest) -> list[Scored]:
        return self.rank_decode(cands, req)


class KVAware(LeastLoad):
    name = "kv_aware"

    def rank_prefill(self, cands: Sequence[Scored], req: RouteRequest) -> list[Scored]:
        # Equal predicted cost: the instance that computes less of this prompt (a queue ahead of it is work that
        # happens anyway; computing a prefix another instance holds or is computing spends compute and cache
        # space twice), then the less busy one.
        return self.rank(
            "prefill",
            [
                ((float(prefill_cost(s, req)), float(uncached_tokens(s, req)), float(busy_requests(s))), s)
                for s in cands
            ],
        )

    def rank_worker(self, cands: Sequence[Scored], req: RouteRequest) -> list[Scored]:
        return self.rank("worker", [(kv_load_score(s, req), s) for s in cands])

    def rank_decode(self, cands: Sequence[Scored], req: RouteRequest) -> list[Scored]:
        return self.rank("decode", [(kv_load_score(s, req), s) for s in cands])


def kv_load_score(s: Scored, req: RouteRequest) -> tuple[float, ...]:
    """Lower is better: (cannot fit the request's KV, queued + uncached prompt tokens + active KV tokens, busy)."""
    no_room = decode_score(s, req)[0]
    cost = prefill_cost(s, req) + active_kv_tokens(s)
    return (no_room, float(cost), float(busy_requests(s)))


def make_policy(name: str) -> RankingPolicy:
    if name == RoutingPolicy.KV_AWARE:
        return KVAware()
    if name == RoutingPolicy.LEAST_LOAD:
        return LeastLoad()
    if name == RoutingPolicy.ROUND_ROBIN:
        return RoundRobin()
    raise ValueError(
        f"routing policy {name!r} is not one of {', '.join(ROUTING_POLICIES)}; use --routing-policy kv_aware"
    )
