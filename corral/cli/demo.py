"""`corral demo`: the first thing a new user runs. Up, one session with tools, followed live, then where to look.

It uses only what the other commands use (bring_up, start_session, send_text, tail), so a demo that works is
evidence that the commands work.
"""

from __future__ import annotations

import asyncio

from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from temporalio.client import WorkflowHandle

from corral.cli import session_ops, up
from corral.cli.context import CliError, Settings
from corral.cli.render import EventRenderer, blocks_text, compact_json, one_line
from corral.contract.events import AgentToolResult, AgentToolUse, SessionEvent
from corral.sessions import read_events, send_text, start_session
from corral.temporal import connect

DEMO_MESSAGE = "Hello! Please calculate 6*7 and then tell me the time with get_time."
"""The offline stand-in calls the first tool it sees named (`calculate`, with the clause after it: `6*7`); a real
model may call both tools."""
FOLLOW_UP_MESSAGES = (
    "please use get_time",
    # The first call of a sandbox tool is what provisions the container (lazily, never before).
    "now run bash uname -sr && id -un && pwd",
)
IDLE_TIMEOUT = 60.0


async def _until_idle(
    settings: Settings, handle: WorkflowHandle, renderer: EventRenderer, after: int
) -> list[SessionEvent]:
    """Follow until the reply is complete; a session that stays busy for a minute is a failed demo."""
    try:
        following = session_ops.tail(handle, renderer, after=after, stream_url=settings.stream_url())
        result = await asyncio.wait_for(following, IDLE_TIMEOUT)
    except TimeoutError:
        raise CliError(
            f"session {handle.id} did not reach idle within {IDLE_TIMEOUT:.0f} s",
            hint=f"see `corral events {handle.id}` and the worker logs in {settings.paths.logs}",
        ) from None
    if result.reason != "idle":
        raise CliError(f"session {handle.id} ended unexpectedly ({result.reason})")
    return result.events


def _tool_calls(events: list[SessionEvent]) -> list[tuple[AgentToolUse, AgentToolResult | None]]:
    results = {event.tool_use_id: event for event in events if isinstance(event, AgentToolResult)}
    return [(event, results.get(event.id)) for event in events if isinstance(event, AgentToolUse)]


def _summary(settings: Settings, session_id: str, address: str, events: list[SessionEvent]) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("Session", session_id)
    grid.add_row("Events", f"{len(events)} in the log (its Temporal workflow history)")
    calls = _tool_calls(events)
    for index, (use, result) in enumerate(calls):
        line = Text(f"{use.name} {compact_json(use.input)} → ")
        if result is None:
            line.append("(no result)", style="dim")
        else:
            line.append(one_line(blocks_text(result.content), 80), style="red" if result.is_error else "green")
        grid.add_row("Tool calls" if index == 0 else "", line)
    if not calls:
        grid.add_row("Tool calls", "none")
    grid.add_row("Web UI", Text(settings.workflow_url(session_id), style="blue"))
    grid.add_row("Read it", f"corral events {session_id}")
    grid.add_row("", f'corral send {session_id} "please calculate 2**10" --follow')
    grid.add_row(
        "Or with temporal",
        f"temporal workflow query --address {address} --namespace {settings.namespace} "
        f"--workflow-id {session_id} --name events",
    )
    grid.add_row("Stop the stack", "corral down")
    return Panel(grid, title="demo finished", title_align="left", border_style="green", expand=False)


async def run_demo(settings: Settings, options: up.UpOptions) -> None:
    """Bring the stack up, run three exchanges that call tools (the last one in the sandbox), and summarise."""
    report = await up.bring_up(settings.out, settings.paths, options, settings.namespace)
    settings.out.print(up.stack_panel(report, settings.paths))
    config = report.config
    client = await connect(config.temporal_address, settings.namespace)
    session_input = session_ops.build_session_input(
        None, default_model=settings.default_model(), message=DEMO_MESSAGE, title="corral demo"
    )
    handle = await start_session(client, session_input)
    settings.out.rule(Text(f"session {handle.id} · model {session_input.agent.model}"))
    settings.out.print(Text(settings.workflow_url(handle.id), style="blue"))
    renderer = EventRenderer(settings.out)
    first = await _until_idle(settings, handle, renderer, after=0)

    last = first[-1].position
    for message in FOLLOW_UP_MESSAGES:
        settings.out.print()
        await send_text(handle, message)
        last = (await _until_idle(settings, handle, renderer, after=last))[-1].position

    events = await read_events(handle)
    settings.out.print()
    settings.out.print(_summary(settings, handle.id, config.temporal_address, events))
