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

Loads come from the instances' reports (every ~200 ms), which lag a burst of requests; `Signals` adds what this
gateway itself sent since (requests in flight, prompt tokens whose first token has not come back) so that ten
requests arriving within one report interval do not all pick the same "idle" instance.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from services.gateway.routing.views import Candidate, RouteRequest

ROUTING_POLICIES = ("kv_aware", "least_load", "round_robin")


class Signals(Protocol):
    """Per-request view of everything beyond the candidate's own report (implemented by the router)."""

    def cached_tokens(self, cand: Candidate) -> int:
        """Prompt tokens the candidate is predicted to hold in its prefix cache."""
        ...

    def inflight(self, cand: Candidate) -> int:
        """Requests this gateway has in flight on the candidate."""
        ...

    def pending_prefill_tokens(self, cand: Candidate) -> int:
        """Uncached prompt tokens this gateway sent to the candidate that it has not computed yet (by the rate
        observed there; all of them until a rate is known)."""
        ...

    def inflight_tokens(self, cand: Candidate) -> int:
        """Prompt tokens of the requests this gateway has in flight on the candidate."""
        ...

    # Optional (0 when absent): store_tokens(cand) -> prompt tokens past cand's own prefix a kvstore holds.


@dataclass(frozen=True)
class Scored:
    cand: Candidate
    key: tuple[float, ...]


def queued_prefill(cand: Candidate, sig: Signals) -> int:
    """Prompt tokens waiting on the candidate: its report, or what we sent since, whichever is larger."""
    return max(cand.load.queued_prefill_tokens, sig.pending_prefill_tokens(cand))


def busy_requests(cand: Candidate, sig: Signals) -> int:
    return max(cand.load.running + cand.load.queued, sig.inflight(cand))


def decode_score(cand: Candidate, req: RouteRequest, sig: Signals) -> tuple[float, ...]:
    """Lower is better: (cannot fit the request's KV, request-slot use + KV page use, busy requests)."""
    load = cand.load
    busy = busy_requests(cand, sig)
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


def store_tokens(cand: Candidate, sig: Signals) -> int:
    """Prompt tokens beyond the candidate's own cached prefix that a kvstore of the cluster holds."""
    fn = getattr(sig, "store_tokens", None)
    return int(fn(cand)) if fn is not None else 0


def uncached_tokens(cand: Candidate, req: RouteRequest, sig: Signals) -> float:
    """Prompt tokens the candidate must compute, a kvstore-held token counting STORE_TOKEN_COST of one."""
    from_store = store_tokens(cand, sig)
    computed = max(0, len(req.prompt_token_ids) - sig.cached_tokens(cand) - from_store)
    return computed + STORE_TOKEN_COST * from_store


def prefill_cost(cand: Candidate, req: RouteRequest, sig: Signals) -> float:
    """Prompt tokens the candidate must compute before this prompt is done: its queue + our uncached part."""
    return queued_prefill(cand, sig) + uncached_tokens(cand, req, sig)


def active_kv_tokens(cand: Candidate, sig: Signals) -> int:
    """Tokens of KV held by running requests (free_pages in reports counts reclaimable cached pages as free)."""
    load = cand.load
    reported = (load.total_pages - load.free_pages) * cand.page_size if load.known and cand.page_size > 0 else 0
    return max(reported, sig.inflight_tokens(cand))


class RankingPolicy(Protocol):
    name: str

    def rank_decode(self, cands: Sequence[Candidate], req: RouteRequest, sig: Signals) -> list[Candidate]: ...

    def rank_prefill(self, cands: Sequence[Candidate], req: RouteRequest, sig: Signals) -> list[Candidate]: ...

    def rank_worker(self, cands: Sequence[Candidate], req: RouteRequest, sig: Signals) -> list[Candidate]: ...


class _Rotating:
    """A rotating start offset per pool: breaks ties between equally good candidates fairly."""

    def __init__(self) -> None:
        self._counters: dict[str, itertools.count[int]] = {}

    def rotate(self, pool: str, cands: Sequence[Candidate]) -> list[Candidate]:
        if not cands:
            return []
        ordered = sorted(cands, key=lambda c: c.instance_id)
        start = next(self._counters.setdefault(pool, itertools.count())) % len(ordered)
        return ordered[start:] + ordered[:start]

    def rank(self, pool: str, scored: list[Scored]) -> list[Candidate]:
        """Best key first; the candidates tied for best take turns (rotation among them only)."""
        if not scored:
            return []
        scored = sorted(scored, key=lambda s: (s.key, s.cand.instance_id))
        best = [s.cand for s in scored if s.key == scored[0].key]
        return self.rotate(pool, best) + [s.cand for s in scored[len(best) :]]


class RoundRobin(_Rotating):
    name = "round_robin"

    def rank_decode(self, cands: Sequence[Candidate], req: RouteRequest, sig: Signals) -> list[Candidate]:
        return self.rotate("decode", cands)

    def rank_prefill(self, cands: Sequence[Candidate], req: RouteRequest, sig: Signals) -> list[Candidate]:
        return self.rotate("prefill", cands)

    def rank_worker(self, cands: Sequence[Candidate], req: RouteRequest, sig: Signals) -> list[Candidate]:
        return self.rotate("worker", cands)


class LeastLoad(_Rotating):
    name = "least_load"

    def rank_decode(self, cands: Sequence[Candidate], req: RouteRequest, sig: Signals) -> list[Candidate]:
        return self.rank("decode", [Scored(c, decode_score(c, req, sig)) for c in cands])

    def rank_prefill(self, cands: Sequence[Candidate], req: RouteRequest, sig: Signals) -> list[Candidate]:
        return self.rank(
            "prefill", [Scored(c, (float(queued_prefill(c, sig)), float(busy_requests(c, sig)))) for c in cands]
        )

    def rank_worker(self, cands: Sequence[Candidate], req: RouteRequest, sig: Signals) -> list[Candidate]:
        return self.rank_decode(cands, req, sig)


class KVAware(LeastLoad):
    name = "kv_aware"

    def rank_prefill(self, cands: Sequence[Candidate], req: RouteRequest, sig: Signals) -> list[Candidate]:
        # Equal predicted cost: the instance that computes less of this prompt (a queue ahead of it is work that
        # happens anyway; computing a prefix another instance holds or is computing spends compute and cache
        # space twice), then the less busy one.
        return self.rank(
            "prefill",
            [
                Scored(
                    c,
                    (
                        float(prefill_cost(c, req, sig)),
                        float(uncached_tokens(c, req, sig)),
                        float(busy_requests(c, sig)),
                    ),
                )
                for c in cands
            ],
        )

    def rank_worker(self, cands: Sequence[Candidate], req: RouteRequest, sig: Signals) -> list[Candidate]:
        return self.rank("worker", [Scored(c, kv_load_score(c, req, sig)) for c in cands])

    def rank_decode(self, cands: Sequence[Candidate], req: RouteRequest, sig: Signals) -> list[Candidate]:
        return self.rank("decode", [Scored(c, kv_load_score(c, req, sig)) for c in cands])


def kv_load_score(cand: Candidate, req: RouteRequest, sig: Signals) -> tuple[float, ...]:
    """Lower is better: (cannot fit the request's KV, queued + uncached prompt tokens + active KV tokens, busy)."""
    no_room = decode_score(cand, req, sig)[0]
    cost = prefill_cost(cand, req, sig) + active_kv_tokens(cand, sig)
    return (no_room, float(cost), float(busy_requests(cand, sig)))


def make_policy(name: str) -> RankingPolicy:
    if name == "kv_aware":
        return KVAware()
    if name == "least_load":
        return LeastLoad()
    if name == "round_robin":
        return RoundRobin()
    raise ValueError(
        f"routing policy {name!r} is not one of {', '.join(ROUTING_POLICIES)}; use --routing-policy kv_aware"
    )
