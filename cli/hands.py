"""`corral hand`: the operator's registry of hands (corral.hand_registry): which task queues serve hands, and which
workspaces' agents may use each over the HTTP API. A queue no one registered cannot be named by an API agent, and
corral's own queues (`corral-…`) can never be registered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cli.app import app, client_of
from cli.context import CliError, fail, run, settings_of

if TYPE_CHECKING:
    from cli.context import Settings
    from corral.hand_registry import HandRegistration
    from corral.records import Records

# The Temporal client, the registry and rich are imported by the commands that use them (see cli/api_keys.py).

hand_app = typer.Typer(name="hand", help="Hands the API's agents may use: task queues, and the workspaces of each.")
app.add_typer(hand_app, rich_help_panel="The gateway")

WORKSPACE_HELP = "A workspace whose agents may use the hand (repeat for more)."
REVOKE_HELP = "Revoke it for this workspace only (repeat for more); without: for every workspace."
Queue = Annotated[str, typer.Argument(metavar="QUEUE", help="The hand's task queue.", show_default=False)]


def _as_cli_error(error: Exception) -> Exception:
    from corral.hand_registry import HandNotRegistered, HandRegistryError
    from corral.records import InvalidRecord

    if isinstance(error, (InvalidRecord, ValueError)):
        return CliError(str(error), exit_code=2)
    if isinstance(error, HandNotRegistered):
        return CliError(f"no hand is registered on task queue {error}", hint="`corral hand ls` lists them")
    if isinstance(error, HandRegistryError):
        return CliError(str(error))
    return error


async def _records(ctx: typer.Context) -> Records:
    from corral.records import Records

    return Records(await client_of(settings_of(ctx)))


def _check_arguments(settings: Settings, queue: str, workspaces: list[str]) -> None:
    """Refuse a queue that can never be a hand's and a malformed workspace before anything is read or written."""
    from corral.hand_registry import hand_queue_problem
    from corral.records import InvalidRecord, check_workspace

    problem = hand_queue_problem(queue)
    if problem is not None:
        fail(settings, CliError(problem, exit_code=2))
    for workspace in workspaces:
        try:
            check_workspace(workspace)
        except InvalidRecord as exc:
            fail(settings, CliError(str(exc), exit_code=2))


def _who(registration: HandRegistration) -> str:
    if registration.all_workspaces:
        return "every workspace"
    return ", ".join(registration.workspaces) or "no workspace (revoked)"


@hand_app.command("register")
def register(
    ctx: typer.Context,
    queue: Queue,
    workspace: Annotated[list[str] | None, typer.Option("--workspace", "-w", help=WORKSPACE_HELP)] = None,
    all_workspaces: Annotated[bool, typer.Option("--all-workspaces", help="Every workspace may use the hand.")] = False,
) -> None:
    """Register a hand's task queue for workspaces (added to those it has), or for every workspace."""
    settings = settings_of(ctx)
    workspaces = list(workspace or [])
    _check_arguments(settings, queue, workspaces)
    if all_workspaces == bool(workspaces):
        usage = "name the workspaces that may use the hand (--workspace NAME, repeatable) or --all-workspaces"
        fail(settings, CliError(f"{usage}, one of the two", exit_code=2))

    async def go() -> HandRegistration:
        from corral.hand_registry import HandRegistryError, register_hand
        from corral.records import RecordError

        try:
            return await register_hand(await _records(ctx), queue, workspaces, all_workspaces=all_workspaces)
        except (HandRegistryError, RecordError) as exc:
            raise _as_cli_error(exc) from exc

    registration = run(settings, go())
    settings.human.print(f"hand queue {queue}: {_who(registration)}")


@hand_app.command("revoke")
def revoke(
    ctx: typer.Context,
    queue: Queue,
    workspace: Annotated[list[str] | None, typer.Option("--workspace", "-w", help=REVOKE_HELP)] = None,
) -> None:
    """Revoke a hand's task queue, for every workspace or for the ones named: their agents can no longer name it,
    and their sessions that use it take no more events (except interrupts)."""
    settings = settings_of(ctx)
    _check_arguments(settings, queue, list(workspace or []))

    async def go() -> HandRegistration:
        from corral.hand_registry import HandRegistryError, revoke_hand
        from corral.records import RecordError

        try:
            return await revoke_hand(await _records(ctx), queue, list(workspace) if workspace else None)
        except (HandRegistryError, RecordError) as exc:
            raise _as_cli_error(exc) from exc

    registration = run(settings, go())
    settings.human.print(f"hand queue {queue}: {_who(registration)}")


@hand_app.command("ls")
def ls(
    ctx: typer.Context,
    workspace: Annotated[
        str | None, typer.Option(help="Only the hands this workspace may use.", show_default=False)
    ] = None,
) -> None:
    """List the registered hand queues and who may use each (revoked ones too). A queue registered a moment ago
    may show a moment later (Temporal visibility); its registration is in force at once."""
    settings = settings_of(ctx)

    async def go() -> None:
        from corral.hand_registry import list_hands
        from corral.records import RecordError, check_workspace

        try:
            if workspace is not None:
                check_workspace(workspace)
            hands = await list_hands(await _records(ctx))
        except RecordError as exc:
            raise _as_cli_error(exc) from exc
        if workspace is not None:
            hands = [(registration, view) for registration, view in hands if registration.allows(workspace)]
        if not hands:
            settings.out.print(f"no hands registered{f' for workspace {workspace}' if workspace else ''}")
            return
        from rich.table import Table
        from rich.text import Text

        from cli.render import local_time, safe

        table = Table()
        for column in ("task queue", "workspaces", "registered", "changed"):
            table.add_column(column, no_wrap=column == "task queue")
        for registration, view in hands:
            table.add_row(
                Text(safe(registration.task_queue)),
                Text(safe(_who(registration)), style="red" if registration.revoked else ""),
                local_time(view.created_at),
                local_time(view.updated_at),
            )
        settings.out.print(table)

    run(settings, go())


hand_app.command("list", hidden=True, help="The same as `ls`.")(ls)
