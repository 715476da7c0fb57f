"""n > 1: one prompt, n samples. The prompt is computed once (by the parent, sample 0); when its KV is complete the
other n - 1 samples fork from it instead of prefilling again.

A fork shares the parent's full prompt pages (one more allocator reference and cache lock each) and gets a copy of
the last, partial page (copy-on-write: the parent keeps writing its own tokens into its copy). The fork's KV then
covers positions [0, L - 1) of the L-token prompt; it computes position L - 1 itself like a decode step, so its
own logits give its own first token (its own seed, seed + i). When no page is free for the copy, the fork waits as
an ordinary request and its prefill reuses the prompt's cached full pages instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from shared.engine.request import Request, RequestStatus

if TYPE_CHECKING:
    from shared.engine.scheduler.kv import KVManager
    from shared.engine.scheduler.policy import WaitingQueue
    from shared.modelspec.sampling import SamplingParams


class ForkHost(Protocol):
    """What forking needs of the scheduler (Scheduler implements it): its pages, its requests and queues."""

    page_size: int
    kv: KVManager
    requests: dict[str, Request]
    running: list[Request]
    waiting: WaitingQueue

    def new_request(
        self, req_id: str, prompt_token_ids: Sequence[int], params: SamplingParams | None = None, priority: int = 0
    ) -> Request: ...


def fork_id(parent_id: str, index: int) -> str:
    """Engine request id of sample `index` (>= 1) of `parent_id` (sample 0 keeps the parent's id)."""
    return f"{parent_id}#{index}"


class Forks:
    def __init__(self, sched: ForkHost) -> None:
        self.s = sched
        self.pending: dict[str, list[Request]] = {}  # parent id -> samples 1..n-1 not started yet
        self.copies: list[tuple[int, int]] = []  # (src page, dst page) the runner copies before the next forward
        self.can_copy = True  # False when the runner cannot copy pages: forks prefill (from the prefix cache)

    def register(self, parent: Request) -> None:
        """Create samples 1..n-1 of a request with params.n > 1 (validated, not scheduled yet)."""
        n = parent.params.n
        if n <= 1:
            return
        kids = []
        for i in range(1, n):
            p = parent.params
            params = dataclasses.replace(p, n=1, seed=None if p.seed is None else (p.seed + i) % 2**63)
            kid = self.s.new_request(fork_id(parent.req_id, i), parent.prompt_token_ids, params, parent.priority)
            kid.index = i
            kid.hold_pages = parent.hold_pages
            kids.append(kid)
        parent.index = 0
        self.pending[parent.req_id] = kids

    def on_prompt_done(self, parent: Request) -> None:
        """The parent's prompt KV is complete (computed here or received); start its forks."""
        kids = self.pending.pop(parent.req_id, None)
        if not kids:
            return
        s = self.s
        for kid in kids:
            s.requests[kid.req_id] = kid
            if not self._fork(parent, kid):
                s.waiting.push(kid)  # no page for the copy: prefill it, reusing the cached full pages

    def _fork(self, parent: Request, kid: Request) -> bool:
        s = self.s
        P = s.page_size
        L = parent.num_prompt_tokens
        shared, partial = divmod(L - 1, P)
        if not self.can_copy and partial:
            return False
        dst: list[int] = []
        if partial:
            if s.kv.available_pages < 1:
                return False
            if s.kv.allocator.num_free < 1:
                s.kv.cache.evict(1)
            got = s.kv.allocator.alloc(1, after=None)
            if got is None:
                return False
            dst = got
            self.copies.append((parent.page_ids[shared], dst[0]))
        pages = parent.page_ids[:shared]
        s.kv.allocator.incref(pages)
        locked = min(shared, parent.num_locked)
        if locked:
            s.kv.cache.lock(parent.block_hashes[:locked])
        kid.page_ids = [*pages, *dst]
        kid.num_locked = locked
        kid.num_computed_tokens = L - 1
        kid.num_cached_tokens = max(parent.num_cached_tokens, 0)
        kid.status = RequestStatus.RUNNING
        s.running.append(kid)
        return True

    def take_copies(self) -> list[tuple[int, int]]:
        out, self.copies = self.copies, []
        return out

    def drop(self, parent_id: str) -> list[str]:
        """The parent was aborted before its forks started: forget them. Returns their ids."""
        return [k.req_id for k in self.pending.pop(parent_id, [])]
