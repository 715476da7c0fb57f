"""OpenAI-style error bodies, `{"error": {"message", "type", "param", "code"}}`, for every failure.

Every rejection names the offending value and the fix. Backend errors map to status codes here and only here:
InvalidRequest 400, ModelNotFound 404, BackendOverloaded 429 (or 503) + Retry-After, BackendUnavailable 503,
BackendTimeout 504, RequestFailed 500 with the worker's reason, anything else 500 with a message that does not leak
internals.
"""

from __future__ import annotations

import math

import msgspec

from services.gateway.backend import (
    BackendError,
    BackendOverloaded,
    BackendTimeout,
    BackendUnavailable,
    InvalidRequest,
    ModelNotFound,
    RequestFailed,
)
from services.gateway.openai.responses import ErrorInfo, ErrorResponse

_ENCODER = msgspec.json.Encoder()
REQUEST_FAILED_CODE = "request_failed"  # the error body's code of RequestFailed (the gRPC API's REQUEST_FAILED)

# status -> OpenAI error "type"
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class ApiError(Exception):
    """An HTTP error response. Raised anywhere in request handling; the app turns it into the body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        extra = list(headers)
        if retry_after_s is not None:
            # Retry-After is whole seconds; never 0, which invites a hot retry loop.
            extra.append((b"retry-after", str(max(1, math.ceil(retry_after_s))).encode()))
        self.headers = tuple(extra)

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")

    def body(self) -> bytes:
        return _ENCODER.encode(self.response())

    def response(self) -> ErrorResponse:
        return ErrorResponse(ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code))


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def from_backend(exc: BackendError) -> ApiError:
    """The HTTP face of a typed backend error."""
    msg = str(exc) or type(exc).__name__
    if isinstance(exc, InvalidRequest):
        return ApiError(400, msg, param=exc.param)
    if isinstance(exc, ModelNotFound):
        return ApiError(404, msg, param="model", code="model_not_found")
    if isinstance(exc, BackendOverloaded):
        return ApiError(exc.status, f"{msg}; retry later", code="overloaded", retry_after_s=exc.retry_after_s)
    if isinstance(exc, BackendUnavailable):
        return ApiError(503, f"{msg}; retry later", code="unavailable", retry_after_s=exc.retry_after_s)
    if isinstance(exc, BackendTimeout):
        return ApiError(504, msg, code="timeout")
    if isinstance(exc, RequestFailed):
        return ApiError(500, msg, code=REQUEST_FAILED_CODE)
    return ApiError(500, f"the backend failed: {msg}", code="backend_error")


def internal_error() -> ApiError:
    """For bugs: the details go to the log, not to the client."""
    return ApiError(500, "internal error in the gateway; see its log", code="internal_error")
