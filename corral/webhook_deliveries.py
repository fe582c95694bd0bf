"""What became of each webhook delivery: one row per (event, endpoint) in the embedded database.

The proxy's `deliver_webhook` writes it on every attempt (so `corral webhook deliveries` shows a delivery still
being retried, and why its last attempt failed), and `give_up_webhook` marks it failed. A row holds ids, the event's
type, counts, an HTTP status and a reason: never the payload's secret-free body, and never a signing secret.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from corral.knowledge_db import KnowledgeDB

PENDING = "pending"
DELIVERED = "delivered"
FAILED = "failed"
STATUSES = (PENDING, DELIVERED, FAILED)

_TABLES = (
    """CREATE TABLE IF NOT EXISTS webhook_deliveries (
        event_id TEXT NOT NULL,
        endpoint_id TEXT NOT NULL,
        workspace TEXT NOT NULL,
        type TEXT NOT NULL,
        status TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        last_status INTEGER,
        last_error TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        delivered_at TEXT,
        PRIMARY KEY (event_id, endpoint_id)
    )""",
    "CREATE INDEX IF NOT EXISTS webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, created_at)",
)


@dataclass(frozen=True)
class Delivery:
    event_id: str
    endpoint_id: str
    workspace: str
    type: str
    status: str
    attempts: int
    last_status: int | None
    last_error: str | None
    created_at: str
    updated_at: str
    delivered_at: str | None


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _delivery(row: sqlite3.Row) -> Delivery:
    return Delivery(**{key: row[key] for key in row.keys()})


class WebhookDeliveries:
    """The deliveries table; each method is one transaction (call it through `db.run`)."""

    def __init__(self, db: KnowledgeDB) -> None:
        self.db = db
        db.migrate("webhook_deliveries", _TABLES)

    def attempt(self, event_id: str, endpoint_id: str, workspace: str, event_type: str) -> int:
        """Count one more attempt (the row is made by the first); the number of this attempt. A delivered row stays
        delivered: an attempt after a lost answer (the worker died after the 2xx) is counted, not un-delivered."""
        now = _now()
        with self.db.write() as db:
            db.execute(
                "INSERT INTO webhook_deliveries (event_id, endpoint_id, workspace, type, status, attempts, created_at,"
                " updated_at) VALUES (?, ?, ?, ?, ?, 0, ?, ?) ON CONFLICT (event_id, endpoint_id) DO NOTHING",
                (event_id, endpoint_id, workspace, event_type, PENDING, now, now),
            )
            db.execute(
                "UPDATE webhook_deliveries SET attempts = attempts + 1, updated_at = ? WHERE event_id = ?"
                " AND endpoint_id = ?",
                (now, event_id, endpoint_id),
            )
            query = "SELECT attempts FROM webhook_deliveries WHERE event_id = ? AND endpoint_id = ?"
            row = db.execute(query, (event_id, endpoint_id)).fetchone()
        return int(row["attempts"])

    def outcome(self, event_id: str, endpoint_id: str, status: str, last_status: int | None = None,
                last_error: str | None = None) -> None:  # fmt: skip
        """Record an attempt's outcome: `delivered`, or the status and reason of a failure (`pending` while it is
        retried, `failed` when given up or stopped)."""
        now = _now()
        with self.db.write() as db:
            db.execute(
                "UPDATE webhook_deliveries SET status = ?, last_status = ?, last_error = ?, updated_at = ?,"
                " delivered_at = CASE WHEN ? = 'delivered' THEN ? ELSE delivered_at END"
                " WHERE event_id = ? AND endpoint_id = ?",
                (status, last_status, last_error, now, status, now, event_id, endpoint_id),
            )

    def get(self, event_id: str, endpoint_id: str) -> Delivery | None:
        with self.db.read() as db:
            query = "SELECT * FROM webhook_deliveries WHERE event_id = ? AND endpoint_id = ?"
            row = db.execute(query, (event_id, endpoint_id)).fetchone()
        return None if row is None else _delivery(row)

    def of_endpoint(self, endpoint_id: str, status: str | None = None, limit: int = 100) -> list[Delivery]:
        """An endpoint's deliveries, newest first; only those of `status` when given."""
        query, params = "SELECT * FROM webhook_deliveries WHERE endpoint_id = ?", [endpoint_id]
        if status is not None:
            query, params = query + " AND status = ?", [*params, status]
        with self.db.read() as db:
            rows = db.execute(query + " ORDER BY created_at DESC, event_id DESC LIMIT ?", (*params, limit))
            return [_delivery(row) for row in rows]


def delivery_view(delivery: Delivery) -> dict[str, Any]:
    """A delivery as the API shows it."""
    return {"type": "webhook_delivery", "event_id": delivery.event_id, "endpoint_id": delivery.endpoint_id,
            "event_type": delivery.type, "status": delivery.status, "attempts": delivery.attempts,
            "last_status": delivery.last_status, "last_error": delivery.last_error,
            "created_at": delivery.created_at, "updated_at": delivery.updated_at,
            "delivered_at": delivery.delivered_at}  # fmt: skip
