"""The metrics and spans of one prefill hand-off's phases (queue, compute, transfer, checksum)."""

from __future__ import annotations

import time

from shared.engine.request import RequestOutput
from shared.telemetry import spans
from shared.telemetry.service import ServiceTelemetry


def observe_handoff(
    tel: ServiceTelemetry,
    backend: str,
    first: RequestOutput,
    t_start: float,
    t_accepted: float,
    t_pinned: float,
    t_write: float,
    t_sent: float,
    pages: int,
    nbytes: int,
    descs: int,
    decode_id: str,
) -> None:
    """Metrics and spans of one hand-off's phases (monotonic times), the checksum ending now."""
    m = tel.metrics.prefill
    m.queue.observe(t_accepted - t_start)
    m.compute.observe(t_pinned - t_accepted)
    m.transfer.observe(t_sent - t_write)
    m.transfer_bytes.inc(nbytes)
    m.transfer_pages.inc(pages)
    m.transfer_descs.inc(descs)
    tr = tel.tracing
    if not tr.enabled:
        return
    prompt = first.num_prompt_tokens
    tr.record(spans.PREFILL_QUEUE_WAIT, t_start, t_accepted)
    tr.record(
        spans.PREFILL_COMPUTE,
        t_accepted,
        t_pinned,
        {
            spans.PROMPT_TOKENS: prompt,
            spans.CACHED_TOKENS: first.num_cached_tokens,
            spans.COMPUTED_TOKENS: prompt - first.num_cached_tokens,
        },
    )
    took = max(t_sent - t_write, 1e-9)
    tr.record(
        spans.KV_TRANSFER,
        t_write,
        t_sent,
        {
            spans.TRANSFER_BACKEND: backend,
            spans.TRANSFER_BYTES: nbytes,
            spans.TRANSFER_PAGES: pages,
            spans.TRANSFER_DESCS: descs,
            spans.TRANSFER_GBPS: nbytes / took / 1e9,
            spans.DECODE_INSTANCE: decode_id,
        },
    )
    tr.record(spans.PREFILL_CHECKSUM, t_sent, time.monotonic(), {spans.PAGES: pages})
