"""What the kvstore client does to the engine's pages, as small functions run on the engine thread
(`aengine.call(lambda: f(engine, ...))`): measure the local prefix, take pages for a load, hand loaded pages to the
prefix cache (or to quarantine), pin pages while they are stored.

A load's pages belong to nobody but the load until `adopt`: the scheduler never sees them, so a half-written page
is never attended over. `adopt` inserts the verified ones into the radix cache as the continuation of the local
prefix (the request that follows matches them like any cached prefix); a load that timed out or failed hands its
pages to the hand-off quarantine instead, because the store may still be writing into them.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.engine.engine import Engine


def loadable_pages(num_tokens: int, page_size: int) -> int:
    """Full pages of a prompt a cache may serve: the last prompt token is always computed (its logits give the
    first output token), as in the scheduler's own prefix match."""
    return max(0, num_tokens - 1) // page_size


def local_prefix(engine: Engine, tokens: Sequence[int], hashes: Sequence[int]) -> int:
    """Leading pages the radix cache holds now."""
    n = len(hashes)
    return engine.cache.match(tokens[: n * engine.page_size], hashes).num_pages


def take_pages(engine: Engine, n: int, keep_free: int = 0) -> list[int] | None:
    """n pages for a load (evicting unlocked cached pages if short), or None when the pool cannot spare them
    and still leave `keep_free` for the request itself."""
    engine.scheduler.handoff.release_expired()
    kv = engine.scheduler.kv
    if n <= 0 or n + keep_free > kv.available_pages:
        return None
    short = n - engine.allocator.num_free
    if short > 0:
        engine.cache.evict(short)
    return engine.allocator.alloc(n)


def adopt(engine: Engine, tokens: Sequence[int], hashes: Sequence[int], local: int, page_ids: Sequence[int]) -> int:
    """Loaded pages [local, local + len(page_ids)) of runner.kv -> the model and the prefix cache. Returns how many it now serves from them;
    0 when the local prefix they continue was evicted meanwhile (the pages are then just freed)."""
    P = engine.page_size
    cache = engine.cache
    n = local + len(page_ids)
    cached = 0
    engine.import_pages(page_ids)  # runner.kv -> the model's pool(s) before a step reads them (tp > 1: the ranks')
    if page_ids and cache.enabled:
        m = cache.match(tokens[: local * P], hashes[:local]) if local else None
        if m is None or m.num_pages == local:
            prefix = list(m.page_ids) if m is not None else []
            res = cache.insert(tokens[: n * P], prefix + list(page_ids), hashes[:n])
            cached = sum(1 for i, p in enumerate(page_ids) if res.page_ids[local + i] == p)
    if page_ids:
        engine.allocator.decref(page_ids)  # the cache took its own reference on the pages it kept
    return cached


def quarantine(engine: Engine, page_ids: Sequence[int], seconds: float) -> None:
    if page_ids:
        engine.scheduler.handoff.quarantine(list(page_ids), seconds)


def free(engine: Engine, page_ids: Sequence[int]) -> None:
    if page_ids:
        engine.allocator.decref(page_ids)


def pin(engine: Engine, tokens: Sequence[int], hashes: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Lock the cached leading pages of tokens against eviction while they are stored, their KV in runner.kv:
    (hashes, page ids)."""
    n = len(hashes)
    m = engine.cache.match(tokens[: n * engine.page_size], hashes)
    if m.num_pages:
        engine.cache.lock(m.hashes)
        engine.export_pages(m.page_ids)  # the store reads runner.kv: the ranks' heads gathered at tp > 1
    return m.hashes, m.page_ids


def unpin(engine: Engine, hashes: Sequence[int]) -> None:
    if hashes:
        engine.cache.unlock(hashes)
