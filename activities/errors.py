"""Errors raised by activities, translated from vendor errors at one boundary.

    ApplicationError (temporalio)               what the workflow does
    ├── type=ModelRetryableError                 session.error(retrying) + status_rescheduled, retries later
    │     details: ModelErrorInfo(retry_after)   honouring the server's retry-after; also a ModelStreamBroken
    ├── type=ModelFatalError                     session.error(exhausted), the session goes idle
    └── type=ToolError                           an `is_error` tool result the model sees

All are raised with `non_retryable=True` and the BENIGN category (an expected outcome, not a worker fault, so no
traceback in the worker log): the session workflow owns the retry of a model error (so each retry is a visible
event), while Temporal's own retry policy still covers lost workers and timeouts.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping

import anthropic
import httpx2
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from corral.contract.errors import MODEL_FATAL, MODEL_RETRYABLE, TOOL_ERROR, ModelErrorInfo, ModelErrorType

__all__ = [
    "MODEL_FATAL",
    "MODEL_RETRYABLE",
    "TOOL_ERROR",
    "ModelErrorInfo",
    "ModelErrorType",
    "ModelStreamBroken",
    "classify",
    "model_error",
    "parse_retry_after",
    "stream_broken",
]


class ModelStreamBroken(Exception):
    """A response stream that broke after it began: cut off, malformed, stalled, or ended before `message_stop`.

    The SDK lets these through as its transport's or JSON's own errors (or, for an early end, as a message with no
    stop reason); they are the endpoint's or the network's fault, and a fresh request is the remedy."""


def stream_broken(exc: Exception, stall_seconds: float) -> ModelStreamBroken | None:
    """What a failure while reading a response stream means; None if the SDK typed it already (an `error` event,
    a status) or it is not the stream's."""
    # From anthropic 2.17 the SDK wraps a transport failure while a stream is read as its own connection error;
    # before, it let the transport's error through. Either way, read here, it is the stream's.
    if isinstance(exc, anthropic.APITimeoutError):
        return ModelStreamBroken(f"the stream stalled: no data for {stall_seconds:g} s")
    if isinstance(exc, anthropic.APIConnectionError):
        cause = exc.__cause__ or exc
        return ModelStreamBroken(f"the stream broke off: {str(cause) or type(cause).__name__}")
    if isinstance(exc, anthropic.AnthropicError):
        return None
    if isinstance(exc, httpx2.TimeoutException):  # the per-read timeout: no byte for `stall_seconds`
        return ModelStreamBroken(f"the stream stalled: no data for {stall_seconds:g} s")
    if isinstance(exc, httpx2.HTTPError):
        return ModelStreamBroken(f"the stream broke off: {str(exc) or type(exc).__name__}")
    if isinstance(exc, ValueError):  # a data line that is not JSON (or not UTF-8), an event out of its place
        return ModelStreamBroken(f"the stream was malformed: {exc}")
    return None


def closed_before_answer(exc: anthropic.APIConnectionError) -> bool:
    """Whether a request failed because its connection, kept alive from an earlier one, was closed by the server
    before any answer: a reset, a broken pipe, or a close with no response. The server's close of an idle
    connection crossing the next request in the socket looks so; a connection that could not be made does not."""
    cause = exc.__cause__
    if isinstance(exc, anthropic.APITimeoutError) or isinstance(cause, httpx2.ConnectError | httpx2.TimeoutException):
        return False
    return isinstance(cause, httpx2.RemoteProtocolError | httpx2.ReadError | httpx2.WriteError)


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait, from `retry-after-ms`, or `retry-after` as seconds or an HTTP date."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_tz(value)
        return None if parsed is None else max(0.0, email.utils.mktime_tz(parsed) - time.time())


_BODY_TYPES: dict[str, tuple[ModelErrorType, bool]] = {
    "overloaded_error": ("model_overloaded_error", True),
    "rate_limit_error": ("model_rate_limited_error", True),
    "api_error": ("model_request_failed_error", True),
    "timeout_error": ("model_request_failed_error", True),
    "billing_error": ("billing_error", False),
}


def classify(exc: Exception) -> ModelErrorInfo | None:
    """Map an `anthropic` exception to what corral does with it; None if it is not a model API error."""
    if isinstance(exc, ModelStreamBroken):
        return ModelErrorInfo(error_type="model_request_failed_error", status=None, retryable=True)
    if isinstance(exc, anthropic.APIConnectionError):  # includes APITimeoutError
        return ModelErrorInfo(error_type="model_request_failed_error", status=None, retryable=True)
    if not isinstance(exc, anthropic.APIStatusError):
        return None
    status = exc.status_code
    retry_after = parse_retry_after(exc.response.headers)
    if status == 429:
        return ModelErrorInfo(
            error_type="model_rate_limited_error", status=status, retryable=True, retry_after=retry_after
        )
    if status == 529:
        return ModelErrorInfo(
            error_type="model_overloaded_error", status=status, retryable=True, retry_after=retry_after
        )
    if status == 402:
        return ModelErrorInfo(error_type="billing_error", status=status, retryable=False)
    if status in (408, 409) or status >= 500:
        return ModelErrorInfo(
            error_type="model_request_failed_error", status=status, retryable=True, retry_after=retry_after
        )
    if status < 400:
        # An error event inside a 200 stream: the body's error type decides.
        body = exc.body if isinstance(exc.body, dict) else {}
        error = body.get("error", body)
        body_type = error.get("type") if isinstance(error, dict) else None
        error_type, retryable = _BODY_TYPES.get(str(body_type), ("model_request_failed_error", True))
        return ModelErrorInfo(error_type=error_type, status=status, retryable=retryable)
    too_long = status == 400 and "prompt is too long" in _safe_message(exc).lower()
    return ModelErrorInfo(
        error_type="model_request_failed_error", status=status, retryable=False, context_too_long=too_long
    )


def model_error(exc: Exception, info: ModelErrorInfo) -> ApplicationError:
    """The ApplicationError the model activity raises for a classified vendor error."""
    if info.status:
        status = f"HTTP {info.status}"
    else:
        status = "broken stream" if isinstance(exc, ModelStreamBroken) else "connection error"
    message = f"model request failed ({status}): {_safe_message(exc)}"
    return ApplicationError(
        message,
        info,
        type=MODEL_RETRYABLE if info.retryable else MODEL_FATAL,
        non_retryable=True,
        category=ApplicationErrorCategory.BENIGN,  # expected; the activity logs one line of its own
    )


def _safe_message(exc: Exception) -> str:
    """The vendor's message, shortened; the SDK never puts the API key in it."""
    text = str(getattr(exc, "message", None) or exc) or type(exc).__name__
    return text if len(text) <= 500 else text[:500] + "…"
