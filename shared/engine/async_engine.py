"""AsyncEngine: runs an Engine on a dedicated thread so the event loop stays free; requests stream through asyncio
queues. All engine state is touched by the engine thread only: callers submit commands to it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import queue
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar

import torch

from shared.engine.engine import Engine, EngineStats, EngineStepError
from shared.engine.errors import EngineError
from shared.engine.request import RequestOutput
from shared.engine.sampling_params import SamplingParams

T = TypeVar("T")


class AsyncEngine:
    """Runs an Engine on a dedicated thread so the event loop stays free; requests stream through asyncio queues.

    All engine state is touched by the engine thread only: callers submit commands (add, abort) to it.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._cmds: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[RequestOutput | BaseException]]] = {}
        self._stopping = False
        self.last_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pdrelay-engine", daemon=True)
        self._thread.start()

    async def generate(self, req_id: str, prompt_token_ids: Sequence[int], params: SamplingParams | None = None,
                       priority: int = 0, *, hold_pages: bool = False) -> AsyncIterator[RequestOutput]:
        """Deltas of one request until it finishes. Raises InvalidRequest / QueueFull before the first delta;
        cancelling the consumer (or leaving the loop early) aborts the request."""
        if self._stopping:
            raise EngineError("the engine is shut down")
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        added: concurrent.futures.Future[None] = concurrent.futures.Future()

        def add() -> None:
            if not added.set_running_or_notify_cancel():
                return  # the caller went away before the engine got here: never admit it
            try:
                self.engine.add_request(req_id, prompt_token_ids, params, priority, hold_pages=hold_pages)
            except BaseException as e:  # handed to the caller, the engine keeps serving
                added.set_exception(e)
                return
            self._streams[req_id] = (loop, q)
            added.set_result(None)

        self._submit(add)
        try:
            await asyncio.wrap_future(added)
        except asyncio.CancelledError:
            self.abort(req_id)  # queued after add(): drops the request if add() already admitted it
            raise
        finished = False
        try:
            while not finished:
                item = _coalesce(await q.get(), q)
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
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
            except BaseException as e:  # handed to the caller, the engine keeps serving
                fut.set_exception(e)
                return
            fut.set_result(result)

        self._submit(run)
        return await asyncio.wrap_future(fut)

    async def stream(self, req_id: str, start: Callable[[], list[RequestOutput]]) -> AsyncIterator[RequestOutput]:
        """Deltas of a request that `start` puts into the engine (e.g. activate_remote), run on the engine thread
        together with the stream's registration, so no delta of a step in between is lost. Leaving early aborts."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

        def begin() -> list[RequestOutput]:
            first = start()
            if not any(o.finished for o in first):
                self._streams[req_id] = (loop, q)
            return first

        finished = False
        try:
            for item in await self.call(begin):
                finished = item.finished
                yield item
            while not finished:
                got = _coalesce(await q.get(), q)
                if isinstance(got, BaseException):
                    finished = True
                    raise got
                finished = got.finished
                yield got
        finally:
            if not finished:
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
    def _submit(self, fn: Callable[[], None]) -> None:
        self._cmds.put(fn)
        self._wake.set()

    def _run(self) -> None:
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
                continue
            self._deliver([(o.req_id, o) for o in outputs])
        stopped = EngineError("the engine shut down before this request finished")
        self._deliver([(rid, stopped) for rid in list(self._streams)])

    def _deliver(self, items: Sequence[tuple[str, RequestOutput | BaseException]]) -> None:
        """Hand a step's deltas to their streams: one wake-up per event loop per step, not one per request
        (each call_soon_threadsafe writes the loop's self-pipe and takes the GIL from the engine thread)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[RequestOutput | BaseException],
                                                           RequestOutput | BaseException]]] = {}
        for req_id, item in items:
            target = self._streams.get(req_id)
            if target is None:
                continue
            if isinstance(item, BaseException) or item.finished:
                del self._streams[req_id]
            loop, q = target
            by_loop.setdefault(loop, []).append((q, item))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:  # the caller's loop is closed: nobody is listening any more
                pass


def _put_all(batch: list[tuple[asyncio.Queue[RequestOutput | BaseException], RequestOutput | BaseException]]) -> None:
    for q, item in batch:
        q.put_nowait(item)


def _coalesce(item: RequestOutput | BaseException,
              q: asyncio.Queue[RequestOutput | BaseException]) -> RequestOutput | BaseException:
    """`item` merged with the deltas already queued behind it: a consumer slower than the engine (a busy event
    loop, a slow client) then sends one message with several tokens instead of falling further behind with one
    message per token. An exception is never merged (it is delivered after the deltas before it)."""
    while isinstance(item, RequestOutput) and not item.finished and not q.empty():
        nxt = q.get_nowait()
        if isinstance(nxt, BaseException):
            q.put_nowait(nxt)  # the queue held only nxt: it comes out on the next get
            break
        item = merge_deltas(item, nxt)
    return item


def merge_deltas(a: RequestOutput, b: RequestOutput) -> RequestOutput:
    """Two consecutive deltas of one request as one (b is the later: its status and counters win)."""
    lps = None if a.new_logprobs is None and b.new_logprobs is None else (*(a.new_logprobs or ()),
                                                                         *(b.new_logprobs or ()))
    return dataclasses.replace(b, new_token_ids=a.new_token_ids + b.new_token_ids, new_text=a.new_text + b.new_text,
                               new_logprobs=lps)
