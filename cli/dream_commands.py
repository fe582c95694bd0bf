"""`corral dreams`: the dreams of every workspace (or one), as the operator sees them through Temporal: `ls`, `show`
and `cancel`. Dreams are made through the API (`client.beta.dreams.create`), which checks their inputs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.app import app, client_of
from cli.context import CliError, run, settings_of

if TYPE_CHECKING:
    from temporalio.client import Client

dreams_app = typer.Typer(name="dreams", help="Dreams: jobs that reorganise a memory store from past sessions.",
                         no_args_is_help=True)  # fmt: skip
app.add_typer(dreams_app, rich_help_panel="The gateway")

DreamId = Annotated[str, typer.Argument(metavar="DREAM", help="The dream's id (drm_…).", show_default=False)]


async def _views(client: Client, workspace: str | None) -> list[dict[str, Any]]:
    from corral.contract.dreams import DreamInput, DreamState, dream_view
    from corral.contract.records import SEARCH_ATTRIBUTE_WORKSPACE
    from corral.names import DREAM_WORKFLOW, QUERY_DREAM

    query = f"WorkflowType = '{DREAM_WORKFLOW}'"
    if workspace is not None:
        query += f" AND {SEARCH_ATTRIBUTE_WORKSPACE} = '{workspace}'"
    views = []
    async for execution in client.list_workflows(query):
        input = DreamInput.model_validate((await execution.memo())["input"])
        state = await client.get_workflow_handle(execution.id).query(QUERY_DREAM, result_type=DreamState)
        views.append({**dream_view(input, state), "workspace": input.workspace, "written": state.written})
    return sorted(views, key=lambda view: view["id"], reverse=True)


async def _one(client: Client, dream_id: str) -> dict[str, Any]:
    from temporalio.service import RPCError

    from corral.contract.dreams import DreamInput, DreamState, dream_view
    from corral.names import DREAM_ID_PREFIX, DREAM_WORKFLOW, QUERY_DREAM

    if not dream_id.startswith(DREAM_ID_PREFIX):
        raise CliError(f"{dream_id!r} is not a dream id (drm_…)", exit_code=2)
    handle = client.get_workflow_handle(dream_id)
    try:
        description = await handle.describe()
    except RPCError as exc:
        raise CliError(f"no dream {dream_id}", hint="`corral dreams ls` lists them") from exc
    if description.workflow_type != DREAM_WORKFLOW:
        raise CliError(f"no dream {dream_id}", hint="`corral dreams ls` lists them")
    input = DreamInput.model_validate((await description.memo())["input"])
    state = await handle.query(QUERY_DREAM, result_type=DreamState)
    return {**dream_view(input, state), "workspace": input.workspace, "written": state.written}


@dreams_app.command("ls")
def ls(
    ctx: typer.Context,
    workspace: Annotated[str | None, typer.Option(help="Only this workspace's dreams.")] = None,
) -> None:
    """List dreams, newest first: status, store, sessions, what they wrote."""
    settings = settings_of(ctx)

    async def go() -> None:
        views = await _views(await client_of(settings), workspace)
        if not views:
            settings.out.print("no dreams")
            return
        from rich.table import Table
        from rich.text import Text

        table = Table()
        for column in ("id", "status", "workspace", "store", "sessions", "output", "written"):
            table.add_column(column, no_wrap=column in ("id", "store", "output"))
        for view in views:
            store = view["inputs"][0]["memory_store_id"]
            output = view["outputs"][0]["memory_store_id"] if view["outputs"] else "—"
            table.add_row(Text(view["id"]), Text(view["status"]), Text(view["workspace"]), Text(store),
                          str(len(view["inputs"][1]["session_ids"])), Text(output), str(view["written"]))  # fmt: skip
        settings.out.print(table)

    run(settings, go())


@dreams_app.command("show")
def show(ctx: typer.Context, dream_id: DreamId) -> None:
    """One dream as the API shows it (JSON), with its workspace and how many memories it wrote."""
    import json

    settings = settings_of(ctx)

    async def go() -> None:
        view = await _one(await client_of(settings), dream_id)
        settings.out.print_json(json.dumps(view))

    run(settings, go())


@dreams_app.command("cancel")
def cancel(ctx: typer.Context, dream_id: DreamId) -> None:
    """Stop a pending or running dream: its session stops and its store is left as it was."""
    from temporalio.client import WorkflowUpdateFailedError

    from corral.contract.dreams import DreamState
    from corral.names import UPDATE_CANCEL_DREAM

    settings = settings_of(ctx)

    async def go() -> None:
        client = await client_of(settings)
        await _one(client, dream_id)
        try:
            state = await client.get_workflow_handle(dream_id).execute_update(UPDATE_CANCEL_DREAM,
                                                                              result_type=DreamState)  # fmt: skip
        except WorkflowUpdateFailedError as exc:
            raise CliError(getattr(exc.cause, "message", None) or str(exc), exit_code=2) from exc
        settings.out.print(f"{dream_id}: {state.status}")

    run(settings, go())
