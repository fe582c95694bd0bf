"""Pages and bounds of a listing, the same on every route: a `limit`, a `page` cursor this gateway gave, and times
as RFC 3339. A cursor is opaque to the client; one this gateway did not give is a 400, never a silent first page.
"""

from __future__ import annotations

import base64
import re
from datetime import datetime, timedelta
from typing import Any

from gateway.errors import invalid

MAX_LIMIT = 1000
DEFAULT_LIMIT = 20
"""Sessions and events per page (records such as agents take 20 of at most 100: `gateway/records.py`)."""

_RFC_3339 = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})[Tt ](?P<time>\d{2}:\d{2}:\d{2})(?:\.(?P<fraction>\d+))?"
    r"(?P<offset>[Zz]|[+-]\d{2}:\d{2})"
)


def instant(value: str | None, where: str, *, round_up: bool = True) -> datetime | None:
    """An RFC 3339 timestamp (the SDK sends a datetime's isoformat(), a string as given), with its offset: a time
    without one is refused, not guessed. Past microseconds, a lower bound rounds up and an upper one down, so an
    inclusive bound keeps exactly the times it names."""
    if value is None:
        return None
    refused = invalid(f"{where} must be an RFC 3339 timestamp with a time zone, like 2026-01-31T09:30:00Z, "
                      f"not {value!r}")  # fmt: skip
    match = _RFC_3339.fullmatch(value)
    if match is None:
        raise refused
    fraction = match["fraction"] or "0"
    offset = "+00:00" if match["offset"] in ("Z", "z") else match["offset"]
    try:  # the pattern has the shape; this checks the values (no February 30th)
        moment = datetime.fromisoformat(f"{match['date']}T{match['time']}.{fraction[:6]:0<6}{offset}")
    except ValueError as exc:
        raise refused from exc
    if round_up and fraction[6:].strip("0"):
        moment += timedelta(microseconds=1)
    return moment


def page_limit(value: str | None) -> int:
    """A listing's `limit`: `DEFAULT_LIMIT` when absent, at most `MAX_LIMIT`."""
    if value is None:
        return DEFAULT_LIMIT
    try:
        limit = int(value)
    except ValueError as exc:
        raise invalid("limit must be a whole number") from exc
    if not 1 <= limit <= MAX_LIMIT:
        raise invalid(f"limit must be from 1 to {MAX_LIMIT}")
    return limit


def timestamp(value: str, where: str) -> str:
    """A time bound of a listing, as the ISO form visibility queries and comparisons take."""
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise invalid(f"{where}: not an RFC 3339 time: {value!r}") from exc
    return moment.isoformat()


def within(data: dict[str, Any], bounds: dict[str, str]) -> bool:
    """Whether an event's view is inside the `timestamp` bounds (`gt`, `gte`, `lt`, `lte`) of a listing."""
    if not bounds:
        return True
    moment = datetime.fromisoformat(str(data.get("processed_at") or data.get("created_at")).replace("Z", "+00:00"))
    checks = {"gt": lambda b: moment > b, "gte": lambda b: moment >= b, "lt": lambda b: moment < b,
              "lte": lambda b: moment <= b}  # fmt: skip
    return all(checks[key](datetime.fromisoformat(value)) for key, value in bounds.items())


def position_cursor(position: int) -> str:
    """The cursor of an events page that ended at log position `position`."""
    return base64.urlsafe_b64encode(f"p{position}".encode()).decode()


def position_of(page: str) -> int:
    """The log position an events page ended at."""
    try:
        text = base64.urlsafe_b64decode(page.encode()).decode()
        if text.startswith("p"):
            return int(text[1:])
    except (ValueError, UnicodeDecodeError):
        pass
    raise invalid("page: not a cursor this list gave")


def session_cursor(moment: datetime, session_id: str) -> str:
    """The cursor of a sessions page that ended at the session started at `moment`."""
    return base64.urlsafe_b64encode(f"t{moment.isoformat()} {session_id}".encode()).decode()


def session_after(page: str) -> tuple[str, str]:
    """The (start time, session id) a sessions page ended at."""
    try:
        text = base64.urlsafe_b64decode(page.encode()).decode()
        moment, session_id = text[1:].split(" ", 1)
        if text.startswith("t"):
            return datetime.fromisoformat(moment).isoformat(), session_id
    except (ValueError, UnicodeDecodeError):
        pass
    raise invalid("page: not a cursor this list gave")
