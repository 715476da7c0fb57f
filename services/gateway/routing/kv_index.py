"""Which KV pages each instance's prefix cache holds, by chained block hash, fed by the NATS KV events.

Routing asks one question: "how many leading pages of this prompt does instance X hold?" Block hashes are chained
(page i's hash covers every token up to the end of page i, shared.modelspec.block_hash), so a held page implies its
whole prefix was computed, and the answer is the length of the longest run of the prompt's hashes from the start
that the instance holds.

Consistency: events carry a sequence number per (instance, epoch). A gap (a message lost during a NATS outage)
means the index no longer knows what that instance evicted, so that instance's entries are dropped and the index
rebuilds from the following events: under-predicting overlap costs a little routing quality, over-predicting it
sends requests to an instance that no longer has the prefix. A newer epoch (restart, re-registration) starts from
scratch the same way; events of an older epoch are ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field

from shared.cluster.bus.kv_events import KVEventBatch, KVOpKind
from shared.modelspec.block_hash import MediaSpan, page_hashes

log = logging.getLogger(__name__)


@dataclass
class _InstanceIndex:
    epoch: int
    seq: int = 0  # last sequence number applied (0: none yet)
    page_size: int = 0
    hashes: set[int] = field(default_factory=set)
    tier: str = "device"  # "host" / "disk": a kvstore (its pages cost a transfer, not a forward pass)


@dataclass
class KVIndexStats:
    events: int = 0
    gaps: int = 0  # sequence gaps seen (each dropped one instance's entries)
    stale: int = 0  # events of an older epoch, or replays of an applied seq
    overflows: int = 0  # instances reset because they exceeded max_hashes_per_instance


class KVIndex:
    """Block hashes per instance. Not thread-safe: call from the event loop that receives the events."""

    def __init__(self, *, max_hashes_per_instance: int = 4_000_000) -> None:
        # A guard against an instance whose evictions never arrive (a publisher bug): ~8 bytes per hash would
        # otherwise grow without bound. 4M pages of 16 tokens is more KV than any instance holds.
        self.max_hashes_per_instance = max_hashes_per_instance
        self._by_instance: dict[str, _InstanceIndex] = {}
        self.stats = KVIndexStats()

    # ------------------------------------------------------------------ updates

    def apply(self, event: KVEventBatch) -> None:
        """Apply one KV event (from `pdrelay.<cluster>.kv.<instance>`), checking its epoch and sequence."""
        self.stats.events += 1
        iid = event.instance_id
        idx = self._by_instance.get(iid)
        if idx is None or event.epoch > idx.epoch:
            if idx is not None:
                log.info("KV index: %s moved to epoch %d (was %d); forgetting its pages", iid, event.epoch, idx.epoch)
            idx = self._by_instance[iid] = _InstanceIndex(epoch=event.epoch, page_size=event.page_size)
            # The first event we see of an epoch may not be seq 1 (we joined late): nothing to compare against.
            idx.seq = event.seq - 1
        elif event.epoch < idx.epoch or event.seq <= idx.seq:
            self.stats.stale += 1
            return
        if event.seq != idx.seq + 1:
            self.stats.gaps += 1
            log.warning(
                "KV index: %s skipped from seq %d to %d (epoch %d); dropping its %d pages until it republishes",
                iid,
                idx.seq,
                event.seq,
                event.epoch,
                len(idx.hashes),
            )
            idx.hashes.clear()
        idx.seq = event.seq
        idx.page_size = event.page_size
        idx.tier = event.tier
        for op in event.ops:
            if op.kind == KVOpKind.STORED:
                idx.hashes.update(op.block_hashes)
            elif op.kind == KVOpKind.EVICTED:
                idx.hashes.difference_update(op.block_hashes)
            elif op.kind == KVOpKind.CLEARED:
                idx.hashes.clear()
        if len(idx.hashes) > self.max_hashes_per_instance:
            self.stats.overflows += 1
            log.warning(
                "KV index: %s holds %d page hashes, over the limit of %d; forgetting them",
                iid,
                len(idx.hashes),
                self.max_hashes_per_instance,
            )
            idx.hashes.clear()

    def remove(self, instance_id: str) -> None:
        """The instance left the cluster: its cache is gone with it."""
        self._by_instance.pop(instance_id, None)

    def forget_older_than(self, instance_id: str, epoch: int) -> None:
        """Membership shows `instance_id` at `epoch`: entries of an older incarnation are worthless."""
        idx = self._by_instance.get(instance_id)
        if idx is not None and idx.epoch < epoch:
            self._by_instance[instance_id] = _InstanceIndex(epoch=epoch, page_size=idx.page_size)

    # ------------------------------------------------------------------ queries

    def overlap_pages(self, instance_id: str, prompt_hashes: Sequence[int]) -> int:
        """Leading pages of a prompt (given as its chained page hashes) the instance holds."""
        idx = self._by_instance.get(instance_id)
        if idx is None or not idx.hashes:
            return 0
        return leading_pages(prompt_hashes, idx.hashes)

    def store_overlap_pages(self, prompt_hashes: Sequence[int]) -> int:
        """Leading pages of a prompt the best-stocked kvstore holds (any instance publishing a non-device tier)."""
        best = 0
        for idx in self._by_instance.values():
            if idx.tier != "device" and idx.hashes:
                best = max(best, leading_pages(prompt_hashes, idx.hashes))
        return best

    def num_pages(self, instance_id: str) -> int:
        idx = self._by_instance.get(instance_id)
        return 0 if idx is None else len(idx.hashes)

    def instances(self) -> list[str]:
        return sorted(self._by_instance)


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
