"""The test process as a decode instance, to send Prefill tickets a real decode never would (replayed, stale,
malformed, with another layout) straight to a prefill process.

It owns a KV pool of the same tiny model registered with a transfer engine, progressed from the test's event
loop exactly as the decode service does it (KVTransfer.start_progress), so a prefill can really write into it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from proto.pdrelay.v1 import worker_pb2, worker_pb2_grpc
from shared.cluster.sampling_pb import sampling_to_pb
from shared.engine.model_runner import ModelRunner
from shared.modelspec.sampling import SamplingParams
from shared.serving.convert import layout_to_pb
from shared.serving.handoff import checksums_to_pb
from shared.serving.kv_transfer import KVTransfer
from shared.transfer.checksum import PageChecksum

PAGE = 16  # the services' default --page-size


class LocalDecode:
    def __init__(self, model_dir: str | Path, backend: str, name: str) -> None:
        self.runner = ModelRunner(model_dir, num_pages=32, page_size=PAGE)
        self.transfer = KVTransfer(backend, name, "127.0.0.1", self.runner.kv)
        self.transfer.start_progress()  # needs the running event loop: build it inside the test
        self.name = name

    def ticket(
        self, request_id: str, epoch: int, prompt: list[int], page_ids: list[int], *, max_tokens: int = 4, **fields: Any
    ) -> worker_pb2.HandoffTicket:
        """A well-formed ticket for `prompt` into our pages `page_ids`; keyword fields override any part."""
        t = worker_pb2.HandoffTicket(
            request_id=request_id,
            epoch=epoch,
            decode_instance_id=self.name,
            decode_instance_epoch=1,
            decode_peer=self.transfer.peer_pb(),
            pages=self.transfer.descriptors(page_ids),
            layout=layout_to_pb(self.runner.layout),
            prompt_token_ids=prompt,
            skip_tokens=0,
            sampling=sampling_to_pb(SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)),
            deadline_s=20.0,
            checksums=checksums_to_pb(),
        )
        for k, v in fields.items():
            if hasattr(v, "CopyFrom"):
                getattr(t, k).CopyFrom(v)
            elif isinstance(v, list):
                t.ClearField(k)
                getattr(t, k).extend(v)
            else:
                setattr(t, k, v)
        return t

    def checksum(self, page_ids: list[int]) -> int:
        """With the algorithm prefill sums a hand-off's pages with (the tickets here name XXH3 first)."""
        return self.transfer.checksum(page_ids, PageChecksum.XXH3_64)

    def zero(self, page_ids: list[int]) -> None:
        self.runner.kv.buffer[page_ids] = 0

    async def close(self) -> None:
        await self.transfer.close()


async def send(address: str, ticket: worker_pb2.HandoffTicket, timeout_s: float = 30.0) -> worker_pb2.PrefillResponse:
    async with grpc.aio.insecure_channel(address) as ch:
        return await worker_pb2_grpc.PrefillStub(ch).Prefill(ticket, timeout=timeout_s)
