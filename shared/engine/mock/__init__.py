"""The mock engine (`--engine mock`): the real engine with the forward pass replaced by a timing model fitted from
the real engine's step times, for cluster-scale tests of routing, the planner and the control plane."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shared.engine.mock.runner import MockRunner, next_token
from shared.engine.mock.timing import DEFAULT_TABLE, TimingTable

__all__ = ["DEFAULT_TABLE", "MockRunner", "TimingTable", "build_mock_engine", "next_token"]


def build_mock_engine(cfg: Any, *, on_kv_event: Callable[..., None] | None = None) -> Any:
    """An Engine over a MockRunner from a resolved role config (its cache, scheduler, model and engine groups)."""
    from shared.engine.engine import Engine

    sim = cfg.engine
    table = TimingTable.load(sim.mock_timing_table)
    sched, cache = cfg.scheduler, cfg.cache
    chunk = sched.chunked_prefill_size
    max_step = max(min(sched.max_prefill_tokens, chunk or sched.max_prefill_tokens), sched.max_running_requests)
    runner = MockRunner(table, page_size=cache.page_size, num_pages=cache.num_pages or None,
                        context_length=cfg.model.context_length, max_batch_tokens=max_step,
                        speedup=sim.mock_speedup)
    disagg = getattr(cfg, "disagg", None)
    extra = {"handoff_quarantine_s": disagg.handoff_timeout_s} if disagg is not None else {}
    return Engine(runner, page_size=cache.page_size, max_running_requests=sched.max_running_requests,
                  chunked_prefill_size=chunk, max_prefill_tokens=sched.max_prefill_tokens,
                  schedule_policy=sched.schedule_policy, enable_prefix_cache=not cache.disable_radix_cache,
                  tokenizer=None, threads=1, on_kv_event=on_kv_event, max_queued_requests=sched.max_queued_requests,
                  new_token_ratio=sched.new_token_ratio, context_length=cfg.model.context_length, **extra)
