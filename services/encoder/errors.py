"""The one error type of the encoder's work: a pdrelay ErrorCode and a message naming the value and the fix.
The servicer turns it into the gRPC status + typed Error (shared.cluster.grpc_errors)."""

from __future__ import annotations


class EncoderError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code  # proto.pdrelay.v1.common_pb2.ErrorCode
        self.message = message
