"""Engine: scheduler + model runner + sampler, one step at a time (shared/engine/async_engine.py runs it on a
thread for services).

    engine = Engine(runner, cache=CacheConfig(page_size=16), scheduler=SchedulerConfig(max_running_requests=32))
    engine.add_request("r1", prompt_ids, SamplingParams(max_tokens=64))
    while engine.has_work():
        for delta in engine.step(): ...

The runner contract is shared/engine/runner.py (`Runner`): ModelRunner implements it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from shared.config.choices import AttentionBackend, Dtype, Fault, GrammarBackendKind, LinearBackend
from shared.engine.errors import EngineError
from shared.engine.grammar import GrammarBackend, MaskFiller
from shared.engine.page_allocator import PageAllocator
from shared.engine.radix_cache import KVEvent, RadixCache
from shared.engine.request import FinishReason, MediaInput, RequestOutput, TokenLogprobs
from shared.engine.runner import Runner
from shared.engine.sampler import Sampler, prompt_logprobs
from shared.engine.sampler.text_window import DecodeFn
from shared.engine.scheduler import Scheduler
from shared.engine.scheduler.budget import max_step_tokens
from shared.engine.scheduler.handoff_pages import DEFAULT_QUARANTINE_S, Reservation
from shared.engine.types import StepStats
from shared.modelspec.sampling import SamplingParams

if TYPE_CHECKING:
    from shared.config.groups import (
        CacheConfig,
        CudaGraphConfig,
        DeviceConfig,
        DisaggConfig,
        KernelConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        TokenizerConfig,
    )
    from shared.config.resolved import ResolvedConfig


log = logging.getLogger(__name__)


class EngineStepError(EngineError):
    """A step failed on the device side; the requests it ran were aborted (req_ids), the others keep going."""

    def __init__(self, message: str, req_ids: tuple[str, ...]) -> None:
        super().__init__(message)
        self.req_ids = req_ids


@dataclass(frozen=True)
class EngineStats:
    """A snapshot for metrics, load reports and benchmarks. Times are seconds summed over all steps."""

    num_running: int
    num_waiting: int
    num_free_pages: int
    num_cached_pages: int
    num_evictable_pages: int  # cached pages no request holds: a new request could take them
    num_total_pages: int
    num_steps: int
    num_preemptions: int
    num_prompt_tokens: int
    num_cached_prompt_tokens: int
    num_generated_tokens: int
    totals: StepStats
    last_step: StepStats


@dataclass(frozen=True)
class Completion:
    """A finished request, assembled from its deltas (Engine.generate)."""

    req_id: str
    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason | None
    stop_reason: int | str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    logprobs: tuple[TokenLogprobs, ...] | None = None


@dataclass
class _Totals:
    schedule_s: float = 0.0
    prepare_s: float = 0.0
    forward_s: float = 0.0
    sample_s: float = 0.0
    update_s: float = 0.0
    num_tokens: int = 0
    num_seqs: int = 0
    steps: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    def add(self, s: StepStats) -> None:
        self.schedule_s += s.schedule_s
        self.prepare_s += s.prepare_s
        self.forward_s += s.forward_s
        self.sample_s += s.sample_s
        self.update_s += s.update_s
        self.num_tokens += s.num_tokens
        self.num_seqs += s.num_seqs
        self.steps += 1

    def frozen(self) -> StepStats:
        return StepStats(
            self.schedule_s,
            self.prepare_s,
            self.forward_s,
            self.sample_s,
            self.update_s,
            self.num_tokens,
            self.num_seqs,
        )


def make_decode_fn(tokenizer: Any) -> DecodeFn | None:
    """A tokenizer (HF `PreTrainedTokenizer*`, `tokenizers.Tokenizer`) or a plain ids -> str callable."""
    if tokenizer is None:
        return None
    if hasattr(tokenizer, "decode"):
        return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True)
    if callable(tokenizer):
        fn: DecodeFn = tokenizer
        return fn
    raise TypeError(f"tokenizer must have .decode(ids) or be a callable ids -> str (got {type(tokenizer).__name__})")


def _graph_sizes(cfg: CudaGraphConfig | None) -> tuple[int, ...]:
    """Decode batch sizes to capture; the config passes already disabled graphs on CPU and for prefill roles."""
    if cfg is None or cfg.disable_cuda_graph or cfg.disable_decode_cuda_graph:
        return ()
    return tuple(cfg.cuda_graph_bs)


class Engine:
    def __init__(
        self,
        runner: Runner,
        *,
        cache: CacheConfig,
        scheduler: SchedulerConfig,
        tokenizer: Any = None,
        threads: int | None = None,
        on_kv_event: Callable[[KVEvent], None] | None = None,
        context_length: int | None = None,
        handoff_quarantine_s: float = DEFAULT_QUARANTINE_S,
        grammar_backend: str = "xgrammar",
        poison: bool = False,
    ) -> None:
        """cache: page size and prefix sharing (num_pages is the runner's); scheduler: limits and policy. Both are
        the config groups of shared/config/groups.py, which declares every default once. poison: the
        request_poison fault is injected (--fault-injection; shared/engine/sampler/sampler.py)."""
        if threads:
            torch.set_num_threads(threads)  # per-thread OpenMP setting: AsyncEngine repeats it on its thread
        self.threads = threads
        page_size = cache.page_size
        if runner.layout.page_size != page_size:
            raise ValueError(
                f"page_size {page_size} differs from the runner's KV layout page size "
                f"{runner.layout.page_size}; build both with the same --page-size"
            )
        max_step = max_step_tokens(scheduler)
        runner_cap = runner.max_batch_tokens
        if runner_cap is not None and max_step > runner_cap:
            raise ValueError(
                f"a step may hold {max_step} tokens (max_prefill_tokens / chunked_prefill_size / "
                f"max_running_requests) but the runner takes at most {runner_cap}; lower "
                f"--max-prefill-tokens or build the runner with max_batch_tokens >= {max_step}"
            )
        self.runner = runner
        self.page_size = page_size
        self.allocator = PageAllocator(runner.num_pages)
        self.cache = RadixCache(self.allocator, page_size, enabled=not cache.disable_radix_cache, on_event=on_kv_event)
        self.decode_fn = make_decode_fn(tokenizer)
        self.tokenizer = tokenizer
        ctx = min(context_length or runner.context_length, runner.context_length)
        # Structured outputs: xgrammar over the engine's own tokenizer (an HF tokenizer; a bare decode callable
        # cannot describe its vocabulary to a grammar compiler).
        grammar = None
        if grammar_backend == GrammarBackendKind.XGRAMMAR and tokenizer is not None and hasattr(tokenizer, "get_vocab"):
            grammar = GrammarBackend(tokenizer, runner.vocab_size, runner.eos_token_ids)
        elif grammar_backend not in tuple(GrammarBackendKind):
            raise ValueError(f"grammar_backend must be 'xgrammar' or 'none' (got {grammar_backend!r})")
        self.masks = MaskFiller(runner.vocab_size)
        self.scheduler = Scheduler(
            allocator=self.allocator,
            cache=self.cache,
            page_size=page_size,
            max_model_len=ctx,
            config=scheduler,
            eos_token_ids=runner.eos_token_ids,
            decode_fn=self.decode_fn,
            vocab_size=runner.vocab_size,
            grammar=grammar,
        )
        self.scheduler.handoff.abort_quarantine_s = handoff_quarantine_s
        self.scheduler.forks.can_copy = runner.can_copy_pages
        self.sampler = Sampler(eos_token_ids=runner.eos_token_ids, poison=poison)
        self._totals = _Totals()
        self._last = StepStats()

    # ---- construction from configuration ----------------------------------------------------------------------
    @classmethod
    def from_groups(
        cls,
        *,
        model: ModelConfig,
        cache: CacheConfig,
        scheduler: SchedulerConfig,
        kernels: KernelConfig | None = None,
        device: DeviceConfig | None = None,
        tokenizer: TokenizerConfig | None = None,
        on_kv_event: Callable[[KVEvent], None] | None = None,
        disagg: DisaggConfig | None = None,
        cuda_graph: CudaGraphConfig | None = None,
        parallel: ParallelConfig | None = None,
    ) -> Engine:
        """Build the runner (weights + KV pool; one process per rank at --tp-size > 1) and the engine from
        resolved config groups."""
        from shared.engine.build_runner import build_runner, rank_threads
        from shared.modelspec.bundled import resolve_model_path

        dev = device.device if device is not None else "auto"
        if dev == "auto":
            dev = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = model.dtype if model.dtype != Dtype.AUTO else (Dtype.BFLOAT16 if dev == "cuda" else Dtype.FLOAT32)
        # the runner resolves auto
        backend = AttentionBackend(kernels.attention_backend) if kernels is not None else AttentionBackend.AUTO
        tp = parallel.tp_size if parallel is not None else 1
        threads = rank_threads(device.threads if device is not None and device.threads > 0 else None, tp, dev)
        if threads:
            torch.set_num_threads(threads)  # before loading: weight conversion uses the intra-op pool too
        path = resolve_model_path(model.model, model.model_cache_dir)
        runner = build_runner(
            path,
            dtype=dtype,
            kv_cache_dtype=None if cache.kv_cache_dtype == "auto" else str(cache.kv_cache_dtype),
            quantization=model.quantization,
            device=dev,
            num_pages=cache.num_pages or None,
            kv_budget_bytes=(cache.kv_cache_memory_bytes or None) if not cache.num_pages else None,
            page_size=cache.page_size,
            attention_backend=backend,
            linear_backend=LinearBackend(kernels.linear_backend) if kernels is not None else LinearBackend.AUTO,
            max_batch_tokens=max_step_tokens(scheduler),
            context_length=model.context_length,
            cuda_graph_bs=_graph_sizes(cuda_graph) if tp == 1 else (),  # not captured at tp > 1 yet
            tp_size=tp,
            threads=threads,
            device_cfg=device,
        )
        tok_dir = tokenizer.tokenizer if tokenizer is not None and tokenizer.tokenizer else str(path)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
        return cls(
            runner,
            cache=cache,
            scheduler=scheduler,
            tokenizer=tok,
            threads=threads,
            on_kv_event=on_kv_event,
            context_length=model.context_length,
            handoff_quarantine_s=disagg.handoff_timeout_s if disagg is not None else DEFAULT_QUARANTINE_S,
            grammar_backend=kernels.grammar_backend if kernels is not None else "xgrammar",
            poison=disagg is not None and disagg.fault_injection == Fault.REQUEST_POISON,
        )

    @classmethod
    def from_config(cls, cfg: ResolvedConfig, *, on_kv_event: Callable[[KVEvent], None] | None = None) -> Engine:
        """From the resolved config of an engine role (prefill, decode, worker): its model, cache, scheduler,
        kernels, device, tokenizer, disagg, cuda_graph and parallel groups."""
        return cls.from_groups(
            model=cfg.model,
            cache=cfg.cache,
            scheduler=cfg.scheduler,
            kernels=cfg.kernels,
            device=cfg.device,
            tokenizer=cfg.tokenizer,
            on_kv_event=on_kv_event,
            disagg=cfg.disagg,
            cuda_graph=cfg.cuda_graph,
            parallel=cfg.parallel,
        )

    # ---- requests ----------------------------------------------------------------------------------------------
    def add_request(
        self,
        req_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        *,
        hold_pages: bool = False,
        media: Sequence[MediaInput] = (),
    ) -> None:
        """Queue a request. InvalidRequest / QueueFull leave the engine serving the others. hold_pages: keep its
        pages when it finishes until release_held() (prefill role: the KV is sent after the first token).
        media: the prompt's images with their embeddings (a VisionEncoderRunner's or the encoder service's)."""
        self.scheduler.add_request(req_id, prompt_token_ids, params, priority, hold_pages=hold_pages, media=media)

    # ---- KV hand-off (shared/engine/scheduler/handoff_pages.py) ------------------------------------------------------
    def reserve_remote(
        self,
        req_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        media: Sequence[MediaInput] = (),
    ) -> Reservation:
        """Decode role: pages for a prompt whose KV another instance computes."""
        return self.scheduler.handoff.reserve_remote(req_id, list(prompt_token_ids), params, priority, media)

    def activate_remote(
        self,
        req_id: str,
        first_token: int,
        logprob: TokenLogprobs | None = None,
        prompt_logprobs: Sequence[TokenLogprobs] = (),
        received: Sequence[int] = (),
    ) -> list[RequestOutput]:
        """received: the pages the peer wrote into runner.kv, handed to the model first (import_pages)."""
        self.import_pages(received)
        return self.scheduler.handoff.activate_remote(req_id, first_token, logprob, prompt_logprobs)

    def cancel_remote(self, req_id: str, quarantine_s: float = 0.0) -> bool:
        return self.scheduler.handoff.cancel_remote(req_id, quarantine_s)

    def held_pages(self, req_id: str) -> tuple[int, ...]:
        return self.scheduler.handoff.held_pages(req_id)

    def release_held(self, req_id: str) -> bool:
        return self.scheduler.handoff.release_held(req_id)

    def export_pages(self, page_ids: Sequence[int]) -> None:
        """Before a peer reads runner.kv's pages (a hand-off, a kvstore save): the model's KV into them (a gather
        of the ranks' KV heads at --tp-size > 1, nothing at 1). Engine thread only, between steps."""
        self.runner.export_pages(page_ids)

    def import_pages(self, page_ids: Sequence[int]) -> None:
        """After a peer wrote runner.kv's pages (a hand-off, a kvstore load): the model reads them from now on."""
        if page_ids:
            self.runner.import_pages(page_ids)

    def release_expired_pages(self) -> float | None:
        """Free hand-off pages whose quarantine is over; seconds until the next ones are due (None: none left)."""
        handoff = self.scheduler.handoff
        handoff.release_expired()
        return handoff.next_release_in()

    def abort(self, req_id: str) -> bool:
        """Abort wherever the request is; its final delta (finish_reason "abort") comes out of the next step()."""
        return self.scheduler.abort(req_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # ---- one step ----------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run the model, sample, update: one forward pass. Returns this step's deltas."""
        t0 = time.perf_counter()
        out = self.scheduler.schedule()
        t1 = time.perf_counter()
        t2 = t3 = t4 = t1
        tokens: list[int] = []
        logprobs: list[TokenLogprobs | None] | None = None
        copies = self.scheduler.forks.take_copies()
        if copies:  # n > 1: the partial prompt page of each new fork, before anything writes into it
            self.runner.kv.copy_pages(copies)
        if out.seqs:
            try:
                reqs = [self.scheduler.requests[s.req_id] for s in out.seqs if s.need_logits]
                pending = self.masks.start(reqs)  # grammar bitmask filled while the forward pass runs
                batch = self.runner.prepare(out)
                t2 = time.perf_counter()
                logits = self.runner.forward_batch(batch)
                t3 = time.perf_counter()
                logits, prompt_rows = prompt_logprobs.split_logits(logits, out.seqs)
                if prompt_rows is not None:
                    prompt_logprobs.record(prompt_rows, out.seqs, self.scheduler.requests)
                sampled = self.sampler.sample(
                    logits,
                    reqs,
                    None if pending is None else (lambda x: self.masks.apply(pending, x)),
                    None if pending is None else (lambda x, i: self.masks.apply_row(pending, x, i)),
                )
                tokens, logprobs = sampled.token_ids, sampled.logprobs
                t4 = time.perf_counter()
            except Exception as e:
                ids = tuple(s.req_id for s in out.seqs)
                self.scheduler.cancel_step()  # abort deltas come out of the next step
                raise EngineStepError(f"step over {len(ids)} requests failed: {e!r}; they were aborted", ids) from e
            for i, why in sampled.failed.items():  # one request's logits processing: it fails alone
                log.warning("%s: %s; the request is aborted", reqs[i].req_id, why)
                self.scheduler.fail(reqs[i], why)
        outputs = self.scheduler.update_from_output(out, tokens, logprobs)
        t5 = time.perf_counter()
        stats = StepStats(
            schedule_s=t1 - t0,
            prepare_s=t2 - t1,
            forward_s=t3 - t2,
            sample_s=t4 - t3,
            update_s=t5 - t4,
            num_tokens=out.num_tokens,
            num_seqs=len(out.seqs),
        )
        self._last = stats
        if out.seqs:
            self._totals.add(stats)
        return outputs

    @property
    def stats(self) -> EngineStats:
        c = self.scheduler.counters
        return EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            num_free_pages=self.allocator.num_free,
            num_cached_pages=self.cache.num_pages,
            num_evictable_pages=self.cache.num_evictable,
            num_total_pages=self.allocator.capacity,
            num_steps=self._totals.steps,
            num_preemptions=c.num_preemptions,
            num_prompt_tokens=c.num_prompt_tokens,
            num_cached_prompt_tokens=c.num_cached_prompt_tokens,
            num_generated_tokens=c.num_generated_tokens,
            totals=self._totals.frozen(),
            last_step=self._last,
        )

    def reset_stats(self) -> None:
        self._totals = _Totals()

    # ---- convenience -------------------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        prefix: str = "gen",
        media: Sequence[Sequence[MediaInput]] | None = None,
    ) -> list[Completion]:
        """Run prompts to completion in one continuous batch (tests, benchmarks, offline use); media: each prompt's
        images (with embeddings)."""
        plist = list(params) if isinstance(params, Sequence) else [params or SamplingParams()] * len(prompts)
        ids = [f"{prefix}-{i}" for i in range(len(prompts))]
        mlist = list(media) if media is not None else [()] * len(prompts)
        for rid, p, sp, mm in zip(ids, prompts, plist, mlist, strict=True):
            self.add_request(rid, p, sp, media=mm)
        toks: dict[str, list[int]] = {r: [] for r in ids}
        text: dict[str, list[str]] = {r: [] for r in ids}
        lps: dict[str, list[TokenLogprobs]] = {r: [] for r in ids}
        done: dict[str, RequestOutput] = {}
        while len(done) < len(ids) and self.has_work():
            for o in self.step():
                if o.req_id not in toks:
                    continue
                toks[o.req_id].extend(o.new_token_ids)
                text[o.req_id].append(o.new_text)
                if o.new_logprobs:
                    lps[o.req_id].extend(o.new_logprobs)
                if o.finished:
                    done[o.req_id] = o
        return [
            Completion(
                r,
                tuple(toks[r]),
                "".join(text[r]),
                done[r].finish_reason if r in done else None,
                done[r].stop_reason if r in done else None,
                done[r].num_prompt_tokens if r in done else 0,
                done[r].num_cached_tokens if r in done else 0,
                tuple(lps[r]) if lps[r] else None,
            )
            for r in ids
        ]
