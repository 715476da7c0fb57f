"""The KV hand-off protocol pieces both sides share: tickets, page descriptors, epochs and fencing.

A hand-off is a small transaction owned by decode: decode reserves pages and sends a ticket with a fresh epoch;
prefill writes the prompt KV into exactly those pages and answers with the first token and a checksum of what it
wrote; decode accepts the answer only for the epoch it is waiting for and only if its own checksum of the pages
agrees. A retry (another prefill instance, or the same one) gets a new epoch and new pages, so a late write of an
abandoned attempt can only land in quarantined pages, never in pages a request reads.
"""

from __future__ import annotations

import enum
import itertools
import time
from collections import OrderedDict
from dataclasses import dataclass

from proto.pdrelay.v1 import common_pb2, worker_pb2
from shared.modelspec.kv_layout import KVLayout
from shared.transfer.checksum import PageChecksum, runs_in_place
from shared.transfer.descs import PageDesc

# Remember this many request ids per prefill instance for fencing and idempotent replies.
_LEDGER_SIZE = 8192
# Initial metadata a prefill sends once the prompt is computed (only the page write remains): decode gives the rest
# of the hand-off a short deadline of its own (services/decode/liveness.py).
COMPUTED_KEY = "pdrelay-prefill-computed"
# How a side checks hand-offs, preferred first: both sides sum every page on the request's TTFT path. On the host,
# XXH3 does 45 MiB in ~2 ms where CRC-32 takes ~13 (bench/RESULTS.md); in device memory WORDSUM64 sums the pages
# where they are (a host hash would copy them out first).
_PREFERENCE = (PageChecksum.XXH3_64, PageChecksum.WORDSUM64, PageChecksum.CRC32)
HANDOFF_CHECKSUMS = _PREFERENCE  # a host pool's list


def handoff_checksums(device_type: str) -> tuple[PageChecksum, ...]:
    """What a side whose KV pool lives on `device_type` ("cpu", "cuda") sums hand-offs with, preferred first: the
    algorithms that run where its pages are, then those that need a host copy of them. Decided once, when the
    transfer engine is created; decode sends it in every ticket."""
    here = [a for a in _PREFERENCE if runs_in_place(a, device_type)]
    return tuple(here + [a for a in _PREFERENCE if a not in here])


def checksums_to_pb(
    algorithms: tuple[PageChecksum, ...] = HANDOFF_CHECKSUMS,
) -> list[worker_pb2.ChecksumAlgorithm]:
    return [worker_pb2.ChecksumAlgorithm.Value(f"CHECKSUM_ALGORITHM_{a.name}") for a in algorithms]


def choose_checksum(
    ticket: worker_pb2.HandoffTicket, mine: tuple[PageChecksum, ...] = HANDOFF_CHECKSUMS, device_type: str = "cpu"
) -> PageChecksum:
    """Prefill's side of the negotiation, when the ticket arrives (before any compute): of the algorithms decode
    offers (CRC-32 for a ticket without a list) that this side runs (`mine`), the first that runs where this side's
    pages are, else the first. ValueError naming both lists when there is none in common (the ticket is refused)."""
    offered = [a for a in ticket.checksums] or [PageChecksum.CRC32.value]
    common = [PageChecksum(a) for a in offered if a in {m.value for m in mine}]
    if not common:
        names = ", ".join(PageChecksum(a).name if a in set(PageChecksum) else f"#{a}" for a in offered)
        raise ValueError(
            f"decode offers page checksums {names} and none of them runs here ({', '.join(m.name for m in mine)}); "
            "run decode and prefill from the same pdrelay version"
        )
    return next((a for a in common if runs_in_place(a, device_type)), common[0])


class EpochClock:
    """Hand-off epochs of one decode instance: strictly increasing, also across its restarts, because the high
    bits are the instance's registration epoch (which etcd increases on every registration)."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def next(self, registration_epoch: int) -> int:
        return (registration_epoch << 32) | (next(self._counter) & 0xFFFFFFFF)


def paged_descriptors(
    base_address: int, page_bytes: int, page_ids: list[int] | tuple[int, ...], device_id: int = 0, on_gpu: bool = False
) -> common_pb2.PageDescriptors:
    return common_pb2.PageDescriptors(
        memory_kind=common_pb2.MEMORY_KIND_VRAM if on_gpu else common_pb2.MEMORY_KIND_DRAM,
        device_id=device_id,
        paged=common_pb2.PagedRegion(base_address=base_address, page_bytes=page_bytes, page_ids=list(page_ids)),
    )


def descs_from_pb(pages: common_pb2.PageDescriptors, layout: KVLayout) -> list[PageDesc]:
    """Destination descriptors of a ticket. Raises ValueError when they do not describe whole pages."""
    which = pages.WhichOneof("layout")
    if which == "paged":
        p = pages.paged
        if p.page_bytes != layout.page_bytes:
            raise ValueError(f"ticket pages are {p.page_bytes} bytes but the layout says {layout.page_bytes}")
        return [PageDesc(p.base_address + pid * p.page_bytes, p.page_bytes) for pid in p.page_ids]
    if which == "regions":
        r = pages.regions
        if len(r.addresses) != len(r.lengths):
            raise ValueError(f"ticket regions list {len(r.addresses)} addresses but {len(r.lengths)} lengths")
        bad = [n for n in r.lengths if n != layout.page_bytes]
        if bad:
            raise ValueError(
                f"ticket region of {bad[0]} bytes is not one whole page of {layout.page_bytes} bytes; "
                "send one region per page"
            )
        return [PageDesc(a, n) for a, n in zip(r.addresses, r.lengths, strict=True)]
    raise ValueError("ticket has no destination pages (neither paged nor regions)")


def pages_needed(num_prompt_tokens: int, page_size: int) -> int:
    return -(-num_prompt_tokens // page_size)


@dataclass
class _Entry:
    epoch: int
    response: worker_pb2.PrefillResponse | None = None
    at: float = 0.0
    failed: bool = False  # the attempt ended without an answer: the same epoch may run again


class Fence(enum.StrEnum):
    """What FencingLedger.check says about a ticket."""

    NEW = "new"  # run it
    REPLAY = "replay"  # the same epoch finished before: answer as then
    STALE = "stale"  # older than an epoch already seen: refuse
    BUSY = "busy"  # the same epoch is still running here


class FencingLedger:
    """Prefill side: the newest epoch seen per hand-off owner and request id ("<decode id>/<request id>"), and the
    answer given for it.

    A ticket older than the newest epoch seen is stale (its decode already moved on): refused, also when the newer
    attempt failed here (a late stale ticket could otherwise write into pages decode has reused since). The same
    epoch again (a network-level retry) gets the same answer without recomputing or rewriting anything, or runs
    again if its first run failed."""

    def __init__(self, size: int = _LEDGER_SIZE) -> None:
        self._size = size
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def check(self, request_id: str, epoch: int) -> tuple[Fence, worker_pb2.PrefillResponse | None]:
        """(NEW, None) | (REPLAY, response) | (STALE, None) | (BUSY, None) (same epoch still running)."""
        e = self._entries.get(request_id)
        if e is None or epoch > e.epoch:
            return Fence.NEW, None
        if epoch < e.epoch:
            return Fence.STALE, None
        if e.response is not None:
            return Fence.REPLAY, e.response
        return (Fence.NEW, None) if e.failed else (Fence.BUSY, None)

    def begin(self, request_id: str, epoch: int) -> None:
        self._entries[request_id] = _Entry(epoch, None, time.monotonic())
        self._entries.move_to_end(request_id)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def is_current(self, request_id: str, epoch: int) -> bool:
        e = self._entries.get(request_id)
        return e is not None and e.epoch == epoch

    def finish(self, request_id: str, epoch: int, response: worker_pb2.PrefillResponse | None) -> None:
        e = self._entries.get(request_id)
        if e is not None and e.epoch == epoch:
            if response is None:
                e.failed = True  # keep the epoch as the fence; a retry with the same epoch may run again
            else:
                e.response = response


def accept_response(resp: worker_pb2.PrefillResponse, request_id: str, epoch: int) -> str | None:
    """Decode side: why an answer must be refused (None: it belongs to the hand-off we are waiting for)."""
    if resp.request_id != request_id:
        return f"answer is for request {resp.request_id!r}, not {request_id!r}"
    if resp.epoch != epoch:
        return f"answer has epoch {resp.epoch} but hand-off epoch {epoch} is current (stale answer refused)"
    return None
