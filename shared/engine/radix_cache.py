"""Prefix cache over full KV pages, keyed by chained page hashes (see block_hash.py).

Each cached page is a node whose key is its chained hash, so a node stands for the whole token prefix up to the
end of its page and the nodes form a tree (a radix tree with one page per edge). The cache owns one allocator
reference per node. Requests `lock` the nodes they attend over (always a whole path from the root, so a locked
node's ancestors are locked too); only unlocked leaves are evicted, least recently used first, which returns
their pages to the allocator. Every store and eviction is reported through `on_event` as a typed event, so the
control plane can publish them and the gateway can keep a KV index (routing by prefix overlap).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from shared.engine.page_allocator import PageAllocator
from shared.modelspec.block_hash import ROOT_HASH, page_hash


class PagesStored(msgspec.Struct, frozen=True, tag=True):
    """Pages entered the cache. hashes are chained in order; parent_hash is the page before hashes[0]
    (None: hashes[0] is a first page). token_ids: the tokens of those pages, concatenated."""

    hashes: tuple[int, ...]
    parent_hash: int | None
    page_size: int
    token_ids: tuple[int, ...] = ()


class PagesEvicted(msgspec.Struct, frozen=True, tag=True):
    """Pages left the cache (their KV is gone)."""

    hashes: tuple[int, ...]


class AllPagesCleared(msgspec.Struct, frozen=True, tag=True):
    """The cache dropped everything (reset); indexes should forget this instance's pages."""


KVEvent = PagesStored | PagesEvicted | AllPagesCleared


@dataclass(frozen=True)
class MatchResult:
    """The longest cached prefix of a token sequence: page_ids[i] holds tokens [i*P, (i+1)*P)."""

    page_ids: tuple[int, ...] = ()
    hashes: tuple[int, ...] = ()

    @property
    def num_pages(self) -> int:
        return len(self.page_ids)

    def num_tokens(self, page_size: int) -> int:
        return len(self.page_ids) * page_size


@dataclass(frozen=True)
class InsertResult:
    """Outcome of an insert: hashes of all pages of the path; page_ids: the page the cache holds for each
    (equal to the caller's page unless the cache already had that prefix); num_new: nodes created."""

    hashes: tuple[int, ...]
    page_ids: tuple[int, ...]
    num_new: int


class _Node:
    __slots__ = ("hash", "parent", "page_id", "tokens", "lock_ref", "num_children", "last_access")

    def __init__(self, h: int, parent: _Node | None, page_id: int, tokens: tuple[int, ...], tick: int) -> None:
        self.hash = h
        self.parent = parent
        self.page_id = page_id
        self.tokens = tokens  # kept to rule out a (2^-64) hash collision serving the wrong KV
        self.lock_ref = 0
        self.num_children = 0
        self.last_access = tick


class RadixCache:
    """Page-granular prefix cache. With enabled=False every match is empty and inserts store nothing."""

    def __init__(
        self,
        allocator: PageAllocator,
        page_size: int,
        *,
        enabled: bool = True,
        on_event: Callable[[KVEvent], None] | None = None,
    ) -> None:
        self.allocator = allocator
        self.page_size = page_size
        self.enabled = enabled
        self.on_event = on_event
        self._nodes: dict[int, _Node] = {}
        self._tick = 0
        self._num_unlocked = 0
        # LRU candidates (last_access, hash); entries go stale when a node is touched, locked or gains a child,
        # and are checked against the node when popped.
        self._heap: list[tuple[int, int]] = []

    # ---- queries ---------------------------------------------------------------------------------------------
    @property
    def num_pages(self) -> int:
        """Pages the cache holds."""
        return len(self._nodes)

    @property
    def num_evictable(self) -> int:
        """Pages eviction could free right now (every unlocked node: its descendants are unlocked too)."""
        return self._num_unlocked

    def page_ids(self) -> list[int]:
        """Every page the cache holds (tests and debug dumps)."""
        return [n.page_id for n in self._nodes.values()]

    def match(self, token_ids: Sequence[int], hashes: Sequence[int] | None = None) -> MatchResult:
        """Longest cached prefix of token_ids in whole pages. `hashes` (the chained page hashes of token_ids, if
        the caller has them) saves rehashing. Touches the matched pages for LRU."""
        if not self.enabled or not self._nodes:
            return MatchResult()
        P = self.page_size
        self._tick += 1
        pages: list[int] = []
        found: list[int] = []
        parent = ROOT_HASH
        for i in range(len(token_ids) // P):
            toks = tuple(token_ids[i * P : (i + 1) * P])
            h = hashes[i] if hashes is not None and i < len(hashes) else page_hash(parent, toks)
            node = self._nodes.get(h)
            if node is None or node.tokens != toks:
                break
            node.last_access = self._tick
            if node.num_children == 0 and node.lock_ref == 0:
                heapq.heappush(self._heap, (self._tick, h))
            pages.append(node.page_id)
            found.append(h)
            parent = h
        return MatchResult(tuple(pages), tuple(found))

    # ---- updates ---------------------------------------------------------------------------------------------
    def insert(
        self,
        token_ids: Sequence[int],
        page_ids: Sequence[int],
        hashes: Sequence[int] | None = None,
        *,
        start_page: int = 0,
    ) -> InsertResult:
        """Cache the first len(page_ids) full pages of token_ids; page_ids[i] holds page i's KV.

        Pages [0, start_page) must already be cached (the caller holds them locked); their hashes are taken from
        `hashes` (required when start_page > 0). Existing nodes keep their page; new nodes take a reference on
        the caller's page. Returns the hashes and cached page ids of pages [0, len(page_ids)).
        """
        P = self.page_size
        n = len(page_ids)
        assert len(token_ids) >= n * P, f"insert of {n} pages needs {n * P} tokens, got {len(token_ids)}"
        if not self.enabled:
            return InsertResult((), (), 0)
        assert start_page == 0 or (hashes is not None and len(hashes) >= start_page)
        out_hashes: list[int] = list(hashes[:start_page]) if start_page and hashes is not None else []
        out_pages: list[int] = [self._nodes[h].page_id for h in out_hashes]
        parent_node = self._nodes[out_hashes[-1]] if out_hashes else None
        self._tick += 1
        new_hashes: list[int] = []
        new_tokens: list[int] = []
        new_pages: list[int] = []
        first_parent: int | None = None
        for i in range(start_page, n):
            toks = tuple(token_ids[i * P : (i + 1) * P])
            parent_h = parent_node.hash if parent_node is not None else ROOT_HASH
            h = hashes[i] if hashes is not None and i < len(hashes) else page_hash(parent_h, toks)
            node = self._nodes.get(h)
            if node is None:
                node = _Node(h, parent_node, page_ids[i], toks, self._tick)
                self._nodes[h] = node
                self._num_unlocked += 1
                if parent_node is not None:
                    parent_node.num_children += 1
                heapq.heappush(self._heap, (self._tick, h))
                if not new_hashes:
                    first_parent = parent_node.hash if parent_node is not None else None
                elif new_hashes[-1] != parent_h:
                    self._emit_stored(new_hashes, first_parent, new_tokens)  # a run of new pages ended
                    new_hashes, new_tokens = [], []
                    first_parent = parent_node.hash if parent_node is not None else None
                new_hashes.append(h)
                new_tokens.extend(toks)
                new_pages.append(page_ids[i])
            else:
                assert node.tokens == toks, "64-bit page hash collision"
                node.last_access = self._tick
                if node.num_children == 0 and node.lock_ref == 0:
                    heapq.heappush(self._heap, (self._tick, h))
            out_hashes.append(h)
            out_pages.append(node.page_id)
            parent_node = node
        if new_pages:
            self.allocator.incref(new_pages)
            self._emit_stored(new_hashes, first_parent, new_tokens)
        return InsertResult(tuple(out_hashes), tuple(out_pages), len(new_pages))

    def lock(self, hashes: Sequence[int]) -> None:
        """Protect cached pages from eviction while a request attends over them (a path from the root)."""
        for h in hashes:
            node = self._nodes[h]
            if node.lock_ref == 0:
                self._num_unlocked -= 1
            node.lock_ref += 1

    def unlock(self, hashes: Sequence[int]) -> None:
        """Undo one lock() of the same hashes; pages become evictable when no request holds them."""
        self._tick += 1
        for h in hashes:
            node = self._nodes[h]
            assert node.lock_ref > 0, f"unlock of an unlocked page (hash {h:#x})"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._num_unlocked += 1
                node.last_access = self._tick
                if node.num_children == 0:
                    heapq.heappush(self._heap, (self._tick, h))

    def evict(self, num_pages: int) -> int:
        """Free up to num_pages unlocked pages, least recently used leaves first; returns how many were freed."""
        freed_ids: list[int] = []
        freed_hashes: list[int] = []
        while len(freed_ids) < num_pages and self._heap:
            tick, h = heapq.heappop(self._heap)
            node = self._nodes.get(h)
            if node is None or node.lock_ref or node.num_children or node.last_access != tick:
                continue  # stale entry
            del self._nodes[h]
            self._num_unlocked -= 1
            freed_ids.append(node.page_id)
            freed_hashes.append(h)
            parent = node.parent
            if parent is not None:
                parent.num_children -= 1
                if parent.num_children == 0 and parent.lock_ref == 0:
                    heapq.heappush(self._heap, (parent.last_access, parent.hash))
        if freed_ids:
            released = self.allocator.decref(freed_ids)
            assert len(released) == len(freed_ids), "an unlocked cached page was still referenced by a request"
            if self.on_event is not None:
                self.on_event(PagesEvicted(tuple(freed_hashes)))
        if len(self._heap) > 4 * len(self._nodes) + 64:
            self._rebuild_heap()
        return len(freed_ids)

    def reset(self) -> int:
        """Drop every unlocked page (e.g. after a weight reload); returns pages freed."""
        freed = self.evict(self._num_unlocked)
        if self.on_event is not None:
            self.on_event(AllPagesCleared())
        return freed

    # ---- internals -------------------------------------------------------------------------------------------
    def _emit_stored(self, hashes: list[int], parent: int | None, tokens: list[int]) -> None:
        if self.on_event is not None and hashes:
            self.on_event(PagesStored(tuple(hashes), parent, self.page_size, tuple(tokens)))

    def _rebuild_heap(self) -> None:
        self._heap = [(n.last_access, n.hash) for n in self._nodes.values() if n.lock_ref == 0 and n.num_children == 0]
        heapq.heapify(self._heap)

    def check_invariants(self) -> None:
        """Full consistency check (tests and debug dumps): child counts, lock paths, page references."""
        children: dict[int, int] = {}
        unlocked = 0
        for node in self._nodes.values():
            if node.parent is not None:
                assert self._nodes.get(node.parent.hash) is node.parent, "dangling parent"
                children[node.parent.hash] = children.get(node.parent.hash, 0) + 1
                assert node.parent.lock_ref >= node.lock_ref, "locked node under a less locked parent"
            assert self.allocator.refcount(node.page_id) >= 1, "cached page is free"
            unlocked += node.lock_ref == 0
        for node in self._nodes.values():
            assert node.num_children == children.get(node.hash, 0), "child count drift"
        assert unlocked == self._num_unlocked, "unlocked count drift"
