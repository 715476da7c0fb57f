"""Which configuration groups each role uses. A flag of a group a role does not use is rejected for that role."""

from __future__ import annotations

import enum


class Role(enum.StrEnum):
    """A kind of service process (`pdrelay serve <role>`; the etcd key /pdrelay/<cluster>/instances/<role>/...)."""

    GATEWAY = "gateway"
    ENCODER = "encoder"
    PREFILL = "prefill"
    DECODE = "decode"
    WORKER = "worker"
    KVSTORE = "kvstore"
    PLANNER = "planner"

    def __repr__(self) -> str:  # messages quote a role as the user types it: 'decode', not <Role.DECODE: 'decode'>
        return repr(self.value)


_COMMON = ("device", "discovery", "bus", "grpc", "tls", "telemetry")
_ENGINE = ("model", "tokenizer", "cache", "scheduler", "engine", "parallel", "kernels", "cuda_graph")

ROLE_GROUPS: dict[str, tuple[str, ...]] = {
    Role.GATEWAY: ("model", "tokenizer", "http") + _COMMON,
    Role.ENCODER: ("model", "encoder") + _COMMON,
    Role.PREFILL: _ENGINE + ("disagg", "transfer", "kvstore_client") + _COMMON,
    Role.DECODE: _ENGINE + ("disagg", "transfer", "kvstore_client") + _COMMON,
    # colocated: prefill and decode in one process, the baseline every disaggregation benchmark compares against
    Role.WORKER: _ENGINE + ("disagg", "kvstore_client") + _COMMON,
    Role.KVSTORE: ("kvstore", "transfer") + _COMMON,
    # scales prefill and decode against TTFT / ITL targets (services/planner)
    Role.PLANNER: ("planner",) + _COMMON,
}

ROLES: tuple[str, ...] = tuple(str(r) for r in ROLE_GROUPS)  # plain text: argparse choices, messages
