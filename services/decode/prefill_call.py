"""One Prefill call of a hand-off, watched: given up on before its deadline when the prefill stops answering health
probes (liveness.py) or, once it said the prompt is computed (initial metadata), does not finish writing the pages
within --handoff-min-timeout-s. One cached channel per prefill address."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from proto.pdrelay.v1 import common_pb2, worker_pb2
from services.decode.liveness import PeerWatch, PrefillSilent
from shared.cluster.tls import TlsFiles, open_channel
from shared.serving.decode_servicer import HandoffFailed
from shared.serving.handoff import COMPUTED_KEY

PREFILL_METHOD = "/pdrelay.v1.Prefill/Prefill"


class PrefillCaller:
    def __init__(self, write_s: float) -> None:
        """write_s: how long the page write may take once the prefill said the prompt is computed."""
        self.write_s = write_s
        self.tls: TlsFiles | None = None  # the cluster's identity, once the service warmed up
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.watch = PeerWatch(self.channel)

    def channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = open_channel(address, self.tls)
        return ch

    async def call(
        self, address: str, target_id: str, ticket: worker_pb2.HandoffTicket, timeout_s: float
    ) -> worker_pb2.PrefillResponse:
        """The Prefill call's answer. Raises what the call raises, PrefillSilent when the prefill stopped answering
        probes, or HandoffFailed(TIMEOUT / UNAVAILABLE) when it was given up on or ended without an answer."""
        # Called as unary-stream (the same bytes on the wire as the unary Prefill): a unary call's initial metadata
        # only arrives with its response, a streaming call's as soon as the prefill sends it.
        call = self.channel(address).unary_stream(
            PREFILL_METHOD,
            request_serializer=worker_pb2.HandoffTicket.SerializeToString,
            response_deserializer=worker_pb2.PrefillResponse.FromString,
        )(ticket, timeout=timeout_s)
        loop = asyncio.get_running_loop()
        async with self.watch.watching(address) as dead:
            resp_task = asyncio.ensure_future(call.read())
            dead_task = asyncio.ensure_future(dead.wait())
            md_task = asyncio.ensure_future(call.initial_metadata())
            write_by: float | None = None
            try:
                while True:
                    waiting: set[asyncio.Future[Any]] = {resp_task, dead_task}
                    if write_by is None and not md_task.done():
                        waiting.add(md_task)
                    left = None if write_by is None else max(0.0, write_by - loop.time())
                    done, _ = await asyncio.wait(waiting, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                    if resp_task in done:
                        resp = resp_task.result()
                        if not isinstance(resp, worker_pb2.PrefillResponse):  # EOF without a response
                            raise HandoffFailed(
                                f"prefill {target_id} at {address} ended the call without an answer",
                                common_pb2.ERROR_CODE_UNAVAILABLE,
                            )
                        return resp
                    if dead_task in done:
                        raise PrefillSilent(f"prefill {target_id} at {address} stopped answering health probes")
                    if md_task in done:
                        md = md_task.result() if not md_task.exception() else None
                        if md and any(k == COMPUTED_KEY for k, _ in md):
                            write_by = loop.time() + self.write_s
                        continue
                    if not done:
                        raise HandoffFailed(
                            f"prefill {target_id} at {address} computed the prompt but did not "
                            f"write its pages within {self.write_s:.1f} s",
                            common_pb2.ERROR_CODE_TIMEOUT,
                        )
            finally:
                if not call.done():
                    call.cancel()
                for t in (resp_task, dead_task, md_task):
                    if not t.done():
                        t.cancel()
                    elif not t.cancelled():
                        t.exception()  # retrieved: a failed call is reported through resp_task or not at all

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
