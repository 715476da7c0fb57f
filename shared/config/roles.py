"""Which configuration groups each role uses. A flag of a group a role does not use is rejected for that role."""

from __future__ import annotations

_COMMON = ("device", "discovery", "bus", "grpc", "telemetry")
_ENGINE = ("model", "tokenizer", "cache", "scheduler", "parallel", "kernels", "cuda_graph")

ROLE_GROUPS: dict[str, tuple[str, ...]] = {
    "gateway": ("model", "tokenizer", "http") + _COMMON,
    "encoder": ("model", "encoder") + _COMMON,
    "prefill": _ENGINE + ("disagg", "transfer") + _COMMON,
    "decode": _ENGINE + ("disagg", "transfer") + _COMMON,
    # colocated: prefill and decode in one process, the baseline every disaggregation benchmark compares against
    "worker": _ENGINE + ("disagg",) + _COMMON,
    "kvstore": ("kvstore", "transfer") + _COMMON,
}

ROLES: tuple[str, ...] = tuple(ROLE_GROUPS)
