"""A step's size limits and the scheduler's counters: plain functions of the config, shared with the engine (a
runner's max_batch_tokens must cover the largest step) and the hand-off bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass

from shared.config.groups import SchedulerConfig


@dataclass
class SchedulerCounters:
    num_preemptions: int = 0
    num_prompt_tokens: int = 0  # prompt tokens of admitted requests (first admission)
    num_cached_prompt_tokens: int = 0  # of those, served from the prefix cache
    num_generated_tokens: int = 0


def token_budget(config: SchedulerConfig) -> int:
    """Tokens per step, decodes included (vLLM's max_num_batched_tokens); a longer prompt runs in chunks."""
    return min(config.max_prefill_tokens, config.chunked_prefill_size or config.max_prefill_tokens)


def max_step_tokens(config: SchedulerConfig) -> int:
    """Most tokens one forward pass may hold: the token budget, or one per running request when that is more
    (what a runner's max_batch_tokens must cover)."""
    return max(token_budget(config), config.max_running_requests)
