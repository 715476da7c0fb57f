"""`--api-key` on the gateway's gRPC API: every pdrelay.v1.Gateway call needs `authorization: Bearer <key>` metadata.

The same key and the same rule as the HTTP API (services.gateway.http.app): compared in constant time, refused with
UNAUTHENTICATED. Only the standard grpc.health.v1 service stays open, for load balancers and orchestrators; the
Gateway API's own Health RPC reports cluster details and needs the key like every other call.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

import grpc

OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
_HINT = "send metadata 'authorization: Bearer <key>' with the key the gateway was started with (--api-key)"


def bearer_token_matches(value: str | bytes | None, key: bytes) -> bool:
    """Is `value` ("Bearer <key>", scheme case-insensitive) the expected key? Constant time in the key's content."""
    if value is None:
        return False
    raw = value.encode("latin-1", "replace") if isinstance(value, str) else value
    scheme, _, token = raw.partition(b" ")
    # compare_digest: the time taken does not depend on how much of the key matched.
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key)


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls without the right key before the handler runs (and before any request is read)."""

    def __init__(self, api_key: str) -> None:
        if not api_key:
            raise ValueError("--api-key is empty; give a key, or leave the flag out to run without one")
        self._key = api_key.encode()
        self.refused = 0

    def _why_refused(self, metadata: Any) -> str | None:
        values = [v for k, v in (metadata or ()) if k == "authorization"]
        if not values:
            return f"missing API key; {_HINT}"
        if not bearer_token_matches(values[0], self._key):
            return f"invalid API key; {_HINT}"
        return None

    async def intercept_service(
        self, continuation: Callable[..., Any], handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_PREFIXES):
            return handler
        why = self._why_refused(handler_call_details.invocation_metadata)
        if why is None:
            return handler
        self.refused += 1
        return _refusing(handler, why)


def _refusing(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that ends the call with UNAUTHENTICATED."""

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - makes this an async generator, as streaming handlers are

    kw = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary, **kw)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary, **kw)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(stream, **kw)
    return grpc.stream_stream_rpc_method_handler(stream, **kw)
