"""Counts in-flight RPCs and, once draining, refuses new ones with UNAVAILABLE + a typed DRAINING error.

A server interceptor wraps every handler except the health service (health must keep answering NOT_SERVING
while the instance drains, and its Watch streams never end by themselves). The draining check and the in-flight
increment happen in the same step of the event loop, so an RPC is either refused or waited for, never lost.
Non-RPC work (a hand-off in progress, a background transfer) can hold the gate too: `async with gate.hold(): ...`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from proto.pdrelay.v1 import common_pb2
from shared.cluster.grpc_errors import abort

EXEMPT_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class DrainGate(grpc.aio.ServerInterceptor):
    def __init__(self, instance_id: str = "") -> None:
        self.instance_id = instance_id
        self.draining = False
        self.inflight = 0
        self.refused = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # ------------------------------------------------------------------ accounting

    def _enter(self) -> None:
        self.inflight += 1
        self._idle.clear()

    def _exit(self) -> None:
        self.inflight -= 1
        assert self.inflight >= 0, "in-flight count went negative"
        if self.inflight == 0:
            self._idle.set()

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Count a piece of non-RPC work as in flight (drain waits for it). Raises RuntimeError once draining."""
        if self.draining:
            raise RuntimeError(f"instance {self.instance_id} is draining: not starting new work")
        self._enter()
        try:
            yield
        finally:
            self._exit()

    def start_draining(self) -> None:
        self.draining = True

    async def wait_idle(self, timeout_s: float) -> bool:
        """True when nothing is in flight any more; False if `timeout_s` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    # ------------------------------------------------------------------ interceptor

    async def _refuse(self, context: grpc.aio.ServicerContext) -> None:
        self.refused += 1
        await abort(
            context,
            common_pb2.ERROR_CODE_DRAINING,
            f"draining: instance {self.instance_id or '?'} is shutting down and takes no new work; "
            "retry on another instance",
            instance_id=self.instance_id,
        )

    def _wrap_unary(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        async def wrapped(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            if self.draining:
                await self._refuse(context)
            self._enter()
            try:
                return await fn(request_or_iterator, context)
            finally:
                self._exit()

        return wrapped

    def _wrap_stream(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        async def wrapped(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if self.draining:
                await self._refuse(context)
            self._enter()
            try:
                result = fn(request_or_iterator, context)
                if inspect.isasyncgen(result):
                    async for item in result:
                        yield item
                else:  # a handler that writes with context.write() and returns None
                    await result
            finally:
                self._exit()

        return wrapped

    async def intercept_service(
        self, continuation: Callable[..., Any], handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(EXEMPT_PREFIXES):
            return handler
        kw = dict(request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(self._wrap_unary(handler.unary_unary), **kw)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(self._wrap_unary(handler.stream_unary), **kw)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(self._wrap_stream(handler.unary_stream), **kw)
        if handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(self._wrap_stream(handler.stream_stream), **kw)
        return handler
