"""How the work queue looks through the API (the SDK's `work`, `work_heartbeat`, `work_queue_stats` and a 412's
`current_state`), and the query values its routes take, checked: 400 naming the value. Pure functions, for
gateway/work.py.
"""

from __future__ import annotations

import base64
from datetime import datetime, timedelta
from typing import Any

from corral.contract.work import (
    DEFAULT_RECLAIM_MS,
    MAX_LEASE_SECONDS,
    MIN_LEASE_SECONDS,
    POLLERS_WINDOW_SECONDS,
    WorkHeartbeat,
    WorkItem,
    WorkQueueState,
)
from gateway.errors import invalid
from gateway.shapes import when

MAX_BLOCK_MS = 999
"""The longest a poll is held open (the SDK sends 999, and the API refuses more)."""
MAX_WORKER_ID_LENGTH = 256
UNNAMED_WORKER = "unnamed-worker"
"""The worker id of a poll that sends none: it may take items, but `workers_polling` cannot count it."""


def work_view(item: WorkItem, secret: str | None = None) -> dict[str, Any]:
    """The SDK's `work` object. `secret` is given on a poll's delivery only."""
    return {
        "type": "work",
        "id": item.id,
        "environment_id": item.environment_id,
        "data": {"type": "session", "id": item.session_id},
        "state": item.state,
        "metadata": dict(item.metadata),
        "secret": secret,
        "created_at": when(item.created_at),
        "acknowledged_at": when(item.acknowledged_at),
        "started_at": when(item.started_at),
        "latest_heartbeat_at": when(item.latest_heartbeat_at),
        "stop_requested_at": when(item.stop_requested_at),
        "stopped_at": when(item.stopped_at),
    }


def heartbeat_view(beat: WorkHeartbeat) -> dict[str, Any]:
    return {"type": "work_heartbeat", "last_heartbeat": beat.last_heartbeat, "lease_extended": beat.lease_extended,
            "state": beat.state, "ttl_seconds": round(beat.ttl_seconds)}  # fmt: skip


def lease_state(beat: WorkHeartbeat) -> dict[str, Any]:
    """A 412's `current_state` (the SDK's `BetaWorkLeaseState`: no heartbeat is null there, not "")."""
    return {"last_heartbeat": beat.last_heartbeat or None, "lease_extended": False, "state": beat.state,
            "ttl_seconds": round(beat.ttl_seconds)}  # fmt: skip


def stats_view(state: WorkQueueState, now: datetime) -> dict[str, Any]:
    """The SDK's `work_queue_stats`. Pollers are counted against this gateway's clock (the queue's stands still
    between its tasks)."""
    since = now - timedelta(seconds=POLLERS_WINDOW_SECONDS)
    return {
        "type": "work_queue_stats",
        "depth": state.depth,
        "pending": state.pending,
        "oldest_queued_at": when(state.oldest_queued_at),
        "workers_polling": sum(1 for polled in state.pollers.values() if polled >= since),
    }


def claimable(item: WorkItem, now: datetime, reclaim_older_than_ms: int) -> bool:
    """Whether a poll may hand `item` out: queued, and never delivered or not acknowledged within the poll's
    `reclaim_older_than_ms` (the queue's own `claim` decides again, by its own clock)."""
    if item.state != "queued":
        return False
    return item.delivered_at is None or item.delivered_at <= now - timedelta(milliseconds=reclaim_older_than_ms)


def whole_number(value: str | None, name: str) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise invalid(f"{name} must be a whole number, not {value[:32]!r}") from exc


def block_ms_of(value: str | None) -> int:
    """A poll's `block_ms`: absent is a poll that does not wait; 0 or more than 999 is refused, as upstream."""
    block = whole_number(value, "block_ms")
    if block is None:
        return 0
    if not 1 <= block <= MAX_BLOCK_MS:
        raise invalid(f"block_ms must be from 1 to {MAX_BLOCK_MS} milliseconds (or absent, not to wait), not {block}")
    return block


def reclaim_ms_of(value: str | None) -> int:
    reclaim = whole_number(value, "reclaim_older_than_ms")
    if reclaim is None:
        return DEFAULT_RECLAIM_MS
    if reclaim < 0:
        raise invalid(f"reclaim_older_than_ms must be 0 or more milliseconds, not {reclaim}")
    return reclaim


def worker_id_of(value: str | None) -> str:
    if value is None or not value.strip():
        return UNNAMED_WORKER
    if len(value) > MAX_WORKER_ID_LENGTH or not value.isascii() or not value.isprintable():
        raise invalid(f"the Anthropic-Worker-ID header must be printable ASCII of at most {MAX_WORKER_ID_LENGTH} "
                      "characters")  # fmt: skip
    return value.strip()


def ttl_of(value: str | None, default: float) -> float:
    """A heartbeat's `desired_ttl_seconds`, held within the queue's bounds (a lease the worker cannot keep, or one
    that outlives its worker by hours, helps no one); absent: this gateway's lease."""
    ttl = whole_number(value, "desired_ttl_seconds")
    return default if ttl is None else min(max(float(ttl), MIN_LEASE_SECONDS), MAX_LEASE_SECONDS)


def work_cursor(item: WorkItem) -> str:
    return base64.urlsafe_b64encode(f"w{item.created_at.isoformat()} {item.id}".encode()).decode()


def after_cursor(items: list[WorkItem], page: str | None) -> list[WorkItem]:
    """The items (newest first) after the one a page ended at, even when items came or went since."""
    if page is None:
        return items
    try:
        text = base64.urlsafe_b64decode(page.encode()).decode()
        moment, work_id = text[1:].split(" ", 1)
        last = (datetime.fromisoformat(moment), work_id)
        if not text.startswith("w"):
            raise ValueError(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid("page: not a cursor this list gave") from exc
    return [item for item in items if (item.created_at, item.id) < last]
