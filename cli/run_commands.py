"""`corral runs`: a session's workflow runs, as its `workflow_runs` query lists them (oldest first), with how far
each has come through its plan. Each run is a child workflow of the session in the Temporal Web UI."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cli.app import SessionId, app, client_of
from cli.context import CliError, fail, run, settings_of
from cli.session_commands import PANEL

if TYPE_CHECKING:
    from rich.table import Table

    from corral.contract.plans import WorkflowRunInfo


@app.command("runs", rich_help_panel=PANEL)
def runs_command(
    ctx: typer.Context,
    session: SessionId,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines, one workflow run per line.")] = False,
) -> None:
    """List a session's workflow runs, oldest first: id, name, status, phase progress and result. A session with
    none is an error (exit 1). Each run is a child workflow of the session in the Temporal Web UI, its phases in its
    summary line; `corral threads SESSION` lists the threads its tasks ran as.
    """
    from cli import session_ops
    from cli.render import safe_json_line
    from corral.contract.plans import WorkflowRunInfo
    from corral.names import QUERY_WORKFLOW_RUNS
    from corral.reading import query_session

    settings = settings_of(ctx)
    try:
        session_ops.refuse_thread_as_session(session)
        refuse_run_as_session(session)
    except CliError as error:
        fail(settings, error)

    async def go() -> None:
        handle = (await client_of(settings)).get_workflow_handle(session)
        async with session_ops.explained(handle):
            runs = await query_session(handle, QUERY_WORKFLOW_RUNS, list[WorkflowRunInfo])
        if not runs:
            raise CliError(
                f"session {session} has started no workflow runs",
                hint="a run is started by the session's agent (its start_workflow_run tool) when its multiagent "
                "config enables workflows",
            )
        if as_json:
            for info in runs:
                print(safe_json_line(info.model_dump_json()), flush=False)
        else:
            settings.out.print(runs_table(runs))
        await session_ops.report_end(handle)  # a session that ended: its runs above, then how it ended

    run(settings, go(), session_id=session)


def refuse_run_as_session(session: str) -> None:
    """A workflow run's id where its session's belongs is a CliError: a session's runs are listed by the session."""
    from corral.names import WORKFLOW_RUN_ID_PREFIX

    if session.startswith(WORKFLOW_RUN_ID_PREFIX):
        raise CliError(
            f"{session} is a workflow run id, not a session id",
            hint="give the id of the session that started it (sesn_…); `corral ls` lists the sessions",
            exit_code=2,
        )


def runs_table(runs: list[WorkflowRunInfo]) -> Table:
    """One row per run: id, name, status, phases ended of all, result (and its error), created, ended."""
    from rich.table import Table
    from rich.text import Text

    from cli.render import local_time, safe

    table = Table()
    for column in ("run", "name", "status", "progress", "result", "created", "ended"):
        table.add_column(column, no_wrap=column == "run", overflow="fold")  # narrow: wrapped, never cut
    styles = {"running": "yellow", "idle": "yellow", "ended": "dim", "completed": "green", "error": "red"}
    for info in runs:
        result = info.result.type if info.result else ""
        error = info.result.error if info.result else None
        table.add_row(
            safe(info.id),
            safe(info.name),
            Text(info.status, style=styles.get(info.status, "")),
            info.progress(),
            Text(safe(f"{result}: {error.type}: {error.message}" if error else result), style=styles.get(result, "")),
            local_time(info.created_at),
            local_time(info.ended_at) if info.ended_at else "",
        )
    return table
