"""Which configuration groups each role uses. A flag of a group a role does not use is rejected for that role."""

from __future__ import annotations

_COMMON = ("device", "discovery", "bus", "grpc", "tls", "telemetry")
_ENGINE = ("model", "tokenizer", "cache", "scheduler", "engine", "parallel", "kernels", "cuda_graph")

ROLE_GROUPS: dict[str, tuple[str, ...]] = {
    "gateway": ("model", "tokenizer", "http") + _COMMON,
    "encoder": ("model", "encoder") + _COMMON,
    "prefill": _ENGINE + ("disagg", "transfer", "kvstore_client") + _COMMON,
    "decode": _ENGINE + ("disagg", "transfer", "kvstore_client") + _COMMON,
    # colocated: prefill and decode in one process, the baseline every disaggregation benchmark compares against
    "worker": _ENGINE + ("disagg", "kvstore_client") + _COMMON,
    "kvstore": ("kvstore", "transfer") + _COMMON,
    # scales prefill and decode against TTFT / ITL targets (services/planner)
    "planner": ("planner",) + _COMMON,
}

ROLES: tuple[str, ...] = tuple(ROLE_GROUPS)
