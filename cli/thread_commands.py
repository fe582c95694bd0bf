"""`corral threads`: a multi-agent session's threads, as its `threads` query lists them (the primary thread, which
is the session, first). `corral events --thread` and `corral tail --thread` read one thread's own log."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cli.app import SessionId, app, client_of
from cli.context import CliError, fail, run, settings_of
from cli.session_commands import PANEL

if TYPE_CHECKING:
    from rich.table import Table

    from corral.contract.threads import ThreadInfo


@app.command("threads", rich_help_panel=PANEL)
def threads_command(
    ctx: typer.Context,
    session: SessionId,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines, one thread per line.")] = False,
) -> None:
    """List a session's threads: the primary thread (the session itself) first, then every thread it spawned, with
    its agent, status, turns and tokens. Each thread is a child workflow of the session in the Temporal Web UI.

    `corral events SESSION --thread THREAD` prints a thread's own log, `corral tail SESSION --thread THREAD`
    follows it.
    """
    from cli import session_ops
    from cli.render import safe_json_line
    from corral.threads import session_threads

    settings = settings_of(ctx)
    try:
        session_ops.refuse_thread_as_session(session)
    except CliError as error:
        fail(settings, error)

    async def go() -> None:
        handle = (await client_of(settings)).get_workflow_handle(session)
        async with session_ops.explained(handle):
            threads = await session_threads(handle)
        if as_json:
            for thread in threads:
                print(safe_json_line(thread.model_dump_json()), flush=False)
        else:
            settings.out.print(threads_table(threads))
        await session_ops.report_end(handle)  # a session that ended: its threads above, then how it ended

    run(settings, go(), session_id=session)


def threads_table(threads: list[ThreadInfo]) -> Table:
    """One row per thread: id, agent (and what kind), status, turns, tokens in and out, created, archived."""
    from rich.table import Table
    from rich.text import Text

    from cli.render import local_time, safe

    table = Table()
    for column in ("thread", "agent", "status", "turns", "tokens in/out", "created", "archived"):
        table.add_column(column, no_wrap=column == "thread", overflow="fold")  # narrow: wrapped, never cut
    styles = {"idle": "green", "running": "yellow", "rescheduling": "yellow", "terminated": "dim"}
    for thread in threads:
        status = "terminated" if thread.archived_at is not None else thread.status
        stopped = f" ({thread.stop_reason})" if thread.stop_reason and status == "idle" else ""
        kind = "primary" if thread.parent_thread_id is None else thread.agent.type
        table.add_row(
            safe(thread.id),
            safe(f"{thread.agent.name} ({kind})"),
            Text(status + stopped, style=styles.get(status, "")),
            str(thread.turns),
            f"{thread.usage.input_tokens}/{thread.usage.output_tokens}",
            local_time(thread.created_at),
            local_time(thread.archived_at) if thread.archived_at else "",
        )
    return table
