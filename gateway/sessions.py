"""Sessions and their events over HTTP: a session is a `SessionWorkflow` whose log is its events.

Workspaces: a session started here carries the `CorralWorkspace` search attribute, and every request checks it,
answering 404 for another workspace's session. The agent (the version pinned at creation) and the environment id
ride in the workflow's memo, so a listing needs no query per session.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ApplicationError

from corral.client import (
    new_session_id,
    read_events,
    send_events,
    session_info,
    start_session,
)
from corral.contract.events import SessionEvent
from corral.contract.pricing import PRICES_ENVIRONMENT_VARIABLE, NotBudgetable, parse_prices, price_in_force
from corral.contract.records import SEARCH_ATTRIBUTE_WORKSPACE
from corral.contract.session import SendEventsInput, SessionBudget, SessionInput, parse_user_events
from corral.names import SESSION_WORKFLOW
from corral.records import Records, RecordView
from gateway.errors import ApiError, invalid
from gateway.hands import check_hands, check_session_hands
from gateway.http import Authed, body
from gateway.owned import WORKSPACE_KEY, id_of, own_record, own_session, sessions_made_by
from gateway.repositories import (
    forget_repository_tokens,
    repository_views,
    session_repositories,
    store_repository_tokens,
)
from gateway.session_status import SESSION_STATUSES, STATUS_KEY, api_status, refuse_if_ended, session_view, view
from gateway.shapes import (
    agent_body,
    agent_config,
    agent_view,
    budget_limit,
    check_metadata,
    environment_recipe,
    event_view,
)
from gateway.stream import stream_events
from gateway.vaults import check_vault_ids

MAX_LIMIT = 1000
DEFAULT_LIMIT = 20


OVERRIDABLE = frozenset({"model", "system", "tools", "mcp_servers", "skills"})
"""What an `agent_with_overrides` may replace (skills are refused, as they are on agents)."""


class Sessions:
    """The session endpoints, over one Temporal client."""

    def __init__(self, client: Client, records: Records, harness_queue: str, model_queue: str) -> None:
        self.client = client
        self.records = records
        self.harness_queue = harness_queue
        self.model_queue = model_queue

    # ---- lookups --------------------------------------------------------------------------------------------

    async def _own(self, workspace: str, session_id: str) -> tuple[WorkflowHandle, WorkflowExecutionDescription]:
        return await own_session(self.client, workspace, session_id)

    async def _view(self, handle: WorkflowHandle, description: WorkflowExecutionDescription) -> dict[str, Any]:
        return await view(handle, description)  # gateway/session_status.py: a status true at every point

    # ---- endpoints ------------------------------------------------------------------------------------------

    async def create(self, workspace: str, request: dict[str, Any]) -> dict[str, Any]:
        known = {"agent", "environment_id", "title", "metadata", "vault_ids", "resources", "initial_events", "budget"}
        unknown = sorted(set(request) - known)
        if unknown:
            raise invalid(f"unknown session field(s): {', '.join(unknown)}")
        repositories = session_repositories(request.get("resources"))  # checked here; their tokens go to Vault
        agent = await self._agent(workspace, request.get("agent"))
        await check_hands(self.records, workspace, agent.body.get("tools"), "agent.tools", self.own_queues())
        environment_id = request.get("environment_id")
        if environment_id is None:
            raise invalid("environment_id is required")
        environment = await own_record(self.records, workspace, environment_id, "environment", "environment_id")
        if environment.archived_at is not None:
            raise ApiError(400, f"environment {environment_id!r} is archived", error_code="environment_archived")
        initial = request.get("initial_events") or []
        if not isinstance(initial, list) or len(initial) > 50:
            raise invalid("initial_events must be a list of at most 50 events")
        _check_initial_events(initial)  # before the session exists: a refused create leaves nothing behind
        title = request.get("title")
        if title is not None and not isinstance(title, str):
            raise invalid("title must be a string")
        vault_ids = request.get("vault_ids") or []
        if not isinstance(vault_ids, list) or not all(isinstance(v, str) for v in vault_ids):
            raise invalid("vault_ids must be a list of vault ids")
        await check_vault_ids(self.records, workspace, vault_ids)
        budget = _session_budget(request.get("budget"), agent.body)
        try:
            input = SessionInput(
                agent=agent_config(agent.body),
                title=title,
                metadata=check_metadata(request.get("metadata")),
                environment=environment_recipe(environment.body),
                vault_ids=vault_ids,
                resources=[repository.resource for repository in repositories],
                model_task_queue=self.model_queue,
                budget=budget,
            )
        except ValidationError as exc:
            raise invalid(str(exc)) from exc
        snapshot = agent_view(agent.id, agent.version, agent.body, agent.created_at, agent.updated_at, None)
        resources = repository_views(repositories)  # the view never has a token
        memo = {"agent": snapshot, "environment_id": environment_id, "vault_ids": vault_ids, "title": title,
                "metadata": input.metadata, "resources": resources,
                "budget": budget.model_dump(mode="json", exclude={"price"}) if budget else None}  # fmt: skip
        session_id = new_session_id()
        await store_repository_tokens(session_id, repositories)  # before the start, as `corral start --repo` does
        try:
            handle = await start_session(
                self.client,
                input,
                session_id=session_id,
                task_queue=self.harness_queue,
                search_attributes=TypedSearchAttributes(
                    [SearchAttributePair(WORKSPACE_KEY, workspace), SearchAttributePair(STATUS_KEY, "idle")]
                ),
                memo=memo,
            )
        except BaseException:
            await forget_repository_tokens(session_id, repositories)
            raise
        if initial:
            await self._send(handle, initial)
        handle, description = await self._own(workspace, handle.id)
        return {**await self._view(handle, description), "resources": resources}

    async def _agent(self, workspace: str, reference: Any) -> RecordView:
        """The agent version a session runs: by id (the latest), `{type: "agent", id, version}`, or
        `{type: "agent_with_overrides", id, version?, model?, system?, tools?, mcp_servers?}`, whose fields replace
        the agent's for this session only (the agent itself is unchanged)."""
        overrides: dict[str, Any] | None = None
        kind = reference.get("type", "agent") if isinstance(reference, dict) else None
        if isinstance(reference, str):
            agent_id, version = reference, None
        elif isinstance(reference, dict) and kind in ("agent", "agent_with_overrides") and reference.get("id"):
            agent_id, version = reference["id"], reference.get("version")
            if version is not None and (not isinstance(version, int) or version < 1):
                raise invalid("agent.version must be a positive integer")
            if kind == "agent_with_overrides":
                overrides = {key: value for key, value in reference.items() if key not in ("type", "id", "version")}
                unknown = sorted(set(overrides) - OVERRIDABLE)
                if unknown:
                    raise invalid(
                        f"agent: {', '.join(unknown)} cannot be overridden (only {', '.join(sorted(OVERRIDABLE))})"
                    )
        else:
            raise invalid(
                "agent must be an agent id, {type: 'agent', id, version} or {type: 'agent_with_overrides', id, ...}"
            )
        field = "agent" if isinstance(reference, str) else "agent.id"
        agent = await own_record(self.records, workspace, agent_id, "agent", field, version)
        if agent.archived_at is not None:
            raise invalid(f"agent {agent_id!r} is archived")
        if overrides is not None:
            agent = agent.model_copy(update={"body": agent_body(overrides, current=agent.body)})
        return agent

    async def retrieve(self, workspace: str, session_id: str) -> dict[str, Any]:
        handle, description = await self._own(workspace, session_id)
        return await self._view(handle, description)

    async def list_sessions(self, workspace: str, params: Any) -> dict[str, Any]:
        limit = _limit(params.get("limit"))
        order = params.get("order", "desc")
        if order not in ("asc", "desc"):
            raise invalid("order must be asc or desc")
        clauses = [f"WorkflowType = '{SESSION_WORKFLOW}'", f"{SEARCH_ATTRIBUTE_WORKSPACE} = '{workspace}'"]
        made_by = await sessions_made_by(self.records, workspace, params)
        statuses = set(params.getlist("statuses[]"))
        bad = sorted(statuses - SESSION_STATUSES)
        if bad:
            raise invalid(f"statuses[]: unknown status {', '.join(bad)}")
        for key, operator in (("gt", ">"), ("gte", ">="), ("lt", "<"), ("lte", "<=")):
            value = params.get(f"created_at[{key}]")
            if value is not None:
                clauses.append(f"StartTime {operator} '{_timestamp(value, f'created_at[{key}]')}'")
        after = _cursor(params["page"]) if params.get("page") else None
        query = " AND ".join(clauses)
        # Every matching session's listing entry (no query per session), sorted here: the dev server's visibility
        # has no ORDER BY. Fine for the thousands of sessions of a workspace; a cluster with advanced visibility
        # could push the order and the cursor into the query.
        found = [execution async for execution in self.client.list_workflows(query)]
        found.sort(key=lambda e: (e.start_time, e.id), reverse=order == "desc")
        if after is not None:
            found = [e for e in found if ((e.start_time.isoformat(), e.id) < after) == (order == "desc")
                     and (e.start_time.isoformat(), e.id) != after]  # fmt: skip
        include_archived = (params.get("include_archived") or "").lower() in ("true", "1")
        shown = [(execution, await execution.memo()) for execution in found]
        shown = [(e, memo) for e, memo in shown if include_archived or not memo.get("archived_at")]
        shown = [(e, memo) for e, memo in shown if made_by(memo.get("agent") or {})]
        if statuses:  # the status the view shows (a closed or archived session is terminated, whatever it last wrote)
            shown = [(e, memo) for e, memo in shown
                     if api_status(memo, e.close_time, None, e.typed_search_attributes) in statuses]  # fmt: skip
        data = [
            session_view(e.id, memo, e.start_time, e.close_time, None, e.typed_search_attributes)
            for e, memo in shown[:limit]
        ]
        last = shown[limit - 1][0] if len(shown) > limit else None
        next_page = _make_cursor(last.start_time, last.id) if last is not None else None
        return {"data": data, "next_page": next_page, "prev_page": None}

    # ---- events ---------------------------------------------------------------------------------------------

    async def list_events(self, workspace: str, session_id: str, params: Any) -> dict[str, Any]:
        handle, _ = await self._own(workspace, session_id)
        limit = _limit(params.get("limit"))
        order = params.get("order", "asc")
        if order not in ("asc", "desc"):
            raise invalid("order must be asc or desc")
        types = params.getlist("types[]") or None
        bounds = {key: _timestamp(params[f"created_at[{key}]"], f"created_at[{key}]")
                  for key in ("gt", "gte", "lt", "lte") if params.get(f"created_at[{key}]") is not None}  # fmt: skip
        page = params.get("page")
        position = _position(page) if page else None
        if order == "asc":
            events = await read_events(handle, after=position or 0, types=types, limit=limit + 1)
        else:
            events = await self._backwards(handle, position, types, limit + 1)
        more = len(events) > limit
        events = events[:limit]
        next_page = _make_position(events[-1].position) if more and events else None
        data = [event_view(event) for event in events if _within(event_view(event), bounds)]
        return {"data": data, "next_page": next_page}

    async def _backwards(
        self, handle: WorkflowHandle, before: int | None, types: list[str] | None, count: int
    ) -> list[SessionEvent]:
        """The `count` events before position `before` (default: the end), newest first."""
        if before is None:
            before = (await session_info(handle)).last_position + 1
        found: list[SessionEvent] = []
        window = 1000
        end = before
        while end > 1 and len(found) < count:
            start = max(0, end - 1 - window)
            chunk = await read_events(handle, after=start, before=end, types=types)
            found.extend(reversed(chunk))
            end = start + 1
        return found[:count]

    async def send(self, workspace: str, session_id: str, request: dict[str, Any]) -> dict[str, Any]:
        handle, description = await self._own(workspace, session_id)
        await refuse_if_ended(handle, description)  # 410, saying how and when it ended
        events = request.get("events")
        if not isinstance(events, list) or not events:
            raise invalid("events must be a non-empty list")
        memo = await description.memo()
        await check_session_hands(self.records, workspace, session_id, memo, events, self.own_queues())
        return {"data": await self._send(handle, events)}

    def own_queues(self) -> tuple[str, str]:
        """The task queues of this gateway's own workers, which no hand may name."""
        return self.harness_queue, self.model_queue

    async def _send(self, handle: WorkflowHandle, events: list[Any]) -> list[dict[str, Any]]:
        """Send a batch through the `send_events` update (validated as a whole by the session: all or nothing),
        and answer with the events as they were written."""
        before = (await session_info(handle)).last_position
        try:
            ids = await send_events(handle, [_corral_event(event, index) for index, event in enumerate(events)])
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            message = cause.message if isinstance(cause, ApplicationError) else str(cause or exc)
            raise invalid(message) from exc
        written = {event.id: event for event in await read_events(handle, after=before) if event.id in set(ids)}
        return [event_view(written[event_id]) for event_id in ids if event_id in written]


def _session_budget(raw: Any, agent: Mapping[str, Any]) -> SessionBudget | None:
    """The session's budget with the price in force for its model copied in (the table's, or `CORRAL_MODEL_PRICES`'s
    read here, never by the session); a model with no price is refused, as upstream does."""
    budget = budget_limit(raw)
    if budget is None:
        return None
    model = agent_config(dict(agent)).model
    try:
        price = price_in_force(model, parse_prices(os.environ.get(PRICES_ENVIRONMENT_VARIABLE)))
    except NotBudgetable as exc:
        raise ApiError(400, f"budget: {exc}", error_code="model_not_budgetable") from exc
    return budget.model_copy(update={"price": price})


def _check_initial_events(events: list[Any]) -> None:
    """A session's `initial_events`: user messages (and outcomes upstream, which corral does not take yet), checked
    as a sent batch would be."""
    if not events:
        return
    try:
        parse_user_events(SendEventsInput(events=events))
    except (ValueError, ValidationError) as exc:
        raise invalid(f"initial_{exc}" if str(exc).startswith("events") else f"initial_events: {exc}") from None
    for index, event in enumerate(events):
        if event.get("type") != "user.message":
            raise invalid(f"initial_events[{index}]: a session starts with user.message events only")


def _corral_event(event: Any, index: int) -> dict[str, Any]:
    """A sent event in the form corral's `send_events` takes (the same vocabulary); the event ids it names are
    event ids (the session itself says whether it has them)."""
    if not isinstance(event, dict):
        raise invalid("each event must be an object")
    for field in ("tool_use_id", "custom_tool_use_id"):
        if field in event:
            id_of(event[field], f"events[{index}].{field}", "event")
    return dict(event)


def _limit(value: str | None) -> int:
    if value is None:
        return DEFAULT_LIMIT
    try:
        limit = int(value)
    except ValueError as exc:
        raise invalid("limit must be a whole number") from exc
    if not 1 <= limit <= MAX_LIMIT:
        raise invalid(f"limit must be from 1 to {MAX_LIMIT}")
    return limit


def _timestamp(value: str, where: str) -> str:
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise invalid(f"{where}: not an RFC 3339 time: {value!r}") from exc
    return moment.isoformat()


def _within(data: dict[str, Any], bounds: dict[str, str]) -> bool:
    if not bounds:
        return True
    moment = datetime.fromisoformat(str(data.get("processed_at") or data.get("created_at")).replace("Z", "+00:00"))
    checks = {"gt": lambda b: moment > b, "gte": lambda b: moment >= b, "lt": lambda b: moment < b,
              "lte": lambda b: moment <= b}  # fmt: skip
    return all(checks[key](datetime.fromisoformat(value)) for key, value in bounds.items())


def _make_position(position: int) -> str:
    return base64.urlsafe_b64encode(f"p{position}".encode()).decode()


def _position(page: str) -> int:
    try:
        text = base64.urlsafe_b64decode(page.encode()).decode()
        if text.startswith("p"):
            return int(text[1:])
    except (ValueError, UnicodeDecodeError):
        pass
    raise invalid("page: not a cursor this list gave")


def _make_cursor(moment: datetime, session_id: str) -> str:
    return base64.urlsafe_b64encode(f"t{moment.isoformat()} {session_id}".encode()).decode()


def _cursor(page: str) -> tuple[str, str]:
    """The (start time, session id) a sessions page ended at."""
    try:
        text = base64.urlsafe_b64decode(page.encode()).decode()
        moment, session_id = text[1:].split(" ", 1)
        if text.startswith("t"):
            return datetime.fromisoformat(moment).isoformat(), session_id
    except (ValueError, UnicodeDecodeError):
        pass
    raise invalid("page: not a cursor this list gave")


def session_routes(gateway: Any, authed: Authed) -> list[Route]:
    """Sessions and their events (`gateway` is the app's `Gateway`, which holds the `Sessions`)."""
    sessions: Sessions = gateway.sessions

    async def create(request: Request, workspace: str) -> Response:
        return JSONResponse(await sessions.create(workspace, await body(request)))

    async def retrieve(request: Request, workspace: str) -> Response:
        return JSONResponse(await sessions.retrieve(workspace, request.path_params["id"]))

    async def listing(request: Request, workspace: str) -> Response:
        return JSONResponse(await sessions.list_sessions(workspace, request.query_params))

    async def list_events(request: Request, workspace: str) -> Response:
        return JSONResponse(await sessions.list_events(workspace, request.path_params["id"], request.query_params))

    async def send_events(request: Request, workspace: str) -> Response:
        return JSONResponse(await sessions.send(workspace, request.path_params["id"], await body(request)))

    async def stream(request: Request, workspace: str) -> Response:
        handle, _ = await sessions._own(workspace, request.path_params["id"])
        return await gateway.streams.open(request.state.key_id, lambda: stream_events(handle, request))

    return [
        Route("/v1/sessions", authed(create), methods=["POST"]),
        Route("/v1/sessions", authed(listing), methods=["GET"]),
        Route("/v1/sessions/{id}", authed(retrieve), methods=["GET"]),
        Route("/v1/sessions/{id}/events", authed(list_events), methods=["GET"]),
        Route("/v1/sessions/{id}/events", authed(send_events), methods=["POST"]),
        Route("/v1/sessions/{id}/events/stream", authed(stream), methods=["GET"]),
    ]
