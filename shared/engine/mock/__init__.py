"""The mock engine (`--engine mock`): the real engine with the forward pass replaced by a timing model fitted from
the real engine's step times, for cluster-scale tests of routing, the planner and the control plane."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from shared.engine.mock.runner import MockRunner, next_token
from shared.engine.mock.timing import DEFAULT_TABLE, TimingTable

if TYPE_CHECKING:
    from shared.config.resolved import ResolvedConfig
    from shared.engine.engine import Engine
    from shared.engine.radix_cache import KVEvent

__all__ = ["DEFAULT_TABLE", "MockRunner", "TimingTable", "build_mock_engine", "next_token"]


def build_mock_engine(cfg: ResolvedConfig, *, on_kv_event: Callable[[KVEvent], None] | None = None) -> Engine:
    """An Engine over a MockRunner from the resolved config of an engine role (its cache, scheduler, model, engine
    and disagg groups)."""
    from shared.engine.engine import Engine
    from shared.engine.scheduler.budget import max_step_tokens

    sim = cfg.engine
    table = TimingTable.load(sim.mock_timing_table)
    runner = MockRunner(
        table,
        page_size=cfg.cache.page_size,
        num_pages=cfg.cache.num_pages or None,
        context_length=cfg.model.context_length,
        max_batch_tokens=max_step_tokens(cfg.scheduler),
        speedup=sim.mock_speedup,
    )
    return Engine(
        runner,
        cache=cfg.cache,
        scheduler=cfg.scheduler,
        tokenizer=None,
        threads=1,
        on_kv_event=on_kv_event,
        context_length=cfg.model.context_length,
        handoff_quarantine_s=cfg.disagg.handoff_timeout_s,
    )
