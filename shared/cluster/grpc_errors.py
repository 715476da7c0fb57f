"""Typed errors over gRPC: a status code for generic clients plus a pdrelay `Error` in the trailing metadata.

server:  await abort(context, ErrorCode.ERROR_CODE_DRAINING, "instance d-1 is draining; retry elsewhere")
client:  except grpc.aio.AioRpcError as e: err = error_from_rpc(e)  # -> common_pb2.Error | None
"""

from __future__ import annotations

from typing import NoReturn, cast

import grpc

from proto.pdrelay.v1 import common_pb2

ERROR_METADATA_KEY = "pdrelay-error-bin"  # "-bin": gRPC carries the serialized proto as binary metadata

# How each pdrelay error code surfaces to clients that only look at the gRPC status.
_STATUS: dict[int, grpc.StatusCode] = {
    common_pb2.ERROR_CODE_INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    common_pb2.ERROR_CODE_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    common_pb2.ERROR_CODE_OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    common_pb2.ERROR_CODE_DRAINING: grpc.StatusCode.UNAVAILABLE,
    common_pb2.ERROR_CODE_STALE_EPOCH: grpc.StatusCode.FAILED_PRECONDITION,
    common_pb2.ERROR_CODE_LAYOUT_MISMATCH: grpc.StatusCode.FAILED_PRECONDITION,
    common_pb2.ERROR_CODE_TRANSFER_FAILED: grpc.StatusCode.ABORTED,
    common_pb2.ERROR_CODE_CHECKSUM_MISMATCH: grpc.StatusCode.DATA_LOSS,
    common_pb2.ERROR_CODE_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    common_pb2.ERROR_CODE_CANCELLED: grpc.StatusCode.CANCELLED,
    common_pb2.ERROR_CODE_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    common_pb2.ERROR_CODE_INTERNAL: grpc.StatusCode.INTERNAL,
    common_pb2.ERROR_CODE_REQUEST_FAILED: grpc.StatusCode.INTERNAL,
}

# Retrying (same request id, new epoch, another instance) is safe and useful for these.
RETRYABLE = frozenset(
    {
        common_pb2.ERROR_CODE_OVERLOADED,
        common_pb2.ERROR_CODE_DRAINING,
        common_pb2.ERROR_CODE_STALE_EPOCH,
        common_pb2.ERROR_CODE_TRANSFER_FAILED,
        common_pb2.ERROR_CODE_CHECKSUM_MISMATCH,
        common_pb2.ERROR_CODE_TIMEOUT,
        common_pb2.ERROR_CODE_UNAVAILABLE,
    }
)


def status_of(code: int) -> grpc.StatusCode:
    return _STATUS.get(code, grpc.StatusCode.UNKNOWN)


def make_error(code: int, message: str, *, instance_id: str = "", retryable: bool | None = None) -> common_pb2.Error:
    # protoc's stubs type an enum field as its enum class; any int of ErrorCode is what the field holds at run time
    return common_pb2.Error(
        code=cast("common_pb2.ErrorCode", code),
        message=message,
        instance_id=instance_id,
        retryable=code in RETRYABLE if retryable is None else retryable,
    )


def error_metadata(err: common_pb2.Error) -> tuple[tuple[str, bytes], ...]:
    return ((ERROR_METADATA_KEY, err.SerializeToString()),)


async def abort(
    context: grpc.aio.ServicerContext, code: int, message: str, *, instance_id: str = "", retryable: bool | None = None
) -> NoReturn:
    """End the RPC with the status matching `code` and the typed Error in the trailers."""
    err = make_error(code, message, instance_id=instance_id, retryable=retryable)
    await context.abort(status_of(code), message, trailing_metadata=error_metadata(err))
    raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises


def error_from_rpc(e: grpc.aio.AioRpcError | grpc.RpcError) -> common_pb2.Error | None:
    """The typed Error a pdrelay server attached, or None (a plain gRPC failure: connection refused, ...)."""
    trailers = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == ERROR_METADATA_KEY and isinstance(value, bytes):
            return common_pb2.Error.FromString(value)
    return None
