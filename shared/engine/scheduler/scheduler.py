"""Continuous-batching scheduler, pure CPU, with vLLM v1's two-call contract:

    out = scheduler.schedule()                          # which tokens of which requests run this step
    logits = runner.forward(out); tokens = sample(...)  # device work, outside the scheduler
    deltas = scheduler.update_from_output(out, tokens)  # append tokens, stop, free pages

Each request has num_tokens (prompt + output) and num_computed_tokens (KV in its pages); a step computes some
of the difference: the whole remainder for a decode (1 token), a chunk for a prefill or a recompute after
preemption. Per step: running decodes first (never starved), then running prefills continue their chunks, then
waiting requests are admitted while the token budget, max_running_requests and the page reserve allow.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.config.choices import SchedulePolicy
from shared.config.groups import SchedulerConfig
from shared.engine.errors import InvalidRequest, QueueFull
from shared.engine.grammar.backend import GrammarBackend
from shared.engine.page_allocator import PageAllocator
from shared.engine.radix_cache import RadixCache
from shared.engine.request import FinishReason, MediaInput, Request, RequestOutput, RequestStatus, TokenLogprobs
from shared.engine.sampler.stop import StopChecker, StopResult
from shared.engine.sampler.text_window import DecodeFn
from shared.engine.scheduler.budget import SchedulerCounters, token_budget
from shared.engine.scheduler.forks import Forks, fork_id
from shared.engine.scheduler.handoff_pages import HandoffPages
from shared.engine.scheduler.kv import KVManager
from shared.engine.scheduler.media import check_media, embed_slices, lacks_embeds
from shared.engine.scheduler.policy import WaitingQueue, sort_key
from shared.engine.types import ScheduledSeq, SchedulerOutput
from shared.modelspec.sampling import SamplingParams

log = logging.getLogger(__name__)

CLIP_MAX_NEW_TOKENS = 4096  # output headroom reserved per request is capped at this many tokens (as in SGLang)


@dataclass
class _Plan:
    """One step being planned: request id -> (request, tokens to compute), in scheduling order."""

    budget: int
    seqs: dict[str, tuple[Request, int]] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        *,
        allocator: PageAllocator,
        cache: RadixCache,
        page_size: int,
        max_model_len: int,
        config: SchedulerConfig,
        eos_token_ids: Sequence[int] = (),
        decode_fn: DecodeFn | None = None,
        vocab_size: int | None = None,
        grammar: GrammarBackend | None = None,
    ) -> None:
        """config: the limits and the policy (shared/config/groups.py declares their defaults)."""
        if config.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1 (got {config.max_running_requests})")
        if config.max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens must be >= 1 (got {config.max_prefill_tokens})")
        if config.chunked_prefill_size < 0:
            raise ValueError(
                f"chunked_prefill_size must be >= 0 (got {config.chunked_prefill_size}); 0 means max_prefill_tokens"
            )
        if not 0.0 <= config.new_token_ratio <= 1.0:
            raise ValueError(f"new_token_ratio must be in [0, 1] (got {config.new_token_ratio})")
        policy = SchedulePolicy(config.schedule_policy)
        self.page_size = page_size
        self.kv = KVManager(allocator, cache, page_size)
        # A request must fit in the pool on its own, or it could never finish: cap the context at the pool size.
        self.max_model_len = min(max_model_len, allocator.capacity * page_size)
        self.max_running_requests = config.max_running_requests
        self.max_queued_requests = config.max_queued_requests
        self.token_budget = token_budget(config)
        self.new_token_ratio = config.new_token_ratio
        self.key = sort_key(policy)
        self.policy = policy
        self.vocab_size = vocab_size
        self.decode_fn = decode_fn
        self.grammar = grammar
        self.stop_checker = StopChecker(
            eos_token_ids=eos_token_ids, max_model_len=self.max_model_len, decode_fn=decode_fn
        )
        self.waiting = WaitingQueue(policy)
        self.forks = Forks(self)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.counters = SchedulerCounters()
        self.handoff = HandoffPages(self, self.kv, self.forks, self.counters)
        self._arrival = itertools.count()
        self._inflight: dict[str, Request] = {}
        self._pending: list[RequestOutput] = []  # abort deltas not yet handed out
        self._finished_ids: list[str] = []

    # ---- requests in and out -----------------------------------------------------------------------------------
    def add_request(
        self,
        req_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        *,
        hold_pages: bool = False,
        media: Sequence[MediaInput] = (),
    ) -> Request:
        """Queue a request. Raises InvalidRequest (never servable as sent) or QueueFull (retry later).
        hold_pages: when it finishes, keep its pages (see HandoffPages.held_pages / release_held).
        media: the prompt's images, with their embeddings (spliced in at their placeholder positions)."""
        req = self.new_request(req_id, prompt_token_ids, params, priority, media=media, need_embeds=True)
        if len(self.waiting) >= self.max_queued_requests:
            raise QueueFull(
                f"{len(self.waiting)} requests are already waiting (max_queued_requests="
                f"{self.max_queued_requests}); retry later or on another instance"
            )
        req.hold_pages = hold_pages
        self.requests[req_id] = req
        self.waiting.push(req)
        self.forks.register(req)
        return req

    def new_request(
        self,
        req_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        *,
        media: Sequence[MediaInput] = (),
        need_embeds: bool = False,
    ) -> Request:
        """A validated Request that is not queued anywhere yet. Raises InvalidRequest."""
        params = (params or SamplingParams()).validate(vocab_size=self.vocab_size)
        if req_id in self.requests:
            raise InvalidRequest(f"request id {req_id!r} is already in use; ids must be unique", field="req_id")
        n = len(prompt_token_ids)
        if n == 0:
            raise InvalidRequest("prompt is empty; send at least one token", field="prompt")
        if n >= self.max_model_len:
            raise InvalidRequest(
                f"prompt has {n} tokens but the context holds {self.max_model_len} including at "
                f"least one generated token; shorten the prompt",
                field="prompt",
            )
        if self.vocab_size is not None:
            bad = [t for t in prompt_token_ids if not 0 <= t < self.vocab_size]
            if bad:
                raise InvalidRequest(
                    f"prompt token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})", field="prompt"
                )
        if params.stop and self.decode_fn is None:
            raise InvalidRequest(
                "stop strings need a tokenizer, and this engine has none; use stop_token_ids", field="stop"
            )
        check_media(media, n, need_embeds)
        req = Request(
            req_id,
            tuple(int(t) for t in prompt_token_ids),
            params,
            priority=priority,
            arrival=next(self._arrival),
            page_size=self.page_size,
            media=tuple(media),
        )
        if params.structured is not None:
            if self.grammar is None:
                raise InvalidRequest(
                    "structured outputs need a grammar backend and a tokenizer; start the engine "
                    "with --grammar-backend xgrammar",
                    field="response_format",
                )
            req.grammar = self.grammar.matcher(params.structured)
        return req

    def advance(self, req: Request, tok: int) -> StopResult:
        """Append a sampled token: grammar, counters, stop conditions (a finished request is finished here)."""
        req.append_output(tok)
        self.counters.num_generated_tokens += 1
        res = self.stop_checker.check(req)
        g = req.grammar
        if g is not None and not g.accept(tok) and res.finish_reason is None:
            # Only a token sampled outside the mask gets here (e.g. past the end of the structure): stop cleanly.
            res = StopResult("stop", None, res.new_text)
        elif g is not None and res.finish_reason is None and g.is_terminated:
            res = StopResult("stop", None, res.new_text)
        if res.finish_reason is not None:
            self._finish(req, res.finish_reason, res.stop_reason)
        return res

    def abort(self, req_id: str, error: str | None = None) -> bool:
        """Stop a request wherever it is (waiting, running, mid-step); its final delta (finish_reason "abort")
        comes out of the next update_from_output / take_pending_outputs. False if the id is unknown. error: the
        request failed (why, carried by its final delta) rather than being cancelled."""
        # A reserved (arriving) request: a prefill may still be writing into its pages, so they are quarantined.
        if self.handoff.cancel_remote(req_id, self.handoff.abort_quarantine_s):
            self._abort_forks(req_id)
            return True
        self._abort_forks(req_id)
        req = self.requests.pop(req_id, None)
        if req is None:
            return False
        if req.status is RequestStatus.WAITING:
            self.waiting.remove(req_id)
        elif req.status is RequestStatus.RUNNING:
            self.kv.release(req)
            self.running.remove(req)
        req.status, req.finish_reason = RequestStatus.FINISHED, "abort"
        self._finished_ids.append(req_id)
        self._pending.append(self._delta(req, (), "", None, finished=True, error=error))
        return True

    def fail(self, req: Request, why: str) -> None:
        """Abort a request whose own processing failed; its final delta carries `why` (RequestFailed upstream)."""
        if not self.abort(req.req_id, error=why):  # it finished inside the call that failed: no delta went out yet
            req.finish_reason = "abort"
            self._pending.append(self._delta(req, (), "", None, finished=True, error=why))

    def _abort_forks(self, req_id: str) -> None:
        """n > 1: aborting sample 0 aborts the others (started or not); each ends with an abort delta."""
        if "#" in req_id:
            return
        for kid in self.forks.pending.pop(req_id, []):
            kid.status, kid.finish_reason = RequestStatus.FINISHED, "abort"
            self._pending.append(self._delta(kid, (), "", None, finished=True))
        i = 1
        while fork_id(req_id, i) in self.requests:
            self.abort(fork_id(req_id, i))
            i += 1

    def cancel_step(self) -> None:
        """The step schedule() planned did not run (device error): abort its requests, whose KV is now
        incomplete; their abort deltas come out as usual."""
        for req_id in list(self._inflight):
            self.abort(req_id)
        self._inflight = {}

    def take_pending_outputs(self) -> list[RequestOutput]:
        out, self._pending = self._pending, []
        return out

    def has_work(self) -> bool:
        return bool(self.running or len(self.waiting) or self._pending)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def queued_prompt_tokens(self) -> int:
        """Prompt tokens of waiting requests (the prefill routing cost of this instance)."""
        return sum(r.num_prompt_tokens for r in self.waiting)

    @staticmethod
    def wants_prompt_logits(req: Request) -> bool:
        return req.params.prompt_logprobs is not None and len(req.prompt_logprobs) < req.num_prompt_tokens - 1

    def emit_delta(
        self, req: Request, toks: tuple[int, ...], text: str, lps: tuple[TokenLogprobs, ...] | None, *, finished: bool
    ) -> RequestOutput:
        return self._delta(req, toks, text, lps, finished=finished)

    def knows(self, req_id: str) -> bool:
        return req_id in self.requests

    def join_running(self, req: Request) -> None:
        self.requests[req.req_id] = req
        self.running.append(req)

    # ---- schedule ----------------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        assert not self._inflight, "schedule() called twice without update_from_output()"
        self.handoff.release_expired()
        plan = _Plan(budget=self.token_budget)
        order = sorted(self.running, key=self.key)
        decodes = [r for r in order if r.num_tokens - r.num_computed_tokens == 1]
        prefills = [r for r in order if r.num_tokens - r.num_computed_tokens > 1]
        for req in decodes:
            if req.status is RequestStatus.RUNNING and self._grow(req, 1, plan):
                plan.seqs[req.req_id] = (req, 1)
                plan.budget -= 1
        for req in prefills:
            if plan.budget <= 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue
            n = self._fit(req, min(req.num_tokens - req.num_computed_tokens, plan.budget))
            if self._grow(req, n, plan):
                plan.seqs[req.req_id] = (req, n)
                plan.budget -= n
        if not plan.preempted:  # admitting right after preempting would only thrash
            self._admit(plan)
        return self._emit(plan)

    def _fit(self, req: Request, n: int) -> int:
        """Shrink a prefill chunk to what the pool can hold now (at least 1 token, preempting if needed)."""
        room = (len(req.page_ids) + self.kv.available_pages) * self.page_size - req.num_computed_tokens
        return max(1, min(n, room))

    def _grow(self, req: Request, n: int, plan: _Plan) -> bool:
        """Pages for n more tokens of a running request, preempting the worst unscheduled running request
        (possibly req itself) until they fit. False if req was preempted."""
        while not self.kv.allocate(req, n):
            victim = max((r for r in self.running if r.req_id not in plan.seqs), key=self.key)
            self._preempt(victim, plan)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Request, plan: _Plan) -> None:
        """Recompute-style preemption: free the pages (computed full pages stay cached), back to waiting."""
        if req.req_id in plan.seqs:
            plan.budget += plan.seqs.pop(req.req_id)[1]
        self.kv.release(req)
        self.running.remove(req)
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        self.counters.num_preemptions += 1
        self.waiting.push(req)
        plan.preempted.append(req.req_id)

    def _reserve(self, req: Request) -> int:
        """Pages req may still take: the rest of its prompt plus new_token_ratio of its remaining output."""
        left = self.max_model_len - req.num_tokens
        if req.params.max_tokens is not None:
            left = min(left, req.params.max_tokens - req.num_output_tokens)
        target = req.num_tokens + math.ceil(self.new_token_ratio * min(max(left, 0), CLIP_MAX_NEW_TOKENS))
        return self.kv.pages_to_cover(req, target)

    def _admit(self, plan: _Plan) -> None:
        reserved = sum(self._reserve(r) for r in self.running)
        while plan.budget > 0:
            req = self.waiting.peek()
            if req is None or req.req_id in plan.preempted:
                return
            if len(self.running) >= self.max_running_requests:
                if self._preempt_for(req, plan):
                    continue
                return
            # Prompt logprobs need the logits of every prompt position: cached positions have none.
            cached = 0 if self.wants_prompt_logits(req) else self.kv.match_prefix(req)
            if req.media and lacks_embeds(req):
                # A request whose prompt KV came from another instance (decode), preempted, with image positions
                # left to recompute but no embeddings here: computing them without the image would be wrong.
                self.kv.release(req)
                self.abort(req.req_id)
                continue
            need = self._reserve(req)
            if need + reserved > self.kv.available_pages:
                self.kv.release(req)  # undo the match
                if self._preempt_for(req, plan):
                    reserved = sum(self._reserve(r) for r in self.running)
                    continue
                return
            n = min(req.num_tokens - req.num_computed_tokens, plan.budget)
            ok = self.kv.allocate(req, n)
            assert ok, "admission check passed but allocation failed"
            self.waiting.pop()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            if req.num_cached_tokens < 0:  # first admission (not a recompute)
                req.num_cached_tokens = cached
                self.counters.num_prompt_tokens += req.num_prompt_tokens
                self.counters.num_cached_prompt_tokens += cached
            plan.seqs[req.req_id] = (req, n)
            plan.budget -= n
            reserved += self._reserve(req)

    def _preempt_for(self, cand: Request, plan: _Plan) -> bool:
        """Priority policy only: make room for a waiting request by preempting a running one of strictly lower
        priority (higher value). Requests preempted this step are not readmitted in it."""
        if self.policy is not SchedulePolicy.PRIORITY or cand.req_id in plan.preempted or not self.running:
            return False
        victim = max(self.running, key=self.key)
        if victim.priority <= cand.priority:
            return False
        self._preempt(victim, plan)
        return True

    def _emit(self, plan: _Plan) -> SchedulerOutput:
        P = self.page_size
        seqs = []
        for req, n in plan.seqs.values():
            start = req.num_computed_tokens
            end = start + n
            seqs.append(
                ScheduledSeq(
                    req.req_id,
                    tuple(req.all_token_ids[start:end]),
                    start,
                    tuple(req.page_ids[: -(-end // P)]),
                    end == req.num_tokens,
                    embed_slices(req.media, start, end) if req.media else (),
                    self.wants_prompt_logits(req) and start < req.num_prompt_tokens - 1,
                )
            )
            self._inflight[req.req_id] = req
        finished, self._finished_ids = tuple(self._finished_ids), []
        return SchedulerOutput(tuple(seqs), tuple(plan.preempted), finished)

    # ---- update ------------------------------------------------------------------------------------------------
    def update_from_output(
        self, out: SchedulerOutput, next_tokens: Sequence[int], logprobs: Sequence[TokenLogprobs | None] | None = None
    ) -> list[RequestOutput]:
        """Advance the requests of `out` by the step that just ran. next_tokens (and logprobs, if any): one per
        seq with need_logits, in seq order. Returns the deltas of this step, abort deltas included."""
        n_logits = sum(1 for s in out.seqs if s.need_logits)
        assert len(next_tokens) == n_logits, f"{len(next_tokens)} tokens for {n_logits} sequences with logits"
        outputs = self.take_pending_outputs()
        j = 0
        for seq in out.seqs:
            tok: int | None = None
            lp: TokenLogprobs | None = None
            if seq.need_logits:
                tok = int(next_tokens[j])
                lp = logprobs[j] if logprobs is not None else None
                j += 1
            req = self._inflight.get(seq.req_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue  # aborted after schedule(): its KV was written into freed pages nobody reads
            assert req.num_computed_tokens == seq.start_pos, f"{req.req_id}: step does not continue its KV"
            req.num_computed_tokens += len(seq.token_ids)
            self.kv.commit(req)
            if tok is None:
                continue
            try:
                if req.num_output_tokens == 0 and req.req_id in self.forks.pending:
                    self.forks.on_prompt_done(req)
                res = self.advance(req, tok)
            except Exception as e:  # this request's grammar, detokenizer or stop check: it fails alone
                log.exception("%s: processing its token %d failed; the request is aborted", req.req_id, tok)
                self.fail(req, f"processing the output failed: {e!r}")
                outputs.extend(self.take_pending_outputs())
                continue
            outputs.append(
                self._delta(
                    req, (tok,), res.new_text, None if lp is None else (lp,), finished=res.finish_reason is not None
                )
            )
        self._inflight = {}
        return outputs

    def _finish(self, req: Request, reason: FinishReason, stop: int | str | None) -> None:
        req.status, req.finish_reason, req.stop_reason = RequestStatus.FINISHED, reason, stop
        if req.hold_pages:
            self.handoff.hold(req)
        else:
            self.kv.release(req)
        self.running.remove(req)
        del self.requests[req.req_id]
        self._finished_ids.append(req.req_id)

    def _delta(
        self,
        req: Request,
        toks: tuple[int, ...],
        text: str,
        lps: tuple[TokenLogprobs, ...] | None,
        *,
        finished: bool,
        error: str | None = None,
    ) -> RequestOutput:
        plps = None
        if req.params.prompt_logprobs is not None and not req.prompt_logprobs_sent:
            plps, req.prompt_logprobs_sent = tuple(req.prompt_logprobs), True
        return RequestOutput(
            req.req_id,
            toks,
            text,
            lps,
            finished,
            req.finish_reason if finished else None,
            req.stop_reason if finished else None,
            req.num_prompt_tokens,
            max(req.num_cached_tokens, 0),
            req.num_output_tokens,
            req.index,
            plps,
            error,
        )
