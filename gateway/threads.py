"""A multi-agent session's threads over HTTP: listed, read, archived, and each thread's own log, listed and
streamed (`client.beta.sessions.threads`).

Every route checks the session first (its kind and workspace, as every session route does), then that the thread id
is a thread id (400) that the session's `threads` query lists (404: a thread of another session, or of another
workspace's, is not found); only then is the thread's own workflow read. The primary thread's log is the session's;
another thread's is its workflow's, whose id is the thread id, and its live text is the relay's under that id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.client import WorkflowExecutionDescription, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from corral.client import read_events
from corral.contract.agent import AgentConfig
from corral.contract.events import SessionEvent
from corral.contract.threads import ThreadInfo
from corral.names import SESSION_STATUSES, THREAD_NOT_FOUND, refusal_type
from corral.threads import archive_thread, session_thread, session_threads, thread_log
from gateway.errors import ApiError, invalid
from gateway.http import Authed
from gateway.owned import id_of, own_session
from gateway.pages import MAX_LIMIT, page_limit, position_cursor, position_of
from gateway.session_status import AGENT_ONLY, refuse_if_ended
from gateway.shapes import _tool_view, event_view, when
from gateway.stream import stream_events

if TYPE_CHECKING:
    from gateway.app import Gateway

THREAD_KIND = "session thread"
"""The kind of a thread id (`corral.names.ID_KINDS`), as errors name it."""


def thread_not_found(thread_id: str) -> ApiError:
    return ApiError(404, f"session thread {thread_id!r} was not found", error_code="session_thread_not_found")


class OwnedThread:
    """A thread a request may read: its session (handle, description, memo) and what the session knows of it."""

    def __init__(self, session: WorkflowHandle, description: WorkflowExecutionDescription, memo: Mapping[str, Any],
                 info: ThreadInfo) -> None:  # fmt: skip
        self.session, self.description, self.memo, self.info = session, description, memo, info


class Threads:
    """The thread endpoints of one gateway."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def own_thread(self, workspace: str, session_id: str, thread_id: str) -> OwnedThread:
        """The thread, if the session is `workspace`'s (else 404) and lists it (else 404); 400 for an id of another
        kind in either place."""
        session, description = await own_session(self.gateway.client, workspace, session_id)
        thread_id = id_of(thread_id, "thread_id", THREAD_KIND)
        info = await session_thread(session, thread_id)
        if info is None:
            raise thread_not_found(thread_id)
        return OwnedThread(session, description, await description.memo(), info)

    async def list_threads(self, workspace: str, session_id: str, params: Any) -> dict[str, Any]:
        session, description = await own_session(self.gateway.client, workspace, session_id)
        limit = MAX_LIMIT if params.get("limit") is None else page_limit(params.get("limit"))
        statuses = set(params.getlist("statuses[]"))
        bad = sorted(statuses - SESSION_STATUSES)
        if bad:
            raise invalid(f"statuses[]: unknown status {', '.join(bad)}")
        after = position_of(params["page"]) if params.get("page") else 0
        memo = await description.memo()
        views = [thread_view(info, memo, description.close_time) for info in await session_threads(session)]
        shown = [view for view in views if not statuses or view["status"] in statuses]
        page = shown[after : after + limit]
        next_page = position_cursor(after + limit) if len(shown) > after + limit else None
        return {"data": page, "next_page": next_page}

    async def retrieve(self, workspace: str, session_id: str, thread_id: str) -> dict[str, Any]:
        owned = await self.own_thread(workspace, session_id, thread_id)
        return thread_view(owned.info, owned.memo, owned.description.close_time)

    async def archive(self, workspace: str, session_id: str, thread_id: str) -> dict[str, Any]:
        owned = await self.own_thread(workspace, session_id, thread_id)
        await refuse_if_ended(owned.session, owned.description)  # 410, saying how and when the session ended
        try:
            info = await archive_thread(owned.session, owned.info.id)
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            if not isinstance(cause, ApplicationError):
                raise invalid(str(exc)) from exc
            if refusal_type(cause.type) == THREAD_NOT_FOUND:
                raise thread_not_found(owned.info.id) from exc
            raise invalid(cause.message) from exc  # ThreadArchived (the primary thread), NotMultiagent, ...
        return thread_view(info, owned.memo, owned.description.close_time)

    async def list_events(self, workspace: str, session_id: str, thread_id: str, params: Any) -> dict[str, Any]:
        owned = await self.own_thread(workspace, session_id, thread_id)
        limit = page_limit(params.get("limit"))
        after = position_of(params["page"]) if params.get("page") else 0
        log = thread_log(self.gateway.client, owned.session, owned.info.id)
        events = await read_events(log, after=after, limit=limit + 1)
        more = len(events) > limit
        events = events[:limit]
        next_page = position_cursor(events[-1].position) if more and events else None
        view = own_event_view(owned.info)
        return {"data": [view(event) for event in events], "next_page": next_page}

    async def stream(self, request: Request, workspace: str) -> Response:
        params = request.path_params
        owned = await self.own_thread(workspace, params["id"], params["thread_id"])
        log = thread_log(self.gateway.client, owned.session, owned.info.id)
        view = own_event_view(owned.info)
        return await self.gateway.streams.open(request.state.key_id, lambda: stream_events(log, request, view))


THREAD_STATUS_TYPES = {
    "session.status_running": "session.thread_status_running",
    "session.status_idle": "session.thread_status_idle",
    "session.status_rescheduled": "session.thread_status_rescheduled",
    "session.status_terminated": "session.thread_status_terminated",
}
"""A child thread's own log holds a session's status events; its own stream names them as the thread's, as
upstream's does (with the thread's id and agent name)."""


def own_event_view(info: ThreadInfo) -> Callable[[SessionEvent], dict[str, Any]]:
    """How a thread's own events are shown: as a session's, but a child's statuses as the thread's."""

    def view(event: SessionEvent) -> dict[str, Any]:
        data = event_view(event)
        if info.parent_thread_id is not None and data["type"] in THREAD_STATUS_TYPES:
            data.update(type=THREAD_STATUS_TYPES[data["type"]], session_thread_id=info.id, agent_name=info.agent.name)
        return data

    return view


def thread_view(info: ThreadInfo, memo: Mapping[str, Any], closed: datetime | None) -> dict[str, Any]:
    """A thread as the API shows it (`session_thread`), from what its session knows of it, the session's memo (its
    agent snapshot) and when its workflow closed. An archived thread is terminated, and so is every thread of a
    session that has ended or is archived."""
    ended = closed is not None or bool(memo.get("archived_at")) or info.archived_at is not None
    status = "terminated" if ended else info.status
    end = info.archived_at or closed or datetime.now(UTC)
    duration = max(0.0, (end - info.created_at).total_seconds())
    usage = info.usage
    return {
        "type": "session_thread",
        "id": info.id,
        "session_id": info.session_id,
        "parent_thread_id": info.parent_thread_id,
        "workflow_run_id": info.workflow_run_id,
        "status": status,
        "agent": thread_agent_view(info, memo),
        "created_at": when(info.created_at),
        "updated_at": when(info.updated_at),
        "archived_at": when(info.archived_at),
        "stats": {
            "active_seconds": info.stats.active_seconds,
            "duration_seconds": duration,
            "startup_seconds": 0.0,
        },
        "usage": {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cache_read_input_tokens": usage.cache_read_input_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": usage.cache_creation_input_tokens,
                "ephemeral_1h_input_tokens": 0,
            },
            "server_tool_use": {"web_fetch_requests": 0, "web_search_requests": 0},
            "list_cost": {"amount": str(info.list_cost), "currency": "USD"} if info.list_cost is not None else None,
            "active_seconds": info.stats.active_seconds,
        },
    }


def thread_agent_view(info: ThreadInfo, memo: Mapping[str, Any]) -> dict[str, Any]:
    """What a thread runs, as the SDK's union has it: the session's agent snapshot for the primary thread and for
    the coordinator spawned as itself (`self`), a saved agent's snapshot at its pinned version, or an inline agent
    (no id or version). The multiagent roster is not repeated here (it is on `session.agent`)."""
    agent = info.agent
    if agent.type in ("primary", "self") and memo.get("agent"):
        snapshot = {key: value for key, value in memo["agent"].items() if key not in AGENT_ONLY}
        snapshot.pop("multiagent", None)
        return snapshot
    if agent.type == "agent":
        pinned = roster_snapshot(memo, agent.id, agent.version)
        if pinned is not None:
            return pinned
    view = config_view(agent.config, agent.name)
    if agent.type == "inline":
        return {"type": "inline", **view}
    return {"type": "agent", "id": agent.id, "version": agent.version, **view}


def roster_snapshot(memo: Mapping[str, Any], agent_id: str | None, version: int | None) -> dict[str, Any] | None:
    """The snapshot of a saved agent at a version as the session's resolved multiagent config shows it (its roster,
    or its predefined subagents), or None when it shows none (a session started by a Temporal client)."""
    multiagent = (memo.get("agent") or {}).get("multiagent") or {}
    if not isinstance(multiagent, dict):
        return None
    subagents = multiagent.get("subagents")
    predefined = subagents.get("predefined_agents") if isinstance(subagents, dict) else None
    for entry in [*(multiagent.get("agents") or []), *(predefined or [])]:
        if (
            isinstance(entry, dict)
            and entry.get("type") == "agent"
            and (entry.get("id"), entry.get("version"))
            == (
                agent_id,
                version,
            )
        ):
            return {key: value for key, value in entry.items() if key not in (*AGENT_ONLY, "multiagent")}
    return None


def config_view(config: AgentConfig, name: str) -> dict[str, Any]:
    """The fields an agent snapshot shows, from the configuration a thread runs."""
    return {
        "name": name,
        "description": None,
        "model": {"id": config.model, "speed": "standard", "effort": None, "inference_geo": None},
        "system": config.system,
        "tools": [_tool_view(tool.model_dump(mode="json", exclude_none=True)) for tool in config.tools],
        "skills": [],
        "mcp_servers": [server.model_dump(mode="json") for server in config.mcp_servers],
        "execution_identity": {"type": "service_account"},
    }


def thread_routes(gateway: Gateway, authed: Authed) -> list[Route]:
    """A session's threads: listed, read, archived; a thread's events listed and streamed."""
    threads = Threads(gateway)

    async def listing(request: Request, workspace: str) -> Response:
        return JSONResponse(await threads.list_threads(workspace, request.path_params["id"], request.query_params))

    async def retrieve(request: Request, workspace: str) -> Response:
        params = request.path_params
        return JSONResponse(await threads.retrieve(workspace, params["id"], params["thread_id"]))

    async def archive(request: Request, workspace: str) -> Response:
        params = request.path_params
        return JSONResponse(await threads.archive(workspace, params["id"], params["thread_id"]))

    async def list_events(request: Request, workspace: str) -> Response:
        params = request.path_params
        return JSONResponse(
            await threads.list_events(workspace, params["id"], params["thread_id"], request.query_params)
        )

    thread = "/v1/sessions/{id}/threads/{thread_id}"
    return [
        Route("/v1/sessions/{id}/threads", authed(listing), methods=["GET"]),
        Route(thread, authed(retrieve), methods=["GET"]),
        Route(thread + "/archive", authed(archive), methods=["POST"]),
        Route(thread + "/events", authed(list_events), methods=["GET"]),
        Route(thread + "/stream", authed(threads.stream), methods=["GET"]),
    ]
