"""Deployment runs: one row per fire of a deployment, in the embedded database (corral.knowledge_db), beside the
webhook endpoints. The gateway writes them (its `open_deployment_run` activity) and reads them (the API).

A run is append-only: recorded once, with exactly one of `session_id` and `error`. `UNIQUE(deployment_id,
scheduled_at)` is the promise of one run per scheduled time, held by the database whatever retried: a second
record of the same run (a retried activity whose first attempt wrote before it died) returns the first row.
Manual runs have no `scheduled_at` (SQLite's UNIQUE lets NULLs repeat), each its own fresh id.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from corral.knowledge_db import KnowledgeDB

_TABLES = (
    """CREATE TABLE IF NOT EXISTS deployment_runs (
        id TEXT PRIMARY KEY,
        workspace TEXT NOT NULL,
        deployment_id TEXT NOT NULL,
        trigger_type TEXT NOT NULL,
        scheduled_at TEXT,
        agent TEXT NOT NULL,
        session_id TEXT,
        error TEXT,
        created_at TEXT NOT NULL,
        UNIQUE (deployment_id, scheduled_at),
        CHECK ((session_id IS NULL) != (error IS NULL))
    )""",
    "CREATE INDEX IF NOT EXISTS deployment_runs_workspace ON deployment_runs (workspace, id)",
)


class RunNotFound(Exception):
    """No such run in the workspace (another workspace's is the same)."""


@dataclass(frozen=True)
class RunFilter:
    """What a listing keeps (each None: any)."""

    deployment_id: str | None = None
    has_error: bool | None = None
    trigger_type: str | None = None
    created_gt: datetime | None = None
    created_gte: datetime | None = None
    created_lt: datetime | None = None
    created_lte: datetime | None = None


def _stamp(moment: datetime) -> str:
    """Sortable text of an instant (UTC, microseconds), so SQL compares times as strings."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def run_view(row: sqlite3.Row | dict[str, Any]) -> dict[str, Any]:
    """A run as the API shows it (`BetaManagedAgentsDeploymentRun`)."""
    trigger: dict[str, Any] = {"type": row["trigger_type"]}
    if row["scheduled_at"] is not None:
        trigger["scheduled_at"] = row["scheduled_at"]
    return {
        "type": "deployment_run",
        "id": row["id"],
        "deployment_id": row["deployment_id"],
        "agent": json.loads(row["agent"]),
        "created_at": row["created_at"],
        "trigger_context": trigger,
        "session_id": row["session_id"],
        "error": json.loads(row["error"]) if row["error"] is not None else None,
    }


class DeploymentRuns:
    """The runs of every workspace; each method is one transaction (call it through `db.run`)."""

    def __init__(self, db: KnowledgeDB) -> None:
        self.db = db
        db.migrate("deployment_runs", _TABLES)

    def record(self, workspace: str, run_id: str, deployment_id: str, trigger_type: str,
               scheduled_at: datetime | None, agent: dict[str, Any], session_id: str | None,
               error: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
        """Record a run once: the run as it is recorded now, or as it was the first time (same id, or the same
        deployment and scheduled time)."""
        if (session_id is None) == (error is None):
            raise ValueError("a run has exactly one of session_id and error")
        scheduled = _stamp(scheduled_at) if scheduled_at is not None else None
        with self.db.write() as db:
            db.execute(
                "INSERT OR IGNORE INTO deployment_runs (id, workspace, deployment_id, trigger_type, scheduled_at,"
                " agent, session_id, error, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, workspace, deployment_id, trigger_type, scheduled, json.dumps(agent), session_id,
                 json.dumps(error) if error is not None else None, _stamp(datetime.now(UTC))),
            )  # fmt: skip
            row = db.execute(
                "SELECT * FROM deployment_runs WHERE id = ? OR (deployment_id = ? AND scheduled_at = ?)",
                (run_id, deployment_id, scheduled),
            ).fetchone()
        return run_view(row)

    def find(self, run_id: str) -> dict[str, Any] | None:
        """A run by id, whatever its workspace (for the activity, which knows its run's workspace already)."""
        with self.db.read() as db:
            row = db.execute("SELECT * FROM deployment_runs WHERE id = ?", (run_id,)).fetchone()
        return run_view(row) if row is not None else None

    def get(self, workspace: str, run_id: str) -> dict[str, Any]:
        with self.db.read() as db:
            query = "SELECT * FROM deployment_runs WHERE id = ? AND workspace = ?"
            row = db.execute(query, (run_id, workspace)).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        return run_view(row)

    def list(self, workspace: str, where: RunFilter, limit: int, before: str | None) -> list[dict[str, Any]]:
        """Up to `limit` runs, newest first (ids sort by time), after the cursor `before` (the last id seen)."""
        clauses, values = ["workspace = ?"], [workspace]
        if before is not None:
            clauses.append("id < ?")
            values.append(before)
        if where.deployment_id is not None:
            clauses.append("deployment_id = ?")
            values.append(where.deployment_id)
        if where.has_error is not None:
            clauses.append("error IS NOT NULL" if where.has_error else "error IS NULL")
        if where.trigger_type is not None:
            clauses.append("trigger_type = ?")
            values.append(where.trigger_type)
        for bound, operator in ((where.created_gt, ">"), (where.created_gte, ">="), (where.created_lt, "<"),
                                (where.created_lte, "<=")):  # fmt: skip
            if bound is not None:
                clauses.append(f"created_at {operator} ?")
                values.append(_stamp(bound))
        query = f"SELECT * FROM deployment_runs WHERE {' AND '.join(clauses)} ORDER BY id DESC LIMIT ?"
        with self.db.read() as db:
            return [run_view(row) for row in db.execute(query, (*values, limit))]
