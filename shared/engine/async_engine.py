"""AsyncEngine: runs an Engine on a dedicated thread so the event loop stays free; requests stream through asyncio
queues. All engine state is touched by the engine thread only: callers submit commands to it.

Services build the engine on that thread too (`AsyncEngine.build`), so the process has one OpenMP team: libgomp
keeps a team of worker threads for every thread that ran a parallel region, and once it manages more threads than
there are cores it stops spinning between regions, so each of the forward pass's hundreds of small ops then waits
for a futex wake of its worker. Measured on 2 cores (weights loaded on an executor thread, stepped on this one):
the engine's two threads on a CPU only ~55% of the time and served steps 50% slower than the same engine in one
thread; built here, ~95%.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import queue
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar

import torch

from shared.engine.engine import Engine, EngineStats, EngineStepError
from shared.engine.errors import EngineError, RankLost, RequestFailed
from shared.engine.request import MediaInput, RequestOutput
from shared.engine.scheduler.forks import fork_id
from shared.modelspec.sampling import SamplingParams


def _sample_ids(req_id: str, params: SamplingParams | None) -> list[str]:
    """Engine ids of all samples of a request (n > 1 forks are fork_id(req_id, i))."""
    n = params.n if params is not None else 1
    return [req_id, *(fork_id(req_id, i) for i in range(1, n))]


T = TypeVar("T")


class AsyncEngine:
    """Runs an Engine on a dedicated thread so the event loop stays free; requests stream through asyncio queues.

    All engine state is touched by the engine thread only: callers submit commands (add, abort) to it.
    """

    def __init__(
        self,
        engine: Engine | None = None,
        *,
        stream_interval: int = 1,
        _build: Callable[[], Engine] | None = None,
    ) -> None:
        """stream_interval: a request's deltas after its first go out once they hold that many tokens (its last at
        once): fewer, larger messages through the event loop, gRPC and the gateway (--stream-interval)."""
        assert (engine is None) != (_build is None), "an engine, or (through AsyncEngine.build) a factory"
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1 (got {stream_interval})")
        self.engine: Engine = engine  # type: ignore[assignment]  # None until the engine thread sets it (build)
        self.stream_interval = stream_interval
        self._cmds: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[RequestOutput | BaseException]]] = {}
        self._held: dict[str, RequestOutput] = {}  # engine thread: deltas gathered under stream_interval
        self._stopping = False
        self.last_error: BaseException | None = None
        # Called once, on the engine thread, when the engine can never step again (a tensor-parallel rank was lost):
        # the service ends the instance rather than stay registered and fail every request.
        self.on_lost: Callable[[BaseException], None] | None = None
        self._built: concurrent.futures.Future[Engine] = concurrent.futures.Future()
        if engine is not None:
            self._built.set_result(engine)
        self._thread = threading.Thread(target=self._run, args=(_build,), name="pdrelay-engine", daemon=True)
        self._thread.start()

    @classmethod
    async def build(cls, factory: Callable[[], Engine], *, stream_interval: int = 1) -> AsyncEngine:
        """An AsyncEngine whose engine `factory` builds on the engine thread (loading weights takes seconds, off
        the event loop): every torch op of the engine, loading included, then runs on one thread (see the module
        docstring). The factory's exception is raised here and the thread ends."""
        ae = cls(stream_interval=stream_interval, _build=factory)
        await asyncio.wrap_future(ae._built)
        return ae

    async def generate(
        self,
        req_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        *,
        hold_pages: bool = False,
        media: Sequence[MediaInput] = (),
    ) -> AsyncIterator[RequestOutput]:
        """Deltas of one request until it finishes (n > 1: of all its samples, told apart by `index`, until all
        finish). Raises InvalidRequest / QueueFull before the first delta; cancelling the consumer (or leaving the
        loop early) aborts the request."""
        if self._stopping:
            raise EngineError("the engine is shut down")
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        added: concurrent.futures.Future[None] = concurrent.futures.Future()
        ids = _sample_ids(req_id, params)

        def add() -> None:
            if not added.set_running_or_notify_cancel():
                return  # the caller went away before the engine got here: never admit it
            try:
                self.engine.add_request(req_id, prompt_token_ids, params, priority, hold_pages=hold_pages, media=media)
            except BaseException as e:  # handed to the caller, the engine keeps serving  # noqa: BLE001
                added.set_exception(e)
                return
            for rid in ids:
                self._streams[rid] = (loop, q)
            added.set_result(None)

        self._submit(add)
        try:
            await asyncio.wrap_future(added)
        except asyncio.CancelledError:
            self.abort(req_id)  # queued after add(): drops the request if add() already admitted it
            raise
        left = len(ids)
        pending: collections.deque[RequestOutput | BaseException] = collections.deque()
        try:
            while left:
                if not pending:
                    pending.extend(_coalesce(await q.get(), q))
                item = pending.popleft()
                if isinstance(item, BaseException):
                    left = 0
                    raise item
                left -= item.finished
                yield item
        finally:
            if left:
                self.abort(req_id)

    async def call(self, fn: Callable[[], T]) -> T:
        """Run fn on the engine thread (between steps) and return its result; its exception is raised here.
        Cancelling the caller before fn started skips fn; once started, fn runs to its end (its result is lost),
        so callers that change engine state shield the call or undo it on cancellation."""
        if self._stopping:
            raise EngineError("the engine is shut down")
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            # A caller cancelled before its turn (its task was cancelled, e.g. the RPC ended) cancels the future:
            # skip fn, and never set a result on a cancelled future (that raises and would end the engine thread).
            if not fut.set_running_or_notify_cancel():
                return
            try:
                result = fn()
            except BaseException as e:  # handed to the caller, the engine keeps serving  # noqa: BLE001
                fut.set_exception(e)
                return
            fut.set_result(result)

        self._submit(run)
        return await asyncio.wrap_future(fut)

    async def stream(
        self,
        req_id: str,
        start: Callable[[], list[RequestOutput]],
        n: int = 1,
    ) -> AsyncIterator[RequestOutput]:
        """Deltas of a request that `start` puts into the engine (e.g. activate_remote), run on the engine thread
        together with the stream's registration, so no delta of a step in between is lost. Leaving early aborts.
        n: samples of the request (n > 1: its forks' deltas come through here too)."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        ids = [req_id, *(fork_id(req_id, i) for i in range(1, n))]

        def begin() -> list[RequestOutput]:
            first = start()
            done = {o.req_id for o in first if o.finished}
            for rid in ids:
                if rid not in done:
                    self._streams[rid] = (loop, q)
            return first

        left = len(ids)
        pending: collections.deque[RequestOutput | BaseException] = collections.deque()
        try:
            for item in await self.call(begin):
                left -= item.finished
                yield item
            while left:
                if not pending:
                    pending.extend(_coalesce(await q.get(), q))
                got = pending.popleft()
                if isinstance(got, BaseException):
                    left = 0
                    raise got
                left -= got.finished
                yield got
        finally:
            if left:
                self.abort(req_id)

    def abort(self, req_id: str) -> None:
        """Abort from any thread; a running generate() ends with a delta whose finish_reason is "abort"."""
        self._submit(lambda: self.engine.abort(req_id))

    def stats(self) -> EngineStats:
        return self.engine.stats  # a snapshot of plain numbers; a slightly stale read is fine for metrics

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop the engine thread; open streams end with an EngineError."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)

    # ---- engine thread -----------------------------------------------------------------------------------------
    def _submit(self, fn: Callable[[], object]) -> None:
        self._cmds.put(fn)
        self._wake.set()

    def _run(self, build: Callable[[], Engine] | None) -> None:
        if build is not None:
            try:
                self.engine = build()
            except BaseException as e:  # handed to build()'s caller  # noqa: BLE001
                self._stopping = True
                self._built.set_exception(e)
                return
            self._built.set_result(self.engine)
        if self.engine.threads:
            torch.set_num_threads(self.engine.threads)
        while not self._stopping:
            self._wake.clear()
            while True:
                try:
                    self._cmds.get_nowait()()
                except queue.Empty:
                    break
            if not self.engine.has_work():
                # idle: still wake up when quarantined hand-off pages are due, so they are freed without a request
                self._wake.wait(self.engine.release_expired_pages())
                continue
            try:
                outputs = self.engine.step()
            except EngineStepError as e:
                self.last_error = e
                self._deliver([(rid, e) for rid in e.req_ids])
                if isinstance(e.__cause__, RankLost):  # no later step can run: end every stream now, loudly
                    self._stopping = True
                    self._deliver([(rid, e.__cause__) for rid in list(self._streams)])
                    if self.on_lost is not None:
                        self.on_lost(e.__cause__)
                continue
            # a request whose own processing failed ends its stream with RequestFailed; the others go on
            self._deliver([(o.req_id, RequestFailed(o.error) if o.error else o) for o in outputs])
        stopped = EngineError("the engine shut down before this request finished")
        self._deliver([(rid, stopped) for rid in list(self._streams)])

    def _deliver(self, items: Sequence[tuple[str, RequestOutput | BaseException]]) -> None:
        """Hand a step's deltas to their streams: one wake-up per event loop per step, not one per request
        (each call_soon_threadsafe writes the loop's self-pipe and takes the GIL from the engine thread)."""
        by_loop: dict[
            asyncio.AbstractEventLoop,
            list[tuple[asyncio.Queue[RequestOutput | BaseException], RequestOutput | BaseException]],
        ] = {}
        for req_id, item in items:
            target = self._streams.get(req_id)
            if target is None:
                self._held.pop(req_id, None)
                continue
            if isinstance(item, BaseException):
                self._held.pop(req_id, None)
            elif self.stream_interval > 1:
                gathered = self._gather(item)
                if gathered is None:
                    continue
                item = gathered
            if isinstance(item, BaseException) or item.finished:
                del self._streams[req_id]
            loop, q = target
            by_loop.setdefault(loop, []).append((q, item))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:  # the caller's loop is closed: nobody is listening any more
                pass

    def _gather(self, item: RequestOutput) -> RequestOutput | None:
        """Under stream_interval > 1: the delta to send now, merged with what was held back for its request, or
        None (held). Sent at once: a request's first delta (TTFT is never delayed) and its last; the rest once
        they hold stream_interval tokens, as vLLM's and SGLang's --stream-interval do. Each message costs the event
        loop time that the engine thread then waits for (they share the GIL). Two colocated clusters on 2 cores, 64
        requests at concurrency 16, interval 4 against 1: varied lengths +2% and +11% in two A/Bs, 128/64 +0-3%."""
        held = self._held.pop(item.req_id, None)
        if held is not None:
            item = merge_deltas(held, item)
        first = item.num_output_tokens <= len(item.new_token_ids)
        if item.finished or first or len(item.new_token_ids) >= self.stream_interval:
            return item
        self._held[item.req_id] = item
        return None


def _put_all(batch: list[tuple[asyncio.Queue[RequestOutput | BaseException], RequestOutput | BaseException]]) -> None:
    for q, item in batch:
        q.put_nowait(item)


def _coalesce(
    first: RequestOutput | BaseException, q: asyncio.Queue[RequestOutput | BaseException]
) -> list[RequestOutput | BaseException]:
    """`first` and whatever is already queued behind it, each request's consecutive deltas merged into one: a
    consumer slower than the engine (a busy event loop, a slow client) then sends one message with several tokens
    instead of falling further behind with one message per token. The queue may carry several requests (the
    samples of n > 1): each keeps its own order, a finished delta is never merged into, exceptions pass as is."""
    out: list[RequestOutput | BaseException] = []
    open_at: dict[str, int] = {}  # req_id -> index in out of its latest unfinished delta
    item: RequestOutput | BaseException | None = first
    while item is not None:
        if isinstance(item, RequestOutput) and item.req_id in open_at:
            j = open_at[item.req_id]
            merged = merge_deltas(out[j], item)  # type: ignore[arg-type]  # open_at points at RequestOutputs only
            out[j] = merged
            if merged.finished:
                del open_at[item.req_id]
        else:
            if isinstance(item, RequestOutput) and not item.finished:
                open_at[item.req_id] = len(out)
            out.append(item)
        item = q.get_nowait() if not q.empty() else None
    return out


def merge_deltas(a: RequestOutput, b: RequestOutput) -> RequestOutput:
    """Two consecutive deltas of one request as one (b is the later: its status and counters win; the prompt
    logprobs ride on the first delta only, so a's are kept)."""
    lps = (
        None
        if a.new_logprobs is None and b.new_logprobs is None
        else (*(a.new_logprobs or ()), *(b.new_logprobs or ()))
    )
    return dataclasses.replace(
        b,
        new_token_ids=a.new_token_ids + b.new_token_ids,
        new_text=a.new_text + b.new_text,
        new_logprobs=lps,
        prompt_logprobs=a.prompt_logprobs if a.prompt_logprobs is not None else b.prompt_logprobs,
    )
