"""A session's events over HTTP: listed from its log, sent through its `send_events` update, streamed over SSE
(`gateway/stream.py`). The log is the session's (`corral.client.read_events`): one across its workflow runs.

A send costs two Temporal round trips: the session's description (its kind and workspace, whether it has ended,
its agent's hands) and the update, which answers with the events it wrote.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from corral.client import read_events, send_batch, session_info
from corral.contract.events import SessionEvent
from corral.names import OUTCOME_IN_PROGRESS, refusal_type
from gateway.errors import ApiError, invalid
from gateway.file_rubrics import resolve_file_rubrics
from gateway.hands import check_session_hands
from gateway.http import Authed, body
from gateway.owned import id_of, own_session
from gateway.pages import page_limit, position_cursor, position_of, timestamp, within
from gateway.session_status import refuse_if_ended
from gateway.shapes import event_view
from gateway.stream import stream_events

if TYPE_CHECKING:
    from gateway.app import Gateway

REFUSAL_CODES = {OUTCOME_IN_PROGRESS: "outcome_in_progress"}
"""The `error_code` of a send the session refused for a reason a client may act on (a 400 all the same)."""
READ_BACK = 1000
"""How far back from a log's end a send looks for the events it wrote, when the worker does not say them."""


class Events:
    """The event endpoints of the sessions of one gateway."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def list_events(self, workspace: str, session_id: str, params: Any) -> dict[str, Any]:
        handle, _ = await own_session(self.gateway.client, workspace, session_id)
        limit = page_limit(params.get("limit"))
        order = params.get("order", "asc")
        if order not in ("asc", "desc"):
            raise invalid("order must be asc or desc")
        types = params.getlist("types[]") or None
        bounds = {key: timestamp(params[f"created_at[{key}]"], f"created_at[{key}]")
                  for key in ("gt", "gte", "lt", "lte") if params.get(f"created_at[{key}]") is not None}  # fmt: skip
        page = params.get("page")
        position = position_of(page) if page else None
        if order == "asc":
            events = await read_events(handle, after=position or 0, types=types, limit=limit + 1)
        else:
            events = await newest_events(handle, position, types, limit + 1)
        more = len(events) > limit
        events = events[:limit]
        next_page = position_cursor(events[-1].position) if more and events else None
        data = [event_view(event) for event in events if within(event_view(event), bounds)]
        return {"data": data, "next_page": next_page}

    async def send(self, workspace: str, session_id: str, request: dict[str, Any]) -> dict[str, Any]:
        handle, description = await own_session(self.gateway.client, workspace, session_id)
        await refuse_if_ended(handle, description)  # 410, saying how and when it ended
        events = request.get("events")
        if not isinstance(events, list) or not events:
            raise invalid("events must be a non-empty list")
        events = await resolve_file_rubrics(self.gateway.files, workspace, events, "events")
        memo = await description.memo()
        await check_session_hands(self.gateway.records, workspace, session_id, memo, events, self.gateway.own_queues())
        return {"data": await write_events(handle, events)}


async def newest_events(
    handle: WorkflowHandle, before: int | None, types: list[str] | None, count: int
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


async def write_events(handle: WorkflowHandle, events: list[Any]) -> list[dict[str, Any]]:
    """Send a batch through the `send_events` update (validated as a whole by the session: all or nothing),
    and answer with the events as they were written: the update's own answer, so no query reads them back."""
    try:
        result = await send_batch(handle, [_corral_event(event, index) for index, event in enumerate(events)])
    except WorkflowUpdateFailedError as exc:
        cause = exc.cause
        if not isinstance(cause, ApplicationError):
            raise invalid(str(cause or exc)) from exc
        raise ApiError(400, cause.message, error_code=REFUSAL_CODES.get(refusal_type(cause.type) or "")) from exc
    written = result.events
    if written is None:  # a worker older than `SendEventsResult.events`: read them back from the log's end
        written = await newest_events(handle, None, None, READ_BACK)
    found = {event.id: event for event in written}
    return [event_view(found[event_id]) for event_id in result.event_ids if event_id in found]


def _corral_event(event: Any, index: int) -> dict[str, Any]:
    """A sent event in the form corral's `send_events` takes (the same vocabulary); the event ids it names are
    event ids, and the thread an interrupt names is a thread id (the session itself says whether it has them)."""
    if not isinstance(event, dict):
        raise invalid("each event must be an object")
    for field in ("tool_use_id", "custom_tool_use_id"):
        if field in event:
            id_of(event[field], f"events[{index}].{field}", "event")
    if event.get("session_thread_id") is not None:  # whether the session has that thread is the session's to say
        id_of(event["session_thread_id"], f"events[{index}].session_thread_id", "session thread")
    return dict(event)


def event_routes(gateway: Gateway, authed: Authed) -> list[Route]:
    """A session's events: listed, sent, and streamed."""
    events = Events(gateway)

    async def list_events(request: Request, workspace: str) -> Response:
        return JSONResponse(await events.list_events(workspace, request.path_params["id"], request.query_params))

    async def send_events(request: Request, workspace: str) -> Response:
        return JSONResponse(await events.send(workspace, request.path_params["id"], await body(request)))

    async def stream(request: Request, workspace: str) -> Response:
        handle, _ = await own_session(gateway.client, workspace, request.path_params["id"])
        return await gateway.streams.open(request.state.key_id, lambda: stream_events(handle, request))

    worker = gateway.credentials.for_session  # a self-hosted worker's credentials reach these too (work_auth.py)
    return [
        Route("/v1/sessions/{id}/events", worker(list_events), methods=["GET"]),
        Route("/v1/sessions/{id}/events", worker(send_events), methods=["POST"]),
        Route("/v1/sessions/{id}/events/stream", worker(stream), methods=["GET"]),
    ]
