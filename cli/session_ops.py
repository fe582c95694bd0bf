"""What the session commands do, apart from option parsing: build a start input, read, follow, list, send.

Kept free of typer so `corral demo` can chain them and tests can call them directly.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from rich.text import Text
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from cli.context import CliError, Settings
from cli.render import EventRenderer
from corral.client import SessionClosed, follow_events, read_events, session_end
from corral.contract.events import SessionEvent
from corral.contract.search_attributes import MODEL_KEY, STATUS_KEY
from corral.contract.session import SessionInput
from corral.errors import SessionStartFailed
from corral.names import (
    SEARCH_ATTRIBUTE_STATUS,
    SESSION_WORKFLOW,
)

if TYPE_CHECKING:
    from cli.live import LiveText

UTILITY_TOOLSET = {"type": "corral_utility"}
SANDBOX_TOOLSET = {"type": "agent_toolset_20260401"}


def _toggle(tools: list[Any], entry: dict[str, str], on: bool) -> list[Any]:
    """Add or remove one toolset entry (matched by its type), leaving the other tools alone."""
    present = any(isinstance(t, dict) and t.get("type") == entry["type"] for t in tools)
    if on and not present:
        return [*tools, entry]
    if not on:
        return [t for t in tools if not (isinstance(t, dict) and t.get("type") == entry["type"])]
    return tools


def describe_validation_error(error: ValidationError) -> str:
    """One line per problem, `field.path: message`, as a person fixing a JSON file needs it."""
    lines = []
    for problem in error.errors():
        where = ".".join(str(part) for part in problem["loc"]) or "(top level)"
        lines.append(f"  {where}: {problem['msg']}")
    return "\n".join(lines)


def load_input_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", exit_code=2) from None
    except UnicodeDecodeError as exc:
        raise CliError(
            f"{path} is not UTF-8 text: byte {exc.start} is {exc.object[exc.start : exc.start + 1]!r}", exit_code=2
        ) from None
    except json.JSONDecodeError as exc:
        raise CliError(f"{path} is not valid JSON: {exc}", exit_code=2) from None
    except RecursionError:
        raise CliError(f"{path} is nested too deep to read as JSON", exit_code=2) from None
    if not isinstance(data, dict):
        raise CliError(f"{path} must hold one JSON object (a SessionInput), not {type(data).__name__}", exit_code=2)
    return data


def build_session_input(
    base: dict[str, Any] | None,
    *,
    default_model: str,
    message: str | None = None,
    model: str | None = None,
    system: str | None = None,
    title: str | None = None,
    tool_utility: bool | None = None,
    toolset: bool | None = None,
    from_file: bool | None = None,
) -> SessionInput:
    """Merge command-line options over an --input file and validate the result as `SessionInput`.

    Without a file the utility tools and the sandbox toolset are on unless --no-tool-utility / --no-toolset; with
    a file, tools come from the file and those options only change them when given. A missing agent.model gets
    the default.
    """
    if from_file is None:
        from_file = base is not None
    data: dict[str, Any] = dict(base or {})
    agent = data.get("agent")
    agent = dict(agent) if isinstance(agent, dict) else ({} if agent is None else agent)
    if isinstance(agent, dict):
        if model:
            agent["model"] = model
        agent.setdefault("model", default_model)
        if system is not None:
            agent["system"] = system
        tools = agent.get("tools") or []
        if isinstance(tools, list):
            for entry, on in ((UTILITY_TOOLSET, tool_utility), (SANDBOX_TOOLSET, toolset)):
                if on is not None or not from_file:  # a file's own tools stay unless an option is given
                    tools = _toggle(tools, entry, True if on is None else on)
            agent["tools"] = tools
    data["agent"] = agent
    if message is not None:
        data["message"] = message
    if title is not None:
        data["title"] = title
    try:
        return SessionInput.model_validate(data)
    except ValidationError as exc:
        raise CliError(
            f"invalid session input ({exc.error_count()} problem{'s' if exc.error_count() != 1 else ''}):\n"
            + describe_validation_error(exc),
            exit_code=2,
        ) from None


@contextlib.asynccontextmanager
async def explained(handle: WorkflowHandle) -> AsyncIterator[None]:
    """Turn a refused query or update into what is true of the session: it does not exist, or it is closed (and
    how), rather than Temporal's wording ("WorkflowId is not set", "closed before WorkflowTaskStarted")."""
    try:
        yield
    except RPCError as error:
        if error.status not in (
            RPCStatusCode.NOT_FOUND,
            RPCStatusCode.FAILED_PRECONDITION,
            RPCStatusCode.INVALID_ARGUMENT,
        ):
            raise
        try:
            description = await handle.describe()
        except RPCError as describe_error:
            if describe_error.status == RPCStatusCode.NOT_FOUND:
                raise CliError(f"no session {handle.id}", hint="`corral ls` lists the sessions") from None
            raise error from None
        status = workflow_status_name(description.status)
        if description.status in (None, WorkflowExecutionStatus.RUNNING):
            raise
        closed = f" at {description.close_time.astimezone():%Y-%m-%d %H:%M:%S}" if description.close_time else ""
        raise CliError(
            f"session {handle.id} is {status.lower()} (closed{closed}) and cannot answer: {error.message}",
            hint="its workflow history is still in Temporal: "
            f"`temporal workflow show --workflow-id {handle.id}` prints it",
        ) from None


ENDED_EXIT_CODE = 3
"""The exit code of a read (`corral events`, `tail`, `export`, `context`) that printed what a session's log holds,
of a session whose workflow has ended (failed, terminated, timed out): the output is whole, and a script still
learns that the session is over and why."""


async def report_end(handle: WorkflowHandle) -> None:
    """After a read printed what it could: if the session's workflow has ended, say how, when and why (a CliError
    with `ENDED_EXIT_CODE`); nothing while it runs."""
    ended = await session_end(handle)
    if ended is not None:
        raise CliError(
            f"{ended}; nothing more will happen in it",
            hint=f"its workflow history is still in Temporal: `temporal workflow show --workflow-id {handle.id}`",
            exit_code=ENDED_EXIT_CODE,
        )


async def log_to_read(settings: Settings, session: str, thread: str | None) -> tuple[WorkflowHandle, WorkflowHandle]:
    """The session's handle, and the handle of the log to read: the session's, or its thread's (`thread_log_of`). A
    thread id given as the session is refused before Temporal is asked anything."""
    from cli.app import client_of

    if thread is not None:
        refuse_thread_as_session(session)
    client = await client_of(settings)
    return client.get_workflow_handle(session), await thread_log_of(client, session, thread)


async def thread_log_of(client: Client, session: str, thread: str | None) -> WorkflowHandle:
    """The handle whose log `corral events` and `tail` read: the session's, or with `thread`, that thread's once the
    session lists it (a thread id alone is never trusted). A thread id the session does not have is a CliError."""
    from corral.threads import is_thread_id, session_thread, thread_log

    handle = client.get_workflow_handle(session)
    if thread is None:
        return handle
    refuse_thread_as_session(session)
    if not is_thread_id(thread):
        raise CliError(f"{thread!r} is not a thread id (sthr_…)", exit_code=2)
    async with explained(handle):
        found = await session_thread(handle, thread)
    if found is None:
        raise CliError(
            f"session {session} has no thread {thread}", hint=f"`corral threads {session}` lists them", exit_code=2
        )
    return thread_log(client, handle, thread)


def refuse_thread_as_session(session: str) -> None:
    """A thread's id where its session's belongs is a CliError: a session's threads are listed by the session."""
    from corral.threads import is_thread_id

    if is_thread_id(session):
        raise CliError(
            f"{session} is a thread id, not a session id",
            hint="give the id of the session it belongs to (sesn_…); `corral ls` lists the sessions",
            exit_code=2,
        )


INPUT_TYPES = ["user.message", "agent.thread_message_received"]
"""What starts a turn: a user's message, or (in a multi-agent session) a message from another thread."""


@dataclass
class TailResult:
    """What a tail saw, and why it stopped."""

    events: list[SessionEvent]
    reason: str


async def tail(
    handle: WorkflowHandle,
    renderer: EventRenderer,
    *,
    after: int = 0,
    forever: bool = False,
    stream_url: str | None = None,
) -> TailResult:
    """Print the events after `after`, then follow new ones.

    Stops at the first `session.status_idle` positioned after the last input (`INPUT_TYPES`: the reply to the latest
    input is complete — already, or once it arrives), at `session.status_terminated`, or when the workflow
    closes. With `forever`, only a closed workflow (or Ctrl-C) stops it. With `stream_url` (the stack's stream
    relay), the model's text is printed live as it is produced.
    """
    from cli.live import LiveText, following  # the stream client: only for a tail

    live = None
    if stream_url:
        before = await read_events(handle, before=after + 1, types=["span.model_request_start"])
        live = LiveText(renderer.console, ignore={event.id for event in before})
    async with following(live, stream_url, handle.id):
        return await _tail(handle, renderer, after, forever, live)


async def _tail(
    handle: WorkflowHandle, renderer: EventRenderer, after: int, forever: bool, live: LiveText | None
) -> TailResult:
    seen: list[SessionEvent] = []
    messages = await read_events(handle, types=INPUT_TYPES)
    last_user = messages[-1].position if messages else 0
    try:
        async with contextlib.aclosing(follow_events(handle, after=after)) as events:
            async for event in events:
                seen.append(event)
                if live is not None:
                    live.close_line()
                    if live.already_shown(event):
                        line = f"{event.position:>4}  agent.message  (streamed above)"
                        renderer.console.print(Text(line, style="dim"))
                        continue
                renderer.print(event)
                if live is not None and event.type == "span.model_request_start":
                    live.release(event.id)
                if event.type in INPUT_TYPES:
                    last_user = max(last_user, event.position)
                if event.type == "session.status_terminated":
                    return TailResult(seen, "terminated")
                if not forever and event.type == "session.status_idle" and event.position > last_user:
                    return TailResult(seen, "idle")
    except SessionClosed as closed:  # a terminate writes no event: only the workflow's history tells
        return TailResult(seen, f"workflow {workflow_status_name(closed.status)}")
    raise AssertionError("follow_events stops only by raising SessionClosed")


def workflow_status_name(status: WorkflowExecutionStatus | None) -> str:
    return status.name.replace("_", " ").capitalize() if status is not None else "Unknown"


def sessions_query(status: str | None) -> str:
    """The visibility query `corral ls` runs; the same text works in the Web UI and `temporal workflow list`. A
    session that continued as new is listed once, by its current run; a session's threads, which are its child
    workflows of the same type, are not sessions (`corral threads SESSION` lists them)."""
    query = f"WorkflowType='{SESSION_WORKFLOW}' AND ExecutionStatus!='ContinuedAsNew' AND ParentWorkflowId IS NULL"
    if status:
        query += f" AND {SEARCH_ATTRIBUTE_STATUS}='{status}'"
    return query


async def list_sessions(client: Client, query: str, limit: int) -> list[tuple[str, str, str, datetime | None, str]]:
    """One row per session. A closed workflow's session is `terminated`, whatever status it last wrote (a
    terminate or a timeout writes none); one that failed says so, "failed at start" when its input was refused
    (it never ran, so it wrote no status at all)."""
    rows: list[tuple[str, str, str, datetime | None, str]] = []
    async for execution in client.list_workflows(query, limit=limit):
        attributes = execution.typed_search_attributes
        status = attributes.get(STATUS_KEY) or "—"
        workflow = workflow_status_name(execution.status)
        if execution.status not in (None, WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW):
            status = "terminated"
        if execution.status == WorkflowExecutionStatus.FAILED:
            ended = await session_end(client.get_workflow_handle(execution.id, run_id=execution.run_id))
            if isinstance(ended, SessionStartFailed):
                workflow = "Failed at start"
        rows.append((execution.id, status, attributes.get(MODEL_KEY) or "—", execution.start_time, workflow))
    return rows
