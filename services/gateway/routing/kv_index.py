"""Which KV pages each instance's prefix cache holds, by chained block hash, fed by the NATS KV events and rebuilt
from the instances' snapshots.

Routing asks one question: "how many leading pages of this prompt does instance X hold?" Block hashes are chained
(page i's hash covers every token up to the end of page i, shared.modelspec.block_hash), so a held page implies its
whole prefix was computed, and the answer is the length of the longest run of the prompt's hashes from the start
that the instance holds. The pages live in one map for the cluster (kv_holders.py), so the answer for every
instance comes from one walk over the prompt's hashes.

Each instance's entry has a state:

    exact       the index has applied every event of the instance's current epoch, from seq 1 or from a snapshot
                at seq S and every event after it: what it says the instance holds, the instance holds
    degraded    events were missed (a sequence gap, a first event past seq 1: the gateway started late), or the
                index is full: its pages are a subset of the truth at best; routing ignores them (by load only)
                until a snapshot makes the entry exact again
    rebuilding  a snapshot was asked for: events are held back (bounded) until it lands, then those after its
                seq are applied; a gap between the snapshot and the first held event is caught like any gap

Under-predicting overlap costs a little routing quality; over-predicting it sends requests to an instance that no
longer has the prefix, which is why only exact entries earn routing credit. Events of an older epoch are ignored;
a newer epoch (restart, re-registration) starts the entry from scratch.

Memory: the map holds at most `max_entries` (hash, instance) entries (KV_INDEX_MAX_ENTRIES, about 60-90 bytes each,
see bench/RESULTS.md); past it an instance's new pages are dropped and its entry turns degraded ("index full").
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field

from services.gateway.routing.kv_holders import HolderMap
from shared.cluster.bus.kv_events import KVEventBatch, KVOpKind
from shared.cluster.bus.kv_snapshot import KVSnapshot
from shared.modelspec.block_hash import MediaSpan, page_hashes

log = logging.getLogger(__name__)

KV_INDEX_MAX_ENTRIES = 8_000_000  # (hash, instance) entries: ~0.6 GB at most
MAX_BUFFERED_EVENTS = 4096  # per rebuilding instance; past it the rebuild ends in a gap and is tried again
# A load report says an instance published up to seq N and the index is still behind N this long after: the events
# after the index's seq were lost, the last of them included (no later event revealed the gap).
TAIL_GRACE_S = 1.0


class IndexState(enum.StrEnum):
    EXACT = "exact"
    DEGRADED = "degraded"
    REBUILDING = "rebuilding"


class Reason(enum.StrEnum):
    """Why an entry is not exact."""

    NONE = ""
    JOINED_LATE = "joined_late"  # the first event seen of the epoch was past seq 1
    GAP = "gap"  # a sequence gap
    TAIL = "tail"  # the instance reported a seq the index never received
    FULL = "full"  # the index reached max_entries
    OVER_LIMIT = "over_limit"  # the instance alone passed max_hashes_per_instance
    NO_SNAPSHOT = "no_snapshot"  # a snapshot was asked for and did not come
    SNAPSHOT = "snapshot"  # waiting for one (rebuilding)


@dataclass(slots=True)
class _Entry:
    iid: str
    code: int
    epoch: int
    seq: int = 0  # last sequence number applied (0: none yet)
    page_size: int = 0
    tier: str = "device"  # "host" / "disk": a kvstore (its pages cost a transfer, not a forward pass)
    state: IndexState = IndexState.EXACT
    reason: Reason = Reason.NONE
    since: float = 0.0  # monotonic time the state was entered
    buffer: list[KVEventBatch] | None = None  # rebuilding: events held until the snapshot lands
    behind: tuple[int, float] | None = None  # (seq the instance reported, when) while the index has not reached it


@dataclass
class KVIndexStats:
    events: int = 0
    gaps: int = 0  # sequence gaps seen (each made one instance's entry degraded)
    stale: int = 0  # events of an older epoch, or replays of an applied seq
    overflows: int = 0  # instances reset because they exceeded max_hashes_per_instance
    full: int = 0  # times an instance's new pages were dropped because the index was full
    snapshots: int = 0  # snapshots applied
    snapshot_failures: int = 0


@dataclass(frozen=True)
class EntryView:
    """One instance's entry, for /metrics and `pdrelay status`."""

    instance_id: str
    state: IndexState
    reason: str
    epoch: int
    seq: int
    pages: int
    tier: str


@dataclass(frozen=True)
class Overlaps:
    """One prompt's overlap at one page size: leading pages per exact instance, and the best kvstore's."""

    pages: dict[str, int] = field(default_factory=dict)  # most pages first
    store_pages: int = 0


class KVIndex:
    """Block hashes per instance. Not thread-safe: call from the event loop that receives the events."""

    def __init__(
        self,
        *,
        max_hashes_per_instance: int = 4_000_000,
        max_entries: int = KV_INDEX_MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # A guard against an instance whose evictions never arrive (a publisher bug). 4M pages of 16 tokens is more
        # KV than any instance holds.
        self.max_hashes_per_instance = max_hashes_per_instance
        self.max_entries = max_entries
        self.clock = clock
        self._by_instance: dict[str, _Entry] = {}
        self._owner: dict[int, str] = {}  # live code -> instance id
        self._store_codes: set[int] = set()  # codes of non-device tiers (kvstores)
        self.holders = HolderMap()
        self.stats = KVIndexStats()
        self._full_logged_at = -1e9

    # ------------------------------------------------------------------ entries

    def _fresh(self, iid: str, epoch: int, page_size: int, tier: str, state: IndexState, reason: Reason) -> _Entry:
        """A new, empty entry for `iid` (its previous pages, if any, are dropped)."""
        old = self._by_instance.get(iid)
        if old is not None:
            self._drop_code(old.code)
        e = _Entry(iid, self.holders.new_code(), epoch, 0, page_size, tier, state, reason, self.clock())
        self._owner[e.code] = iid
        if tier != "device":
            self._store_codes.add(e.code)
        self._by_instance[iid] = e
        return e

    def _drop_code(self, code: int) -> None:
        self.holders.retire(code)
        self._owner.pop(code, None)
        self._store_codes.discard(code)

    def _set_state(self, e: _Entry, state: IndexState, reason: Reason = Reason.NONE) -> None:
        if e.state != state:
            e.since = self.clock()
        e.state, e.reason = state, reason

    def _clear(self, e: _Entry) -> None:
        """Drop the entry's pages, keeping its place (epoch, seq, state)."""
        self._drop_code(e.code)
        e.code = self.holders.new_code()
        self._owner[e.code] = e.iid
        if e.tier != "device":
            self._store_codes.add(e.code)

    # ------------------------------------------------------------------ events

    def apply(self, event: KVEventBatch) -> None:
        """Apply one KV event (from `pdrelay.<cluster>.kv.<instance>`), checking its epoch and sequence."""
        self.stats.events += 1
        e = self._by_instance.get(event.instance_id)
        if e is not None and e.state == IndexState.REBUILDING:
            self._hold(e, event)
            return
        self._apply(event.instance_id, e, event)

    def _hold(self, e: _Entry, event: KVEventBatch) -> None:
        assert e.buffer is not None
        e.buffer.append(event)
        if len(e.buffer) >= MAX_BUFFERED_EVENTS:  # the snapshot is too slow: give up on it, try again later
            log.warning("KV index: %s sent %d events while its snapshot was awaited", e.iid, len(e.buffer))
            self._end_rebuild(e.iid, Reason.NO_SNAPSHOT)

    def _apply(self, iid: str, e: _Entry | None, event: KVEventBatch) -> None:
        if e is None or event.epoch > e.epoch:
            if e is not None:
                log.info("KV index: %s moved to epoch %d (was %d); forgetting its pages", iid, event.epoch, e.epoch)
            # The first event seen of an epoch: exact only if it is the epoch's first (we joined late otherwise).
            late = event.seq != 1
            e = self._fresh(
                iid,
                event.epoch,
                event.page_size,
                event.tier,
                IndexState.DEGRADED if late else IndexState.EXACT,
                Reason.JOINED_LATE if late else Reason.NONE,
            )
            e.seq = event.seq - 1
        elif event.epoch < e.epoch or event.seq <= e.seq:
            self.stats.stale += 1
            return
        if event.seq != e.seq + 1:
            self.stats.gaps += 1
            log.warning(
                "KV index: %s skipped from seq %d to %d (epoch %d); its %d pages are no longer trusted",
                iid,
                e.seq,
                event.seq,
                event.epoch,
                self.holders.count(e.code),
            )
            self._clear(e)
            self._set_state(e, IndexState.DEGRADED, Reason.GAP)
        e.seq = event.seq
        e.page_size = event.page_size
        if event.tier != e.tier:
            e.tier = event.tier
            (self._store_codes.add if e.tier != "device" else self._store_codes.discard)(e.code)
        for op in event.ops:
            if op.kind == KVOpKind.STORED:
                self._store(iid, e, op.block_hashes)
            elif op.kind == KVOpKind.EVICTED:
                self.holders.discard(e.code, op.block_hashes)
            elif op.kind == KVOpKind.CLEARED:
                self._clear(e)

    def _store(self, iid: str, e: _Entry, hashes: Iterable[int]) -> None:
        h = self.holders
        room = self.max_entries - h.refs
        if room < 1 << 20 and h.maybe_compact():
            room = self.max_entries - h.refs
        refused = h.add(e.code, hashes, room=max(0, room))
        if refused:
            self.stats.full += 1
            now = self.clock()
            if e.reason != Reason.FULL and now - self._full_logged_at >= 60.0:  # at most once a minute
                self._full_logged_at = now
                log.warning(
                    "KV index: full (%d entries, max %d); new pages of %s (and of others, from now) are dropped "
                    "and those instances are routed by load",
                    h.refs,
                    self.max_entries,
                    iid,
                )
            self._set_state(e, IndexState.DEGRADED, Reason.FULL)
        if h.count(e.code) > self.max_hashes_per_instance:
            self.stats.overflows += 1
            log.warning(
                "KV index: %s holds %d page hashes, over the limit of %d; forgetting them",
                iid,
                h.count(e.code),
                self.max_hashes_per_instance,
            )
            self._clear(e)
            self._set_state(e, IndexState.DEGRADED, Reason.OVER_LIMIT)

    def note_published(self, instance_id: str, epoch: int, seq: int) -> None:
        """The instance reports (in its load report) that it published events up to `seq` of `epoch`. An exact
        entry that stays behind that for TAIL_GRACE_S lost them: a gap at the tail."""
        e = self._by_instance.get(instance_id)
        if e is None or e.state != IndexState.EXACT or epoch != e.epoch:
            return
        now = self.clock()
        if e.behind is not None and e.seq >= e.behind[0]:
            e.behind = None
        if e.behind is None:
            if seq > e.seq:
                e.behind = (seq, now)
            return
        if now - e.behind[1] >= TAIL_GRACE_S:
            self.stats.gaps += 1
            log.warning(
                "KV index: %s published up to seq %d (epoch %d) but the index stopped at %d; its pages are no "
                "longer trusted",
                instance_id,
                e.behind[0],
                epoch,
                e.seq,
            )
            e.behind = None
            self._clear(e)
            self._set_state(e, IndexState.DEGRADED, Reason.TAIL)

    # ------------------------------------------------------------------ rebuilding from snapshots

    def begin_rebuild(self, instance_id: str) -> bool:
        """Hold the instance's events until its snapshot lands. False when its entry is exact already (nothing to
        rebuild), or a rebuild is under way."""
        e = self._by_instance.get(instance_id)
        if e is None:
            e = self._fresh(instance_id, 0, 0, "device", IndexState.REBUILDING, Reason.SNAPSHOT)
        elif e.state != IndexState.DEGRADED:
            return False
        self._set_state(e, IndexState.REBUILDING, Reason.SNAPSHOT)
        e.buffer = []
        return True

    def load_snapshot(self, snap: KVSnapshot) -> IndexState:
        """The instance's pages as of (epoch, seq), then the events held since: the entry is exact unless one was
        missed. Returns the entry's state."""
        e = self._by_instance.get(snap.instance_id)
        if e is None or e.state != IndexState.REBUILDING:
            return e.state if e is not None else IndexState.DEGRADED  # it left, or the rebuild was given up
        held = e.buffer or []
        if snap.epoch < e.epoch:
            # The instance moved on since the snapshot was taken: the held events decide.
            return self._end_rebuild(snap.instance_id, Reason.NO_SNAPSHOT)
        self.stats.snapshots += 1
        e = self._fresh(snap.instance_id, snap.epoch, snap.page_size, snap.tier, IndexState.EXACT, Reason.NONE)
        e.seq = snap.seq
        self._store(snap.instance_id, e, snap.hashes)
        for ev in sorted(held, key=lambda x: (x.epoch, x.seq)):
            self._apply(snap.instance_id, e, ev)
            e = self._by_instance[snap.instance_id]
        return e.state

    def rebuild_failed(self, instance_id: str) -> None:
        """No snapshot came: back to degraded, with the held events applied as they would have been."""
        self.stats.snapshot_failures += 1
        self._end_rebuild(instance_id, Reason.NO_SNAPSHOT)

    def _end_rebuild(self, iid: str, reason: Reason) -> IndexState:
        e = self._by_instance.get(iid)
        if e is None or e.state != IndexState.REBUILDING:
            return e.state if e is not None else IndexState.DEGRADED
        held, e.buffer = e.buffer or [], None
        self._set_state(e, IndexState.DEGRADED, reason)
        for ev in sorted(held, key=lambda x: (x.epoch, x.seq)):
            self._apply(iid, self._by_instance.get(iid), ev)
        return self._by_instance[iid].state

    # ------------------------------------------------------------------ membership

    def remove(self, instance_id: str) -> None:
        """The instance left the cluster: its cache is gone with it."""
        e = self._by_instance.pop(instance_id, None)
        if e is not None:
            self._drop_code(e.code)

    def forget_older_than(self, instance_id: str, epoch: int) -> None:
        """Membership shows `instance_id` at `epoch`: entries of an older incarnation are worthless. The new
        incarnation starts empty and publishes from seq 1, so its entry is exact from here."""
        e = self._by_instance.get(instance_id)
        if e is not None and e.epoch < epoch:
            self._fresh(instance_id, epoch, e.page_size, e.tier, IndexState.EXACT, Reason.NONE)

    # ------------------------------------------------------------------ queries

    def overlaps(self, prompt_hashes: Sequence[int]) -> Overlaps:
        """Leading pages of a prompt held by each exact instance, and by the best-stocked exact kvstore."""
        by_code = self.holders.overlaps(prompt_hashes)
        pages: dict[str, int] = {}
        store = 0
        for code, n in reversed(by_code.items()):  # HolderMap.overlaps lists the deepest last
            iid = self._owner.get(code)
            if iid is None:
                continue
            e = self._by_instance[iid]
            if e.state != IndexState.EXACT:
                continue
            if code in self._store_codes:
                store = max(store, n)
            else:
                pages[iid] = n
        return Overlaps(pages, store)

    def overlap_pages(self, instance_id: str, prompt_hashes: Sequence[int]) -> int:
        """Leading pages of a prompt (given as its chained page hashes) the instance holds, whatever its state."""
        e = self._by_instance.get(instance_id)
        if e is None:
            return 0
        n = 0
        for h in prompt_hashes:
            if not self.holders.holds(e.code, h):
                break
            n += 1
        return n

    def hashes(self, instance_id: str) -> set[int]:
        """The hashes held for the instance (a walk of the whole index: tests and debugging)."""
        e = self._by_instance.get(instance_id)
        return set() if e is None else self.holders.hashes_of(e.code)

    def seq(self, instance_id: str) -> int:
        e = self._by_instance.get(instance_id)
        return 0 if e is None else e.seq

    def store_overlap_pages(self, prompt_hashes: Sequence[int]) -> int:
        """Leading pages of a prompt the best-stocked kvstore holds (any instance publishing a non-device tier)."""
        by_code = self.holders.overlaps(prompt_hashes)
        return max((n for c, n in by_code.items() if c in self._store_codes), default=0)

    def num_pages(self, instance_id: str) -> int:
        e = self._by_instance.get(instance_id)
        return 0 if e is None else self.holders.count(e.code)

    def state(self, instance_id: str) -> IndexState | None:
        e = self._by_instance.get(instance_id)
        return None if e is None else e.state

    def exact(self, instance_id: str) -> bool:
        e = self._by_instance.get(instance_id)
        return e is not None and e.state == IndexState.EXACT

    def needing_snapshot(self) -> list[str]:
        """Degraded entries a snapshot would make exact (a full index is not fixed by one)."""
        return sorted(
            iid for iid, e in self._by_instance.items() if e.state == IndexState.DEGRADED and e.reason != Reason.FULL
        )

    def entries(self) -> list[EntryView]:
        return [
            EntryView(iid, e.state, str(e.reason), e.epoch, e.seq, self.holders.count(e.code), e.tier)
            for iid, e in sorted(self._by_instance.items())
        ]

    def instances(self) -> list[str]:
        return sorted(self._by_instance)

    def approx_bytes(self) -> int:
        return self.holders.approx_bytes()


def leading_pages(prompt_hashes: Sequence[int], held: Container[int]) -> int:
    """How many of the prompt's pages, from the first, are in `held` (chained hashes: a gap ends the prefix)."""
    n = 0
    for h in prompt_hashes:
        if h not in held:
            break
        n += 1
    return n


class PromptHashes:
    """The chained page hashes of one prompt, computed once per page size (instances may differ)."""

    __slots__ = ("_tokens", "_media", "_by_page_size")

    def __init__(self, prompt_token_ids: Sequence[int], media: Sequence[MediaSpan] = ()) -> None:
        self._tokens = prompt_token_ids
        self._media = media  # images keep their pages apart, as in the engines' own hashes
        self._by_page_size: dict[int, list[int]] = {}

    def for_page_size(self, page_size: int) -> list[int]:
        hashes = self._by_page_size.get(page_size)
        if hashes is None:
            hashes = self._by_page_size[page_size] = (
                page_hashes(self._tokens, page_size, media=self._media) if page_size > 0 else []
            )
        return hashes

    def page_sizes(self) -> Iterable[int]:
        return self._by_page_size.keys()
