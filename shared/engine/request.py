"""A request's life inside one engine (Request, owned by the scheduler) and what it emits (RequestOutput deltas)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from shared.modelspec.block_hash import ROOT_HASH, media_key, page_hash
from shared.modelspec.sampling import SamplingParams

if TYPE_CHECKING:
    import torch

FinishReason = Literal["stop", "length", "abort"]


class OutputGrammar(Protocol):
    """Where a request's output stands in its grammar (shared/engine/grammar/backend.py: RequestGrammar)."""

    def accept(self, token_id: int) -> bool: ...

    @property
    def is_terminated(self) -> bool: ...

    def fill(self, bitmask: Any, row: int) -> None:
        """Write the allowed-next-token row `row` of the batch's bitmask."""
        ...

    def fork(self) -> OutputGrammar: ...


class OutputText(Protocol):
    """A request's incremental detokenizer (shared/engine/sampler/text_window.py: TextWindow)."""

    def step(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued, or preempted and waiting to recompute
    RUNNING = "running"  # holds pages and is scheduled every step (prefill chunks, then decode)
    FINISHED = "finished"


@dataclass(frozen=True)
class TokenLogprobs:
    """Log-probability of a chosen token under the model's raw distribution, plus the top alternatives
    (token id, logprob), most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int = 0  # of token_id in the vocabulary, 1 = most likely (vLLM's Logprob.rank); 0 = not computed


@dataclass(frozen=True)
class RequestOutput:
    """What one step added to one request (a delta: concatenate new_token_ids / new_text over the stream).

    new_text is only filled when the engine has a tokenizer; it is cut before a matched stop string and holds
    back text that could still become one. stop_reason: the stop token id or stop string that matched (None for
    EOS, max_tokens or abort).
    """

    req_id: str
    new_token_ids: tuple[int, ...] = ()
    new_text: str = ""
    new_logprobs: tuple[TokenLogprobs, ...] | None = None
    finished: bool = False
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    num_output_tokens: int = 0  # generated so far, this delta included
    index: int = 0  # which sample of an n > 1 request (0 for the others)
    prompt_logprobs: tuple[TokenLogprobs, ...] | None = None  # prompt tokens 1.. (first delta, when asked for)
    # finish_reason "abort" because processing this request failed (not a cancel): why, for RequestFailed
    error: str | None = None


@dataclass(frozen=True)
class MediaInput:
    """One image of a prompt: placeholder positions [offset, offset + length), the media hash that keys its KV pages
    (block hashes) and caches, and its embeddings [length, hidden] (None where only the hashes matter: a decode
    instance whose prompt KV another instance computes)."""

    offset: int
    length: int
    media_hash: str
    embeds: torch.Tensor | None = None

    @property
    def span(self) -> tuple[int, int, str]:
        return (self.offset, self.length, self.media_hash)


@dataclass(eq=False)
class Request:
    """Scheduler-owned mutable state of one request. Invariants: page_ids cover positions
    [0, num_computed_tokens) at least; the request holds one allocator reference per entry of page_ids; the
    first num_locked entries of block_hashes are cache nodes this request has locked."""

    req_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    priority: int = 0  # lower is served first (vLLM's convention)
    arrival: int = 0  # admission order tie-breaker, assigned by the scheduler
    page_size: int = 16
    status: RequestStatus = RequestStatus.WAITING
    all_token_ids: list[int] = field(default_factory=list)  # prompt + output
    output_token_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of the full pages of all_token_ids
    page_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose KV is in page_ids
    num_locked: int = 0
    num_cached_tokens: int = -1  # prefix-cache hit at first admission (-1: not admitted yet)
    num_preemptions: int = 0
    # Prefill role: keep the pages after the request finishes, until release_held() (the KV is being sent).
    hold_pages: bool = False
    index: int = 0  # sample number of an n > 1 request (its forks are 1..n-1, see scheduler/forks.py)
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    # sampler and detokenizer state, created lazily by their owners
    generator: torch.Generator | None = None
    # draws of the seeded generator already made elsewhere (decode role: prefill sampled the first token with the
    # same seed), skipped when the generator is created so the samples continue where prefill's left off
    generator_skip: int = 0
    detokenizer: OutputText | None = None
    grammar: OutputGrammar | None = None  # structured output: where the output stands in its grammar
    output_text: str = ""
    num_text_emitted: int = 0
    media: tuple[MediaInput, ...] = ()  # images of the prompt, in prompt order, not overlapping
    # params.prompt_logprobs: those of prompt tokens 1.. computed so far; sent once, on the first delta
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs_sent: bool = False

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)
            self._extend_hashes()

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def append_output(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if len(self.all_token_ids) % self.page_size == 0:
            self._extend_hashes()

    def _extend_hashes(self) -> None:
        P = self.page_size
        h = self.block_hashes[-1] if self.block_hashes else ROOT_HASH
        spans = [m.span for m in self.media]
        for i in range(len(self.block_hashes), len(self.all_token_ids) // P):
            extra = media_key(spans, i * P, P) if spans and i * P < self.num_prompt_tokens else b""
            h = page_hash(h, self.all_token_ids[i * P : (i + 1) * P], extra)
            self.block_hashes.append(h)
