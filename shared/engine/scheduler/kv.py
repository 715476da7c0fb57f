"""A request's pages: prefix match + lock, growth (evicting cached pages when short), commit of newly computed
full pages into the prefix cache, and release. The scheduler calls only these five operations."""

from __future__ import annotations

from shared.engine.page_allocator import PageAllocator
from shared.engine.radix_cache import RadixCache
from shared.engine.request import Request


class KVManager:
    def __init__(self, allocator: PageAllocator, cache: RadixCache, page_size: int) -> None:
        assert cache.page_size == page_size and cache.allocator is allocator
        self.allocator = allocator
        self.cache = cache
        self.page_size = page_size

    @property
    def available_pages(self) -> int:
        """Pages a request could get now: free ones plus cached ones nobody holds."""
        return self.allocator.num_free + self.cache.num_evictable

    def pages_to_cover(self, req: Request, num_tokens: int) -> int:
        """New pages req needs so that its pages cover its first num_tokens positions."""
        return max(0, -(-num_tokens // self.page_size) - len(req.page_ids))

    def match_prefix(self, req: Request) -> int:
        """Attach the longest cached prefix to a request that holds no pages; returns its length in tokens.

        At least one token is left to compute: its logits give the next token.
        """
        assert not req.page_ids and req.num_computed_tokens == 0 and req.num_locked == 0
        m = self.cache.match(req.all_token_ids[: req.num_tokens - 1], req.block_hashes)
        if m.num_pages:
            self.cache.lock(m.hashes)
            self.allocator.incref(m.page_ids)
            req.page_ids = list(m.page_ids)
            req.num_locked = m.num_pages
            req.num_computed_tokens = m.num_pages * self.page_size
        return req.num_computed_tokens

    def allocate(self, req: Request, num_new_tokens: int) -> bool:
        """Make req's pages cover num_computed_tokens + num_new_tokens positions; False (nothing taken) if the
        pool cannot, even after evicting every unlocked cached page."""
        need = self.pages_to_cover(req, req.num_computed_tokens + num_new_tokens)
        if need == 0:
            return True
        if need > self.available_pages:
            return False
        short = need - self.allocator.num_free
        if short > 0:
            self.cache.evict(short)
        # after=: growth (the next prefill chunk, a decode page) continues the request's run where it can, so its
        # pages stay few contiguous runs and a hand-off of them few transfer descriptors.
        pages = self.allocator.alloc(need, after=req.page_ids[-1] if req.page_ids else None)
        assert pages is not None, "eviction freed fewer pages than num_evictable promised"
        req.page_ids.extend(pages)
        return True

    def commit(self, req: Request) -> None:
        """Insert the full pages computed since the last commit into the prefix cache and lock them for req.
        Where the cache already held a page for the same prefix (computed concurrently by another request),
        req switches to the cached page and its duplicate is freed."""
        full = req.num_computed_tokens // self.page_size
        k = req.num_locked
        if full <= k or not self.cache.enabled:
            return
        res = self.cache.insert(req.all_token_ids, req.page_ids[:full], req.block_hashes, start_page=k)
        self.cache.lock(res.hashes[k:full])
        req.num_locked = full
        dup_own: list[int] = []
        dup_cached: list[int] = []
        for i in range(k, full):
            if res.page_ids[i] != req.page_ids[i]:
                dup_own.append(req.page_ids[i])
                dup_cached.append(res.page_ids[i])
                req.page_ids[i] = res.page_ids[i]
        if dup_own:
            self.allocator.incref(dup_cached)
            self.allocator.decref(dup_own)

    def release(self, req: Request) -> None:
        """Give back everything req holds (finish, abort, preemption, failed admission). Its computed full pages
        stay in the prefix cache, unlocked, so a recompute or a later request can reuse them."""
        self.commit(req)
        if req.num_locked:
            self.cache.unlock(req.block_hashes[: req.num_locked])
        if req.page_ids:
            self.allocator.decref(req.page_ids)
        req.page_ids = []
        req.num_locked = 0
        req.num_computed_tokens = 0
