"""The closed sets configuration options choose from, as StrEnums.

groups.py derives each option's choices from its enum, so the set is written once; a component turns the
resolved text into the enum where it enters (``SchedulePolicy(cfg.scheduler.schedule_policy)``) and a typo
fails there instead of silently selecting nothing. StrEnum members equal their values, so a value compares,
hashes, prints and serialises (JSON, msgspec) exactly as the plain string did.
"""

from __future__ import annotations

import enum


class SchedulePolicy(enum.StrEnum):
    """Order of waiting requests (shared/engine/scheduler/policy.py)."""

    FCFS = "fcfs"
    PRIORITY = "priority"


class AttentionBackend(enum.StrEnum):
    AUTO = "auto"
    TORCH = "torch"
    NATIVE = "native"
    TRITON = "triton"


class LinearBackend(enum.StrEnum):
    AUTO = "auto"
    TORCH = "torch"
    ONEDNN = "onednn"
    NATIVE = "native"


class TransferBackend(enum.StrEnum):
    NIXL = "nixl"
    MOONCAKE = "mooncake"


class Fault(enum.StrEnum):
    """A failure injected at one well-defined point (--fault-injection, --encoder-fault-injection)."""

    NONE = "none"
    PREFILL_CRASH_BEFORE_WRITE = "prefill_crash_before_write"
    PREFILL_CRASH_MID_TRANSFER = "prefill_crash_mid_transfer"
    PREFILL_HANG = "prefill_hang"
    PREFILL_CORRUPT_CHECKSUM = "prefill_corrupt_checksum"
    DECODE_CRASH_MID_STREAM = "decode_crash_mid_stream"
    ENCODER_CRASH = "encoder_crash"
    ENCODER_HANG = "encoder_hang"
    # a request with the stop string "pdrelay:poison" fails in its logits processing (prefill, decode, worker)
    REQUEST_POISON = "request_poison"


HANDOFF_FAULTS: tuple[Fault, ...] = (
    Fault.NONE,
    Fault.PREFILL_CRASH_BEFORE_WRITE,
    Fault.PREFILL_CRASH_MID_TRANSFER,
    Fault.PREFILL_HANG,
    Fault.PREFILL_CORRUPT_CHECKSUM,
    Fault.DECODE_CRASH_MID_STREAM,
    Fault.REQUEST_POISON,
)
ENCODER_FAULTS: tuple[Fault, ...] = (Fault.NONE, Fault.ENCODER_CRASH, Fault.ENCODER_HANG)
