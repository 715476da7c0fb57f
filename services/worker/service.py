"""The colocated worker: prefill and decode in one process, no KV hand-off. The baseline of every
disaggregation benchmark, and the simplest way to serve one machine."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from proto.pdrelay.v1 import worker_pb2_grpc
from shared.serving.decode_servicer import DecodeServicer
from shared.serving.engine_service import EngineService


class WorkerService(EngineService):
    role = "worker"

    def add_servicers(self, server: grpc.aio.Server) -> Sequence[str]:
        worker_pb2_grpc.add_DecodeServicer_to_server(DecodeServicer(self), server)
        return ("pdrelay.v1.Decode",)
