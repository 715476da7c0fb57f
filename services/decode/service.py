"""The decode service: admits requests, gets their prompt KV from prefill instances (or computes short prompts
itself), and streams tokens from its continuous batch."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc
import msgspec

from proto.pdrelay.v1 import worker_pb2_grpc
from services.decode.admission import AdmissionQueue
from services.decode.remote_prefill import RemotePrefillClient
from shared.cluster.bus.load import LoadSnapshot
from shared.cluster.membership import Membership
from shared.config.roles import Role
from shared.service.faults import Faults
from shared.serving.decode_servicer import DecodeServicer
from shared.serving.engine_service import EngineService
from shared.serving.kv_transfer import KVTransfer, transfer_options
from shared.serving.kvstore_attach import attach_kvstore
from shared.serving.kvstore_client import KVStoreClient


class DecodeService(EngineService):
    role = Role.DECODE

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.transfer: KVTransfer | None = None
        self.kvstore: KVStoreClient | None = None
        self.prefills: Membership | None = None
        self.faults = Faults(self.cfg.disagg.fault_injection, self.instance_id)
        sched = self.cfg.scheduler
        self.remote = RemotePrefillClient(
            instance_id=self.instance_id,
            disagg=self.cfg.disagg,
            telemetry=self.telemetry,
            faults=self.faults,
            admission=AdmissionQueue(sched.max_queued_requests, max_wait_s=sched.max_queue_wait_s),
        )

    def add_servicers(self, server: grpc.aio.Server) -> Sequence[str]:
        worker_pb2_grpc.add_DecodeServicer_to_server(DecodeServicer(self, self.remote), server)
        return ("pdrelay.v1.Decode",)

    async def after_engine(self) -> None:
        assert self.engine is not None and self.etcd is not None
        t = self.cfg.transfer
        self.transfer = await asyncio.to_thread(
            KVTransfer,
            t.transfer_backend,
            self.instance_id,
            t.transfer_host,
            self.engine.runner.kv,
            transfer_options(t),
        )
        self.transfer.start_progress()
        self.kvstore = await attach_kvstore(self, self.transfer)
        self.prefills = Membership(self.etcd, self.cluster, "prefill")
        await self.prefills.start()
        assert self.aengine is not None
        self.remote.attach(
            aengine=self.aengine,
            transfer=self.transfer,
            prefills=self.prefills,
            tls=self.tls,
            instance_epoch=lambda: self.epoch,
        )

    def load_snapshot(self) -> LoadSnapshot | None:
        snap = super().load_snapshot()
        waiting = self.remote.admission.waiting  # hand-offs waiting for a slot count as queued, as in the engine
        return msgspec.structs.replace(snap, queued=snap.queued + waiting) if snap is not None and waiting else snap

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["transfer_backend"] = self.cfg.transfer.transfer_backend
        return d

    async def on_stop(self) -> None:
        if self.kvstore is not None:
            await self.kvstore.drain()
            await self.kvstore.close()
        await super().on_stop()
        await self.remote.close()
        if self.prefills is not None:
            await self.prefills.close()
        if self.transfer is not None:
            await self.transfer.close()
