"""`corral outcomes`: where each outcome a session was given stands, as its `session` query shows them (the API's
`session.outcome_evaluations`). `corral tail` shows the grader's spans as they happen."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cli.app import SessionId, app, client_of
from cli.context import CliError, fail, run, settings_of
from cli.session_commands import PANEL

if TYPE_CHECKING:
    from rich.table import Table

    from corral.contract.outcomes import OutcomeEvaluation


@app.command("outcomes", rich_help_panel=PANEL)
def outcomes_command(
    ctx: typer.Context,
    session: SessionId,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines, one outcome per line.")] = False,
) -> None:
    """List a session's outcomes (`user.define_outcome`), oldest first: each with its result (pending, running,
    evaluating, or how it ended), the evaluation cycle it is on, and the grader's latest explanation.

    `corral tail SESSION` follows the grader's spans as they happen.
    """
    from cli import session_ops
    from cli.render import safe_json_line
    from corral.client import session_info

    settings = settings_of(ctx)
    try:
        session_ops.refuse_thread_as_session(session)
    except CliError as error:
        fail(settings, error)

    async def go() -> None:
        handle = (await client_of(settings)).get_workflow_handle(session)
        async with session_ops.explained(handle):
            evaluations = (await session_info(handle)).outcome_evaluations
        if as_json:
            for evaluation in evaluations:
                print(safe_json_line(evaluation.model_dump_json()), flush=False)
        elif evaluations:
            settings.out.print(outcomes_table(evaluations))
        else:
            settings.out.print("no outcomes: send one with the API's user.define_outcome")
        await session_ops.report_end(handle)  # a session that ended: its outcomes above, then how it ended

    run(settings, go(), session_id=session)


def outcomes_table(evaluations: list[OutcomeEvaluation]) -> Table:
    """One row per outcome: id, description, result, cycle (1-based), the grader's explanation, completed."""
    from rich.table import Table
    from rich.text import Text

    from cli.render import local_time, safe

    table = Table()
    for column in ("outcome", "description", "result", "cycle", "explanation", "completed"):
        table.add_column(column, no_wrap=column == "outcome", overflow="fold")  # narrow: wrapped, never cut
    styles = {"satisfied": "green", "failed": "bold red", "max_iterations_reached": "yellow", "interrupted": "dim"}
    for evaluation in evaluations:
        table.add_row(
            safe(evaluation.outcome_id),
            safe(evaluation.description),
            Text(evaluation.result, style=styles.get(evaluation.result, "")),
            str(evaluation.iteration + 1),
            safe(evaluation.explanation or ""),
            local_time(evaluation.completed_at) if evaluation.completed_at else "",
        )
    return table
