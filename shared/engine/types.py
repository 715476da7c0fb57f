"""Typed contracts between the engine's parts: scheduler -> model runner -> sampler -> scheduler.

The scheduler is pure CPU and speaks only in token ids and page ids; the model runner turns a SchedulerOutput
into flat tensors and runs one forward; nothing here touches a device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class EmbedSlice:
    """Input embeddings that replace the token embeddings of part of a chunk (an image's placeholder positions):
    rows [offset, offset + len(values)) of the chunk's token_ids. The scheduler only slices a request's tensors."""

    offset: int
    values: torch.Tensor  # [n, hidden]


@dataclass(frozen=True)
class ScheduledSeq:
    """One sequence's share of a forward step.

    token_ids are the tokens to compute now (a whole prompt, a prefill chunk, or the one last sampled token);
    they sit at positions [start_pos, start_pos + len(token_ids)). page_ids cover every position up to the end of
    this chunk, in order; KV for positions < start_pos is already in those pages (prefix cache hit or an earlier
    chunk). need_logits: sample a token after this step (false for a non-final prefill chunk).
    """

    req_id: str
    token_ids: tuple[int, ...]
    start_pos: int
    page_ids: tuple[int, ...]
    need_logits: bool
    embeds: tuple[EmbedSlice, ...] = ()  # multimodal embeddings spliced in at their placeholder positions
    # prompt logprobs: logits of every row of the chunk too (after the need_logits rows, see ForwardBatch)
    prompt_logits: bool = False


@dataclass(frozen=True)
class SchedulerOutput:
    """What to run this step. Empty `seqs` means there is nothing to run."""

    seqs: tuple[ScheduledSeq, ...] = ()
    preempted: tuple[str, ...] = ()  # requests whose pages were taken back; they recompute later
    finished: tuple[str, ...] = ()  # requests that finished or were aborted since the last step

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)

    @property
    def is_decode_only(self) -> bool:
        return bool(self.seqs) and all(len(s.token_ids) == 1 and s.need_logits for s in self.seqs)


@dataclass(frozen=True)
class StepStats:
    """Timings of one engine step, for benchmarks and metrics (seconds)."""

    schedule_s: float = 0.0
    prepare_s: float = 0.0  # SchedulerOutput -> tensors
    forward_s: float = 0.0
    sample_s: float = 0.0
    update_s: float = 0.0
    num_tokens: int = 0
    num_seqs: int = 0
    extra: dict[str, float] = field(default_factory=dict)
