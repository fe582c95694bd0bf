"""`corral start`, `send`, `interrupt`, `events`, `tail` and `ls`: sessions. The work is in `session_ops.py` and
`corral.client`; these parse options, and turn every failure into a message through `context.run`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.app import SessionId, SessionStatusFilter, app, client_of
from cli.context import CliError, fail, run, settings_of

PANEL = "Sessions"

# ---- sessions -------------------------------------------------------------------------------------------------


@app.command("start", rich_help_panel=PANEL)
def start_command(
    ctx: typer.Context,
    message: Annotated[
        str | None, typer.Argument(metavar="MESSAGE", help="First user message (optional).", show_default=False)
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="Model name. Default: claude-sonnet-4-6, or corral-offline-stand-in when offline."),
    ] = None,
    system: Annotated[str | None, typer.Option(help="System prompt.")] = None,
    title: Annotated[str | None, typer.Option(help="Session title.")] = None,
    tool_utility: Annotated[
        bool | None,
        typer.Option(
            "--tool-utility/--no-tool-utility",
            help="Offer the utility tools (get_time, calculate). Default: on, or as the --input file says.",
            show_default=False,
        ),
    ] = None,
    toolset: Annotated[
        bool | None,
        typer.Option(
            "--toolset/--no-toolset",
            help="Offer the sandbox tools (bash, read, write, edit, glob, grep); the container starts only when "
            "a tool call needs it. Default: on, or as the --input file says.",
            show_default=False,
        ),
    ] = None,
    input_file: Annotated[
        Path | None,
        typer.Option(
            "--input", help="A SessionInput JSON file; the options above override its fields.", dir_okay=False
        ),
    ] = None,
    follow: Annotated[bool, typer.Option("--follow", help="Then follow the session until it is idle.")] = False,
    repo: Annotated[
        str | None, typer.Option(help="A git repository (https URL) to clone into the sandbox.", show_default=False)
    ] = None,
    repo_token_file: Annotated[
        Path | None,
        typer.Option(help="File with the repository's token ('-' for stdin); it goes straight to Vault."),
    ] = None,
    repo_branch: Annotated[str | None, typer.Option(help="Branch to check out.")] = None,
    vault: Annotated[
        list[str] | None, typer.Option("--vault", help="Vault id for MCP credentials (repeatable).")
    ] = None,
) -> None:
    """Start a session. Prints its id (only the id on stdout when stdout is not a terminal) and Web UI link."""
    from rich.text import Text

    from cli import session_ops
    from cli.render import EventRenderer
    from cli.vault import store_repository
    from corral.client import new_session_id, start_session

    settings = settings_of(ctx)
    session_id = new_session_id()
    try:
        base = session_ops.load_input_file(input_file) if input_file is not None else None
        if repo is not None or vault:
            base = dict(base or {})
            if vault:
                base["vault_ids"] = [*base.get("vault_ids", []), *vault]
            if repo is not None:
                resource = store_repository(settings, session_id, repo, repo_token_file, repo_branch)
                base["resources"] = [*base.get("resources", []), resource]
        session_input = session_ops.build_session_input(
            base,
            default_model=settings.default_model(),
            message=message,
            model=model,
            system=system,
            title=title,
            tool_utility=tool_utility,
            toolset=toolset,
            from_file=input_file is not None,
        )
    except CliError as error:
        fail(settings, error)

    async def go() -> None:
        client = await client_of(settings)
        handle = await start_session(client, session_input, session_id=session_id)
        if settings.stdout_is_terminal:
            settings.out.print(Text("started ", style="green") + Text(session_id, style="bold"))
        else:
            print(session_id, flush=True)
        settings.human.print(Text(settings.workflow_url(session_id), style="blue"))
        if follow:
            await session_ops.tail(handle, EventRenderer(settings.human), stream_url=settings.stream_url())

    run(settings, go(), interrupted="stopped following")


@app.command("send", rich_help_panel=PANEL)
def send_command(
    ctx: typer.Context,
    session: SessionId,
    text: Annotated[str, typer.Argument(metavar="TEXT", help="The message.", show_default=False)],
    follow: Annotated[bool, typer.Option("--follow", help="Then follow the session until it is idle.")] = False,
) -> None:
    """Send a user message (the `send_events` update); prints the accepted event id."""
    from cli import session_ops
    from cli.render import EventRenderer
    from corral.client import send_text, session_info

    settings = settings_of(ctx)

    async def go() -> None:
        handle = (await client_of(settings)).get_workflow_handle(session)
        last = (await session_info(handle)).last_position if follow else 0
        event_id = await send_text(handle, text)
        settings.out.print(event_id, highlight=False)
        if follow:
            await session_ops.tail(handle, EventRenderer(settings.human), after=last, stream_url=settings.stream_url())

    run(settings, go(), session_id=session, interrupted="stopped following")


@app.command("interrupt", rich_help_panel=PANEL)
def interrupt_command(
    ctx: typer.Context,
    session: SessionId,
) -> None:
    """Stop the session's current work (sends a `user.interrupt` event); the session goes idle and stays usable."""
    from corral.client import send_events

    settings = settings_of(ctx)

    async def go() -> None:
        handle = (await client_of(settings)).get_workflow_handle(session)
        (event_id,) = await send_events(handle, [{"type": "user.interrupt"}])
        settings.out.print(event_id, highlight=False)

    run(settings, go(), session_id=session)


def _check_types(types: list[str] | None) -> list[str] | None:
    from corral.contract.events import EVENT_TYPES

    unknown = sorted(set(types or []) - EVENT_TYPES)
    if unknown:
        raise typer.BadParameter(f"unknown event type {', '.join(unknown)}; one of: {', '.join(sorted(EVENT_TYPES))}")
    return types or None


def _check_thread(thread: str | None) -> str | None:
    if thread is None:
        return None
    from corral.threads import is_thread_id

    if not is_thread_id(thread):
        raise typer.BadParameter(f"{thread!r} is not a thread id (sthr_…); `corral threads SESSION` lists them")
    return thread


ThreadOption = Annotated[
    str | None,
    typer.Option(
        "--thread",
        metavar="THREAD",
        help="A thread of the session (sthr_…): its own log instead of the session's.",
        callback=_check_thread,
        show_default=False,
    ),
]


@app.command("events", rich_help_panel=PANEL)
def events_command(
    ctx: typer.Context,
    session: SessionId,
    after: Annotated[int, typer.Option(help="Only events after this position.", min=0)] = 0,
    types: Annotated[
        list[str] | None,
        typer.Option("--type", "-t", help="Only this event type (repeatable).", callback=_check_types),
    ] = None,
    limit: Annotated[int | None, typer.Option(help="At most this many events.", min=1)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines, one event per line.")] = False,
    thread: ThreadOption = None,
) -> None:
    """Print a session's events, or one of its threads' (--thread): position, time, type and a short summary (or
    the events as JSON lines).

    Control characters in event content (a model or a tool can write terminal escape sequences) are shown escaped,
    never sent to the terminal; --json output escapes them as JSON does.
    """
    from cli import session_ops
    from cli.render import EventRenderer, safe_json_line
    from corral.client import read_events

    settings = settings_of(ctx)

    async def go() -> None:
        handle, log = await session_ops.log_to_read(settings, session, thread)
        async with session_ops.explained(log):
            events = await read_events(log, after=after, types=types, limit=limit)
        if not events:
            settings.err.print(f"no events{' of that type' if types else ''} after position {after}", style="dim")
        if as_json:
            for event in events:
                print(safe_json_line(event.model_dump_json()), flush=False)
        else:
            renderer = EventRenderer(settings.out)
            for event in events:
                renderer.print(event)
        await session_ops.report_end(handle)  # a session that ended: the log above, then what happened

    run(settings, go(), session_id=session)


@app.command("tail", rich_help_panel=PANEL)
def tail_command(
    ctx: typer.Context,
    session: SessionId,
    after: Annotated[int, typer.Option(help="Start after this position.", min=0)] = 0,
    forever: Annotated[bool, typer.Option("--forever", help="Keep following after the session goes idle.")] = False,
    thread: ThreadOption = None,
) -> None:
    """Print a session's events (or one of its threads', --thread) and follow new ones until the reply to the
    latest message is done (idle).

    Ctrl-C stops following.
    """
    from cli import session_ops
    from cli.render import EventRenderer

    settings = settings_of(ctx)

    async def go() -> None:
        handle, log = await session_ops.log_to_read(settings, session, thread)
        async with session_ops.explained(log):
            await session_ops.tail(
                log, EventRenderer(settings.out), after=after, forever=forever, stream_url=settings.stream_url()
            )
        await session_ops.report_end(handle)  # a session that ended (also when its last idle stopped the tail)

    run(settings, go(), session_id=session, interrupted="stopped following")


@app.command("ls", rich_help_panel=PANEL)
def ls_command(
    ctx: typer.Context,
    status: Annotated[SessionStatusFilter | None, typer.Option(help="Only sessions in this status.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many sessions.", min=1)] = 50,
) -> None:
    """List sessions: running ones first, then ended ones, each newest first (Temporal visibility's order).

    Runs the visibility query `WorkflowType='SessionWorkflow' AND ExecutionStatus!='ContinuedAsNew'
    AND ParentWorkflowId IS NULL [AND CorralStatus='idle']`; the same query works in the Temporal Web UI and with
    `temporal workflow list`. A session's threads (its child workflows) are listed by `corral threads SESSION`.
    """
    from cli import session_ops
    from cli.render import sessions_table

    settings = settings_of(ctx)
    query = session_ops.sessions_query(status.value if status else None)

    async def go() -> None:
        rows = await session_ops.list_sessions(await client_of(settings), query, limit)
        if not rows:
            settings.out.print(f"no sessions match {query}")
            return
        settings.out.print(sessions_table(rows))

    run(settings, go())
