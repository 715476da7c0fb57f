"""The colocated worker: prefill and decode in one process, no KV hand-off. The baseline of every
disaggregation benchmark, and the simplest way to serve one machine."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from proto.pdrelay.v1 import worker_pb2_grpc
from shared.config.roles import Role
from shared.serving.decode_servicer import DecodeServicer
from shared.serving.engine_service import EngineService
from shared.serving.kvstore_attach import attach_kvstore
from shared.serving.kvstore_client import KVStoreClient


class WorkerService(EngineService):
    role = Role.WORKER
    kvstore: KVStoreClient | None = None

    def add_servicers(self, server: grpc.aio.Server) -> Sequence[str]:
        worker_pb2_grpc.add_DecodeServicer_to_server(DecodeServicer(self), server)
        return ("pdrelay.v1.Decode",)

    async def after_engine(self) -> None:
        self.kvstore = await attach_kvstore(self, None)  # its transfer engine is made once a store shows up

    async def on_stop(self) -> None:
        kv = self.kvstore
        if kv is not None:
            await kv.drain()
            await kv.close()
        await super().on_stop()
        if kv is not None and kv.transfer is not None:
            await kv.transfer.close()
