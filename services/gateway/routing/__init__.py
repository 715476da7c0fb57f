"""Routing for the gateway's gRPC backend: which decode / prefill / worker instance serves a request.

    views.py      plain data the router decides on: Candidate, Load, Pools, RouteRequest, RoutePlan, Mode
    policies.py   round_robin, least_load, kv_aware (default): rank candidates of a pool
    kv_index.py   block hashes per instance, fed by NATS KV events (prefix-overlap credit), gap-safe
    breaker.py    circuit breakers per instance (closed / open / half-open)
    failures.py   what a failed attempt means: retry or not, exclude whom, blame whom
    router.py     pool selection (disaggregated / colocated / decode-local), pair re-choice; measures each
                  candidate (KV overlap, kvstore overlap, in-flight work) before a policy ranks it
    local_load.py what this gateway has in flight per instance (Lease: one attempt's share)
    discovery.py  the I/O edge: etcd membership + load table + KV events -> Pools for the router
    channels.py   one cached gRPC channel per instance
    wire.py       backend types <-> proto (Decode.Generate), replay of a broken stream

Everything but discovery.py and channels.py is pure and unit-tested without a cluster.
"""

from services.gateway.routing.breaker import BreakerBoard, BreakerConfig, BreakerState, CircuitBreaker
from services.gateway.routing.kv_index import KVIndex, PromptHashes
from services.gateway.routing.local_load import Lease
from services.gateway.routing.policies import ROUTING_POLICIES, KVAware, LeastLoad, RoundRobin, make_policy
from services.gateway.routing.router import NoRoute, NoRouteReason, Router
from services.gateway.routing.views import Candidate, Load, Mode, Pools, RoutePlan, RouteRequest

__all__ = [
    "ROUTING_POLICIES",
    "BreakerBoard",
    "BreakerConfig",
    "BreakerState",
    "Candidate",
    "CircuitBreaker",
    "KVAware",
    "KVIndex",
    "Lease",
    "LeastLoad",
    "Load",
    "Mode",
    "NoRoute",
    "NoRouteReason",
    "Pools",
    "PromptHashes",
    "RoundRobin",
    "RoutePlan",
    "RouteRequest",
    "Router",
    "make_policy",
]
