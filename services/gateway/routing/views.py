"""What the router decides on: candidate instances (registration + latest load), requests and plans.

Pure data, no I/O: `discovery.py` builds `Candidate`s from the etcd membership and the NATS load table, the router
ranks them, `grpc_backend.py` executes the plan. Keeping the inputs plain values is what makes every routing
decision unit-testable without a cluster.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Mode(enum.StrEnum):
    """How a request is served, from which pools are ready."""

    DISAGGREGATED = "disaggregated"  # a decode instance + the prefill instance it hands the prompt to
    COLOCATED = "colocated"  # one `worker` instance does prefill and decode
    DECODE_LOCAL = "decode_local"  # decode instances but no prefill: decode prefills itself


@dataclass(frozen=True, slots=True)
class Load:
    """The latest load report of an instance (shared.cluster.bus.load.LoadSnapshot), or zeros when none is fresh.

    known: False when no recent report exists (a new instance, or NATS is down); the router then treats the
    instance as idle, which is what a just-started instance usually is.
    """

    running: int = 0
    queued: int = 0
    queued_prefill_tokens: int = 0
    free_pages: int = 0
    total_pages: int = 0
    known: bool = False


@dataclass(frozen=True, slots=True)
class Candidate:
    """One ready instance the router may pick."""

    instance_id: str
    role: str  # "decode" | "prefill" | "worker"
    grpc_address: str
    epoch: int
    model: str = ""
    page_size: int = 0  # tokens per KV page (0: unknown, no KV credit)
    max_running: int = 0  # capacity.max_running_requests (0: unknown)
    load: Load = field(default_factory=Load)


@dataclass(frozen=True, slots=True)
class Pools:
    """Ready candidates by role, already filtered to the request's model."""

    decode: tuple[Candidate, ...] = ()
    prefill: tuple[Candidate, ...] = ()
    worker: tuple[Candidate, ...] = ()

    @property
    def servable(self) -> bool:
        """At least one pool can serve a request (decode alone prefills locally; prefill alone cannot)."""
        return bool(self.decode or self.worker)


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What routing needs to know about a request: its prompt (token ids) and how long it may grow."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class RoutePlan:
    """The chosen instance(s). `prefill` is None for colocated and decode-local plans.

    cached_tokens: prompt tokens the chosen prefill-side instance is predicted to hold already (KV index).
    prompt_hashes: the prompt's chained page hashes at that instance's page size: the pages it will hold once it
    has computed the prompt (the router credits them to it while the prefill runs, before its KV events say so).
    """

    mode: Mode
    decode: Candidate  # the instance the gateway calls (a decode or a worker)
    prefill: Candidate | None = None
    cached_tokens: int = 0
    prompt_hashes: tuple[int, ...] = ()

    @property
    def prefill_side(self) -> Candidate:
        """The instance that computes the prompt: the prefill, or the decode/worker itself."""
        return self.prefill if self.prefill is not None else self.decode

    @property
    def instance_ids(self) -> tuple[str, ...]:
        return (
            (self.decode.instance_id,) if self.prefill is None else (self.decode.instance_id, self.prefill.instance_id)
        )

    def describe(self) -> str:
        if self.prefill is None:
            return f"{self.mode} {self.decode.instance_id}"
        return f"{self.mode} decode {self.decode.instance_id} + prefill {self.prefill.instance_id}"
