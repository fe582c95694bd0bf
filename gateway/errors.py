"""Errors in the shape the `anthropic` SDK reads: `{"type": "error", "error": {"type", "message"}}`.

The status picks the SDK's exception class (400 BadRequestError, 401 AuthenticationError, 404 NotFoundError, 409
ConflictError...). The SDK retries 408, 409, 429 and 5xx on its own, POSTs included: an error that a retry cannot
cure says so with `x-should-retry: false`, so a conflict is not sent three times.
"""

from __future__ import annotations

import secrets

from starlette.requests import Request
from starlette.responses import JSONResponse

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    412: "invalid_request_error",  # a work item's stale heartbeat (gateway/work.py); told apart by its error_code
    410: "invalid_request_error",  # a session whose workflow ended (gateway/session_status.py); upstream has no 410
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


class ApiError(Exception):
    """A request the gateway refuses, with the status and message the client sees."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_code: str | None = None,
        headers: dict[str, str] | None = None,
        details: dict[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_code = error_code
        self.headers = headers or {}
        self.details = details or {}
        """More of `error.details` beside its `error_code`, for a client that reads them (a 412's `current_state`)."""


def not_found(kind: str, object_id: str) -> ApiError:
    """The same answer for an object that does not exist and for one of another workspace."""
    return ApiError(404, f"{kind} {object_id!r} was not found", error_code=f"{kind}_not_found")


def invalid(message: str) -> ApiError:
    return ApiError(400, message)


def error_response(
    status: int,
    message: str,
    error_code: str | None = None,
    extra_headers: dict[str, str] | None = None,
    details: dict[str, object] | None = None,
) -> JSONResponse:
    error: dict[str, object] = {"type": ERROR_TYPES.get(status, "api_error"), "message": message}
    if error_code:
        error["details"] = {"error_code": error_code, **(details or {})}
    request_id = "req_" + secrets.token_hex(12)
    headers = {**(extra_headers or {}), "request-id": request_id}
    if status < 500 and status not in (408, 429):
        headers["x-should-retry"] = "false"
    return JSONResponse({"type": "error", "error": error, "request_id": request_id}, status, headers=headers)


async def api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.message, exc.error_code, exc.headers, exc.details)
