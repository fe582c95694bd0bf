"""A session as `GET /v1/sessions/{id}` shows it, with a `status` true at every point, and how a session whose
workflow ended is reported.

`status` is what the SDK's tool runner reads on every reconnect to know whether to go on:
- `idle`, `running`, `rescheduling`: the session's own word (its `session` query) while its workflow runs; a
  session waiting on a tool confirmation or a custom tool's result is `idle` (its last `session.status_idle` has
  `stop_reason: requires_action`), as upstream. Before its first workflow task answers, the `CorralStatus` search
  attribute (`idle`: sessions start idle).
- `terminated`: once it is archived (upstream writes no event for an archive, so only the status tells the runner),
  and once its workflow has closed, however (a terminate or a timeout writes no event either).

A session whose workflow closed abnormally shows how, when and why in `ended` (corral's own field, shown only then,
so a session that runs looks exactly as upstream's). Writing to it is refused with 410 Gone (`session_ended`):
it will never take an event again, and 410 is a status neither the SDK nor its tool runner retries (409 they
would, forever). A session whose start input was refused has no log at all: every read of it but the listing
is 410 too (`session_failed_at_start`), with the refusal, so that a client learns why rather than an empty log.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import TypedSearchAttributes
from temporalio.service import RPCError

from corral.client import session_end, session_info
from corral.contract.search_attributes import STATUS_KEY
from corral.contract.session import SessionInfo
from corral.errors import SessionEnded, SessionStartFailed
from corral.names import SESSION_STATUSES
from corral.queues import Waiting, session_waits
from gateway.errors import error_response
from gateway.shapes import when

AGENT_ONLY = ("created_at", "updated_at", "archived_at", "metadata")
"""Fields of an agent that a session's snapshot of it does not show."""
GONE = 410
ENDED_CODE = "session_ended"
START_FAILED_CODE = "session_failed_at_start"
_OPEN = (None, WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW)


async def session_ended_handler(request: Request, exc: Exception) -> JSONResponse:
    """Any route that met a session whose workflow ended (`corral.client` raises it): 410 with what happened."""
    assert isinstance(exc, SessionEnded)
    if isinstance(exc, SessionStartFailed):
        return error_response(GONE, str(exc), START_FAILED_CODE)
    return error_response(GONE, f"{exc}; it takes no more events", ENDED_CODE)


async def refuse_if_ended(handle: WorkflowHandle, description: WorkflowExecutionDescription) -> None:
    """Before a write: a session whose workflow has closed is refused, saying how it ended (410)."""
    if description.status not in _OPEN:
        ended = await session_end(handle)
        if ended is not None:
            raise ended


async def view(handle: WorkflowHandle, description: WorkflowExecutionDescription) -> dict[str, Any]:
    """The session's API view, from its description (memo, times), its `session` query while it runs, and its close
    event once it has ended. `SessionStartFailed` for a session whose start input was refused."""
    memo = await description.memo()
    info: SessionInfo | None = None
    ended: SessionEnded | None = None
    if description.status not in _OPEN:
        ended = await session_end(handle)
        if isinstance(ended, SessionStartFailed):
            raise ended
    else:
        try:
            info = await session_info(handle)
        except RPCError:
            pass  # its first workflow task has not answered yet: the search attribute says
    data = session_view(handle.id, memo, description.start_time, description.close_time, info,
                        description.typed_search_attributes)  # fmt: skip
    if ended is not None:
        data["ended"] = {"type": ended.how, "at": when(ended.at), "message": str(ended)}
    return data


async def waiting(client: Client, description: WorkflowExecutionDescription) -> list[dict[str, Any]]:
    """What a running session waits for a worker to take (`waiting`, corral's field: shown only while there is
    something, so that a session that runs freely looks exactly as upstream's); nothing for one that has ended."""
    if description.status not in _OPEN:
        return []
    now = datetime.now(UTC)
    return [waiting_view(wait, now) for wait in await session_waits(client, description, now)]


def waiting_view(wait: Waiting, now: datetime) -> dict[str, Any]:
    """One task the session waits for a worker to take, with its queue's figures (approximate: corral/queues.py)."""
    return {
        "type": "activity" if wait.kind == "activity" else "workflow_task",
        "activity_type": wait.activity_type,
        "role": wait.role,
        "task_queue": wait.queue,
        "since": when(wait.since),
        "waited_seconds": round(wait.waited(now).total_seconds(), 3),
        "approximate_tasks_ahead": wait.ahead(now),
        "queue": {
            "approximate_backlog": wait.backlog(),
            "oldest_seconds": round(wait.oldest(now).total_seconds(), 3),
            "workers_polling": wait.load.pollers,
        },
    }


def api_status(memo: Mapping[str, Any], closed: datetime | None, info: SessionInfo | None,
               attributes: TypedSearchAttributes) -> str:  # fmt: skip
    """The session's `status` (see the module's docstring for each case)."""
    if closed is not None or memo.get("archived_at"):
        return "terminated"
    status = (info.status if info is not None else attributes.get(STATUS_KEY)) or "idle"
    return status if status in SESSION_STATUSES else "idle"


def session_view(session_id: str, memo: Mapping[str, Any], started: datetime | None, closed: datetime | None,
                 info: SessionInfo | None, attributes: TypedSearchAttributes) -> dict[str, Any]:  # fmt: skip
    usage = info.usage if info is not None else None
    return {
        "id": session_id,
        "type": "session",
        "status": api_status(memo, closed, info, attributes),
        "agent": {key: value for key, value in (memo.get("agent") or {}).items() if key not in AGENT_ONLY},
        "environment_id": memo.get("environment_id"),
        "title": memo.get("title"),
        "metadata": memo.get("metadata") or {},
        "vault_ids": memo.get("vault_ids") or [],
        "resources": memo.get("resources") or [],
        "budget": memo.get("budget"),
        "deployment_id": memo.get("deployment_id"),
        "outcome_evaluations": [evaluation.model_dump(mode="json") for evaluation in info.outcome_evaluations]
        if info is not None
        else [],
        "created_at": when(started),
        "updated_at": when(closed or started),
        "archived_at": memo.get("archived_at"),
        "stats": {"duration_seconds": (closed - started).total_seconds() if closed and started else None},
        "usage": {
            "input_tokens": usage.input_tokens if usage else 0,
            "output_tokens": usage.output_tokens if usage else 0,
            "cache_read_input_tokens": usage.cache_read_input_tokens if usage else 0,
            "cache_creation": {"ephemeral_5m_input_tokens": usage.cache_creation_input_tokens if usage else 0},
            "list_cost": {"amount": str(info.list_cost), "currency": "USD"}
            if info is not None and info.list_cost is not None
            else None,
        },
    }
