"""Pages of requests whose KV crosses processes: the two ends of a prefill -> decode hand-off.

Decode side ("remote" requests): `reserve_remote` admits a request without computing it: it matches the prefix
cache, takes pages for the rest of the prompt and parks the request outside the waiting queue and the running
batch; the prefill instance writes the prompt KV into those pages; `activate_remote` then marks the prompt as
computed, appends the first token (sampled by prefill) and moves the request into the running batch.
`cancel_remote` undoes a reservation; with a quarantine time the written-to pages stay allocated that long,
because an abandoned prefill may still be writing into them. An abort (client gone, gateway cancel) of a reserved
request quarantines them for `abort_quarantine_s` for the same reason.

Prefill side ("held" requests): a request added with hold_pages=True keeps its pages when it finishes, so they
can be sent; `release_held` gives them back (full prompt pages stay in the prefix cache).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from shared.engine.errors import InvalidRequest, QueueFull, UnknownRequest
from shared.engine.request import (
    MediaInput,
    Request,
    RequestOutput,
    RequestStatus,
    TokenLogprobs,
)
from shared.modelspec.sampling import SamplingParams

if TYPE_CHECKING:
    from shared.engine.sampler.stop import StopResult
    from shared.engine.scheduler.budget import SchedulerCounters
    from shared.engine.scheduler.forks import Forks
    from shared.engine.scheduler.kv import KVManager

log = logging.getLogger(__name__)


class Batch(Protocol):
    """What hand-offs need of the scheduler's running batch (Scheduler implements it)."""

    max_running_requests: int

    @property
    def num_running(self) -> int: ...

    def knows(self, req_id: str) -> bool:
        """The id is in use by a request the scheduler tracks."""
        ...

    def new_request(
        self,
        req_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        *,
        media: Sequence[MediaInput] = (),
        need_embeds: bool = False,
    ) -> Request: ...

    def join_running(self, req: Request) -> None:
        """A request whose prompt is computed enters the running batch."""
        ...

    def advance(self, req: Request, tok: int) -> StopResult: ...

    def fail(self, req: Request, why: str) -> None:
        """Abort a request whose own processing failed (its final delta carries why)."""
        ...

    def take_pending_outputs(self) -> list[RequestOutput]: ...

    def emit_delta(
        self, req: Request, toks: tuple[int, ...], text: str, lps: tuple[TokenLogprobs, ...] | None, *, finished: bool
    ) -> RequestOutput: ...


@dataclass(frozen=True)
class Reservation:
    """Pages a remote request's prompt KV goes into. The first skip_tokens positions (whole pages, from decode's
    own prefix cache) are already there; the writer fills page_ids[skip_tokens // page_size:]."""

    req_id: str
    page_ids: tuple[int, ...]
    skip_tokens: int


# Quarantine of an aborted reservation unless the engine is told otherwise (the default --handoff-timeout-s).
DEFAULT_QUARANTINE_S = 30.0


class HandoffPages:
    """batch: admission into the running batch; kv: the pages and the prefix cache; forks: n > 1 samples;
    counters: the scheduler's prompt-token counters."""

    def __init__(
        self,
        batch: Batch,
        kv: KVManager,
        forks: Forks,
        counters: SchedulerCounters,
        abort_quarantine_s: float = DEFAULT_QUARANTINE_S,
    ) -> None:
        self.batch, self.kv, self.forks, self.counters = batch, kv, forks, counters
        self.abort_quarantine_s = abort_quarantine_s
        self.remote: dict[str, Request] = {}
        self.held: dict[str, Request] = {}
        self._quarantine: list[tuple[float, list[int]]] = []  # (release time, page ids), oldest first

    # ---- decode side ---------------------------------------------------------------------------------------------
    def reserve_remote(
        self,
        req_id: str,
        prompt_token_ids: tuple[int, ...] | list[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        media: Sequence[MediaInput] = (),
    ) -> Reservation:
        """media: the prompt's images (spans and hashes; embeddings not needed), so its pages hash as prefill's."""
        b, kv = self.batch, self.kv
        if b.knows(req_id) or req_id in self.remote:
            raise InvalidRequest(f"request id {req_id!r} is already in use; ids must be unique", field="req_id")
        req = b.new_request(req_id, prompt_token_ids, params, priority, media=media)
        if b.num_running + len(self.remote) >= b.max_running_requests:
            raise QueueFull(
                f"{b.num_running} running and {len(self.remote)} arriving requests reach "
                f"max_running_requests={b.max_running_requests}; retry on another instance"
            )
        self.release_expired()
        cached = kv.match_prefix(req)
        if not kv.allocate(req, req.num_tokens - cached):
            kv.release(req)
            raise QueueFull(
                f"not enough free KV pages for a {req.num_tokens}-token prompt "
                f"({kv.available_pages} available); retry on another instance"
            )
        req.num_cached_tokens = cached
        self.counters.num_prompt_tokens += req.num_prompt_tokens
        self.counters.num_cached_prompt_tokens += cached
        self.remote[req_id] = req
        self.forks.register(req)
        return Reservation(req_id, tuple(req.page_ids), cached)

    def activate_remote(
        self,
        req_id: str,
        first_token: int,
        logprob: TokenLogprobs | None = None,
        prompt_logprobs: Sequence[TokenLogprobs] = (),
    ) -> list[RequestOutput]:
        """The prompt KV arrived: the request joins the running batch with its first token (its delta returned,
        with the prompt logprobs prefill computed, if asked for)."""
        b = self.batch
        req = self.remote.pop(req_id, None)
        if req is None:
            raise UnknownRequest(f"no reserved hand-off for request {req_id!r} (cancelled or never reserved)")
        req.num_computed_tokens = req.num_tokens
        req.prompt_logprobs = list(prompt_logprobs)
        self.kv.commit(req)  # the received full pages now serve later prefix hits here too
        req.status = RequestStatus.RUNNING
        b.join_running(req)
        self.forks.on_prompt_done(req)  # n > 1: the other samples fork from the received prompt KV
        if req.params.seed is not None and not req.params.greedy:
            req.generator_skip = 1  # prefill drew the first token from this seed: continue after it
        # The first token was sampled by prefill under the same grammar: the local matcher consumes it here.
        try:
            res = b.advance(req, int(first_token))
        except Exception as e:  # this request's grammar, detokenizer or stop check: it fails alone
            log.exception("%s: processing its first token failed; the request is aborted", req_id)
            b.fail(req, f"processing the output failed: {e!r}")
            return b.take_pending_outputs()
        return [
            b.emit_delta(
                req,
                (int(first_token),),
                res.new_text,
                None if logprob is None else (logprob,),
                finished=res.finish_reason is not None,
            )
        ]

    def cancel_remote(self, req_id: str, quarantine_s: float) -> bool:
        """Drop a reservation. Prefix-cache pages (only read by the writer) are unlocked at once; the pages the
        writer was filling are freed after quarantine_s. False if there is no such reservation."""
        req = self.remote.pop(req_id, None)
        if req is None:
            return False
        kv = self.kv
        self.forks.pending.pop(req_id, None)  # its n > 1 samples never started
        own = req.page_ids[req.num_locked :]
        if req.num_locked:
            kv.cache.unlock(req.block_hashes[: req.num_locked])
            kv.allocator.decref(req.page_ids[: req.num_locked])
        if own:
            if quarantine_s > 0:
                # kept sorted by release time: quarantines of different lengths (abort vs. failed hand-off) mix
                bisect.insort(self._quarantine, (time.monotonic() + quarantine_s, list(own)), key=lambda q: q[0])
            else:
                kv.allocator.decref(own)
        req.page_ids, req.num_locked, req.num_computed_tokens = [], 0, 0
        req.status, req.finish_reason = RequestStatus.FINISHED, "abort"
        return True

    def quarantine(self, page_ids: list[int], quarantine_s: float) -> None:
        """Take over the caller's reference to pages a peer may still be writing into (an abandoned kvstore load);
        they are freed after quarantine_s, like a failed hand-off's."""
        bisect.insort(self._quarantine, (time.monotonic() + quarantine_s, list(page_ids)), key=lambda q: q[0])

    def release_expired(self, now: float | None = None) -> int:
        """Free quarantined pages whose time is up; returns how many pages were freed."""
        now = time.monotonic() if now is None else now
        freed = 0
        while self._quarantine and self._quarantine[0][0] <= now:
            _, pages = self._quarantine.pop(0)
            self.kv.allocator.decref(pages)
            freed += len(pages)
        return freed

    def next_release_in(self, now: float | None = None) -> float | None:
        """Seconds until the oldest quarantined pages may be freed (None: nothing in quarantine). An idle engine
        sleeps at most this long, so load reports show the pages free again without another request coming."""
        if not self._quarantine:
            return None
        now = time.monotonic() if now is None else now
        return max(0.0, self._quarantine[0][0] - now)

    @property
    def num_quarantined_pages(self) -> int:
        return sum(len(p) for _, p in self._quarantine)

    # ---- prefill side --------------------------------------------------------------------------------------------
    def hold(self, req: Request) -> None:
        """Called instead of releasing when a hold_pages request finishes."""
        self.held[req.req_id] = req

    def held_pages(self, req_id: str) -> tuple[int, ...]:
        req = self.held.get(req_id)
        if req is None:
            raise UnknownRequest(f"request {req_id!r} holds no pages (not finished, aborted, or released)")
        return tuple(req.page_ids)

    def release_held(self, req_id: str) -> bool:
        req = self.held.pop(req_id, None)
        if req is None:
            return False
        self.kv.release(req)
        return True
