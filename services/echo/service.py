"""`echo`: a tiny service with the real lifecycle, for control-plane tests, `pdrelay up --echo N` and benchmarks.

It speaks the real protos: Decode.Generate streams the prompt's token ids back one message per token (after
--token-delay-s each), Gateway.Tokenize returns the UTF-8 bytes of the text as token ids. No model, no engine.

    python -m services.echo --etcd-endpoints http://127.0.0.1:2379 --nats-url nats://127.0.0.1:4222
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from proto.pdrelay.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, worker_pb2, worker_pb2_grpc
from shared.cluster.bus.load import LoadSnapshot
from shared.config.groups import BusConfig, DiscoveryConfig, GrpcConfig
from shared.service import (
    Service,
    ServiceConfig,
    ServiceOptions,
    add_lifecycle_args,
    options_from_namespace,
    run_service,
)

ECHO_MODEL = "echo"


class EchoService(Service):
    role = "echo"

    def __init__(
        self,
        config: ServiceConfig,
        options: ServiceOptions = ServiceOptions(),
        *,
        token_delay_s: float = 0.0,
        warmup_s: float = 0.0,
    ) -> None:
        super().__init__(config, options)
        self.token_delay_s = token_delay_s
        self.warmup_s = warmup_s
        self.tokens_out = 0

    def add_servicers(self, server: grpc.aio.Server) -> Sequence[str]:
        worker_pb2_grpc.add_DecodeServicer_to_server(_EchoDecode(self), server)
        gateway_pb2_grpc.add_GatewayServicer_to_server(_EchoGateway(self), server)
        return ("pdrelay.v1.Decode", "pdrelay.v1.Gateway")

    async def warm_up(self) -> None:
        await asyncio.sleep(self.warmup_s)

    def describe(self) -> dict[str, Any]:
        return {"model": ECHO_MODEL}

    def load_snapshot(self) -> LoadSnapshot:
        return LoadSnapshot(running=self.gate.inflight)


class _EchoDecode(worker_pb2_grpc.DecodeServicer):
    def __init__(self, svc: EchoService) -> None:
        self.svc = svc

    async def Generate(
        self, request: worker_pb2.DecodeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.DecodeResponse]:
        tokens = list(request.prompt_token_ids)
        if request.sampling.HasField("max_tokens"):
            tokens = tokens[: request.sampling.max_tokens]
        for tok in tokens:
            if self.svc.token_delay_s:
                await asyncio.sleep(self.svc.token_delay_s)
            self.svc.tokens_out += 1
            yield worker_pb2.DecodeResponse(request_id=request.request_id, token_ids=[tok])
        reason = (
            common_pb2.FINISH_REASON_LENGTH
            if len(tokens) < len(request.prompt_token_ids)
            else common_pb2.FINISH_REASON_STOP
        )
        yield worker_pb2.DecodeResponse(
            request_id=request.request_id,
            finish_reason=reason,
            usage=common_pb2.Usage(prompt_tokens=len(request.prompt_token_ids), completion_tokens=len(tokens)),
        )


class _EchoGateway(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, svc: EchoService) -> None:
        self.svc = svc

    async def Tokenize(
        self, request: gateway_pb2.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.TokenizeResponse:
        return gateway_pb2.TokenizeResponse(token_ids=list(request.text.encode()), max_model_len=1 << 16)

    async def ListModels(
        self, request: gateway_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.ListModelsResponse:
        return gateway_pb2.ListModelsResponse(models=[gateway_pb2.ModelCard(id=ECHO_MODEL, owned_by="pdrelay")])


def build_parser() -> argparse.ArgumentParser:
    d, b, g = DiscoveryConfig(), BusConfig(), GrpcConfig()
    p = argparse.ArgumentParser(prog="python -m services.echo", description=__doc__.splitlines()[0])
    p.add_argument("--etcd-endpoints", "--etcd", nargs="+", default=list(d.etcd_endpoints))
    p.add_argument("--cluster", default=d.cluster)
    p.add_argument("--instance-id", default=None)
    p.add_argument("--lease-ttl-s", type=int, default=d.lease_ttl_s)
    p.add_argument("--nats-url", "--nats", default=b.nats_url)
    p.add_argument("--load-report-interval-s", type=float, default=b.load_report_interval_s)
    p.add_argument("--bus-outage-policy", choices=("buffer", "drop"), default=b.bus_outage_policy)
    p.add_argument("--admin-secret-file", default=None, help="refuse drain commands not signed with this secret")
    p.add_argument("--host", default=g.host)
    p.add_argument("--grpc-port", type=int, default=g.grpc_port)
    p.add_argument("--token-delay-s", type=float, default=0.0, help="sleep before each streamed token")
    p.add_argument("--warmup-s", type=float, default=0.0, help="pretend warm-up time")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    add_lifecycle_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(
        level=ns.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        opts: ServiceOptions = options_from_namespace(ns)
        config = ServiceConfig(
            discovery=DiscoveryConfig(
                etcd_endpoints=tuple(ns.etcd_endpoints),
                cluster=ns.cluster,
                instance_id=ns.instance_id,
                lease_ttl_s=ns.lease_ttl_s,
            ),
            bus=BusConfig(
                nats_url=ns.nats_url,
                load_report_interval_s=ns.load_report_interval_s,
                bus_outage_policy=ns.bus_outage_policy,
                admin_secret_file=ns.admin_secret_file,
            ),
            grpc=GrpcConfig(host=ns.host, grpc_port=ns.grpc_port),
        )
        svc = EchoService(
            config,
            opts,
            token_delay_s=ns.token_delay_s,
            warmup_s=ns.warmup_s,
        )
    except ValueError as e:
        print(f"pdrelay echo: {e}", file=sys.stderr)
        return 2
    return run_service(svc)


if __name__ == "__main__":
    sys.exit(main())
