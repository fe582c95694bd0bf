"""`corral context`, `fork` and `export`: what the model sees of a session's log, a new session from a point of it,
and the whole of it as JSON Lines."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from cli.app import SessionId, app, client_of
from cli.context import CliError, Settings, fail, run, settings_of
from cli.session_commands import PANEL


@app.command("context", rich_help_panel=PANEL)
def context_command(
    ctx: typer.Context,
    session: SessionId,
    last: Annotated[int, typer.Option(help="Show this many of the latest entries (0: all).", min=0)] = 40,
) -> None:
    """Show what the model would see on the next turn: the conversation's entries, which are elided, the estimate
    against the budget. The log itself always keeps every event in full (`corral events`)."""
    from rich.table import Table

    from cli import session_ops
    from corral.client import query_session
    from corral.contract.context import ContextView
    from corral.names import QUERY_CONTEXT_VIEW

    settings = settings_of(ctx)

    async def go() -> ContextView:
        handle = (await client_of(settings)).get_workflow_handle(session)
        async with session_ops.explained(handle):
            view: ContextView = await query_session(handle, QUERY_CONTEXT_VIEW, ContextView)
        return view

    view = run(settings, go(), session_id=session)
    elided = sum(entry.elided for entry in view.entries)
    settings.out.print(
        f"next request: about {view.estimate_tokens} of {view.budget_tokens} tokens "
        f"(system prompt and tools {view.fixed_tokens}); {len(view.entries) + view.omitted} conversation entries, "
        f"{elided} elided" + (f" (large tool results before position {view.watermark})" if view.watermark else ""),
        highlight=False,
    )
    shown = view.entries[-last:] if last else view.entries
    table = Table("position", "type", "tokens", "the model sees")
    for entry in shown:
        table.add_row(str(entry.position), entry.type, str(entry.tokens), "a stub (elided)" if entry.elided else "all")
    settings.out.print(table)
    hidden = len(view.entries) - len(shown) + view.omitted
    if hidden:
        settings.err.print(f"{hidden} earlier entries not shown (--last 0 shows all)", style="dim")
    run(settings, _report_end(settings, session), session_id=session)


async def _report_end(settings: Settings, session: str) -> None:
    """After what a command printed of a session: how it ended, if its workflow has (`session_ops.report_end`)."""
    from cli import session_ops

    await session_ops.report_end((await client_of(settings)).get_workflow_handle(session))


@app.command("fork", rich_help_panel=PANEL)
def fork_command(
    ctx: typer.Context,
    session: SessionId,
    at: Annotated[int, typer.Option("--at", help="The last position of the source's log to keep.", min=1)],
    agent_file: Annotated[
        Path | None,
        typer.Option("--agent", help="An agent JSON file to go on with (default: the source's agent).", dir_okay=False),
    ] = None,
) -> None:
    """Start a new session whose log is SESSION's up to and including position --at, then its own.

    Prints the new id (only the id on stdout when stdout is not a terminal). The source is only read. The new
    session starts with a fresh sandbox workspace: files are not copied yet.
    """
    from pydantic import ValidationError
    from rich.text import Text

    from cli import session_ops
    from corral.client import fork_session
    from corral.contract.session import AgentConfig

    settings = settings_of(ctx)
    agent = None
    if agent_file is not None:
        try:
            agent = AgentConfig.model_validate(session_ops.load_input_file(agent_file))
        except ValidationError as exc:
            fail(
                settings,
                CliError(
                    f"{agent_file} is not a valid agent:\n{session_ops.describe_validation_error(exc)}", exit_code=2
                ),
            )
        except CliError as error:
            fail(settings, error)

    async def go() -> str:
        client = await client_of(settings)
        async with session_ops.explained(client.get_workflow_handle(session)):
            try:
                handle = await fork_session(client, session, at, agent)
            except ValueError as exc:
                raise CliError(str(exc), exit_code=2) from None
        return handle.id

    new_id = run(settings, go(), session_id=session)
    if settings.stdout_is_terminal:
        settings.out.print(
            Text("forked ", style="green") + Text(new_id, style="bold") + Text(f" from {session} at {at}")
        )
    else:
        print(new_id, flush=True)
    settings.human.print(Text(settings.workflow_url(new_id), style="blue"))


@app.command("export", rich_help_panel=PANEL)
def export_command(
    ctx: typer.Context,
    session: SessionId,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here (default, or '-': stdout).", dir_okay=False)
    ] = None,
) -> None:
    """Write a session's whole log as JSON Lines, one event per line, in order (the raw events, nothing elided).

    With --output the file appears only once it is complete; progress and the count go to stderr.
    """
    import os
    import sys
    import tempfile

    from cli import session_ops
    from cli.render import safe_json_line
    from corral.client import event_pages

    settings = settings_of(ctx)
    output = None if output is not None and str(output) == "-" else output  # `-o -`: stdout, as is usual

    async def go() -> int:
        handle = (await client_of(settings)).get_workflow_handle(session)
        target = output.expanduser().absolute() if output is not None else None
        if target is not None and not target.parent.is_dir():
            raise CliError(f"cannot write {target}: {target.parent} is not a directory", exit_code=2)
        fd, scratch = tempfile.mkstemp(prefix=".export-", dir=target.parent) if target else (None, None)
        written = 0
        try:
            with os.fdopen(fd, "w") if fd is not None else contextlib.nullcontext(sys.stdout) as sink:
                with settings.err.status("exporting …") as status:
                    async with session_ops.explained(handle):
                        async for page in event_pages(handle):
                            sink.writelines(safe_json_line(event.model_dump_json()) + "\n" for event in page)
                            written += len(page)
                            status.update(f"exporting … {written} events")
            if target is not None and scratch is not None:
                os.replace(scratch, target)
        finally:
            if scratch is not None:
                with contextlib.suppress(FileNotFoundError):  # moved into place: nothing left to clean
                    os.unlink(scratch)
        where = f" to {output}" if output is not None else ""
        settings.err.print(f"exported {written} event{'s' if written != 1 else ''} of {session}{where}", style="dim")
        await session_ops.report_end(handle)  # the whole log is out; then, for a session that ended, how it ended
        return written

    run(settings, go(), session_id=session)


@app.command("output", rich_help_panel=PANEL)
def output_command(
    ctx: typer.Context,
    session: SessionId,
    tool_use_id: Annotated[
        str, typer.Argument(metavar="TOOL_USE_ID", help="The agent.tool_use event's id.", show_default=False)
    ],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here (default, or '-': stdout).", dir_okay=False)
    ] = None,
) -> None:
    """Write the whole output of a bash call whose output the model saw cut to its head and tail.

    The sandbox keeps it in the blob store when it cuts it; the tool result's marker names this command.
    """
    import sys

    from corral.archive import tool_output_key
    from corral.blobs import BlobStoreError, open_blob_store

    settings = settings_of(ctx)
    output = None if output is not None and str(output) == "-" else output  # `-o -`: stdout, as is usual
    try:
        whole = open_blob_store().get(tool_output_key(session, tool_use_id))
    except BlobStoreError as exc:
        # A session that failed at start never ran a tool: say that, rather than that this output is missing.
        run(settings, _start_failure(settings, session), session_id=session)
        message = f"no whole output is kept for {tool_use_id} of {session}: {exc}"
        fail(settings, CliError(message, hint="Only a bash output cut for the model is kept; its tool result says so."))
    if output is None:
        sys.stdout.buffer.write(whole)
        sys.stdout.flush()
        return
    target = output.expanduser().absolute()
    if not target.parent.is_dir():
        fail(settings, CliError(f"cannot write {target}: {target.parent} is not a directory", exit_code=2))
    target.write_bytes(whole)
    settings.err.print(f"wrote {len(whole)} bytes of {tool_use_id} to {output}", style="dim")


async def _start_failure(settings: Settings, session: str) -> None:
    """Raise `SessionStartFailed` if the session's start input was refused; nothing otherwise (an unknown session
    or an unreachable Temporal included: the caller says what it was looking for)."""
    from temporalio.service import RPCError

    from corral.client import session_end
    from corral.errors import SessionStartFailed

    try:
        ended = await session_end((await client_of(settings)).get_workflow_handle(session))
    except (RPCError, RuntimeError):  # no such session, or no Temporal to ask: the blob store said enough
        return
    if isinstance(ended, SessionStartFailed):
        raise ended
