"""Errors of the streaming package.

The hierarchy, so callers catch exactly as much as they mean to::

    StreamError
    ├── InvalidRecordError       a published record is not valid JSON or not a start/delta/end record
    ├── InvalidSinceError        a `since` / `Last-Event-ID` value is not `<span_id>/<out_seq>`
    └── StreamRelayError         the relay answered a subscriber with an error status
        └── StreamAuthError      the relay requires a token and did not accept the one sent (401)

The publisher never raises any of these into a model call: a relay that is down or rejects it only costs the
live view, never the turn. Messages name URLs and statuses, never a token.
"""

from __future__ import annotations


class StreamError(Exception):
    """Base class of every error raised by `relay`."""


class InvalidRecordError(StreamError, ValueError):
    """A published record is malformed; the relay answers 400 and names the offending line."""


class InvalidSinceError(StreamError, ValueError):
    """A resume position is not of the form `<span_id>/<out_seq>`."""


class StreamRelayError(StreamError):
    """The relay refused a subscription with an HTTP error status (other than a retryable 5xx)."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class StreamAuthError(StreamRelayError):
    """The relay requires `Authorization: Bearer <token>` and the request had no token or a wrong one."""
