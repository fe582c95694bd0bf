"""`corral environment`: self-hosted environments from the operator's side. `key` issues, lists and revokes the keys
their workers hold (corral.envkeys), through Temporal as `corral api-key` does; a key is shown once, when it is made.

`key create` with stdout captured prints the key alone, so `KEY=$(corral environment key create env_…)` works.
Other subcommands of `environment` (the queue's view) are added to `environment_app` by their own modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cli.app import app, client_of
from cli.context import CliError, run, settings_of, show_once

if TYPE_CHECKING:
    from corral.records import Records, RecordView

# The Temporal client, the contract and rich are imported by the commands that use them (see cli/api_keys.py).

environment_app = typer.Typer(name="environment", help="Self-hosted environments: their workers' keys and queues.",
                              no_args_is_help=True)  # fmt: skip
app.add_typer(environment_app, rich_help_panel="The gateway")
key_app = typer.Typer(name="key", help="Keys of a self-hosted environment, for its workers (shown once).",
                      no_args_is_help=True)  # fmt: skip
environment_app.add_typer(key_app)

EnvironmentId = Annotated[
    str, typer.Argument(metavar="ENV", help="The self-hosted environment's id (env_…).", show_default=False)
]
WorkspaceOption = Annotated[
    str | None,
    typer.Option(help="The environment's workspace (checked when given).", show_default=False),
]


async def _records(ctx: typer.Context) -> Records:
    from corral.records import Records

    return Records(await client_of(settings_of(ctx)))


async def _self_hosted(records: Records, environment_id: str, workspace: str | None) -> RecordView:
    """The environment, if it exists (in `workspace`, when given) and is self-hosted; else a CLI error."""
    from corral.envkeys import ENVIRONMENT_KIND, is_self_hosted
    from corral.records import RecordNotFound

    try:
        environment = await records.get_any(environment_id, kind=ENVIRONMENT_KIND)
    except RecordNotFound:
        environment = None
    if environment is None or workspace not in (None, environment.workspace):
        where = f" in workspace {workspace}" if workspace else ""
        raise CliError(f"no environment {environment_id}{where}", hint="the API lists them: environments.list()")
    if not is_self_hosted(environment):
        raise CliError(f"{environment_id} is a cloud environment: only a self_hosted one has keys", exit_code=2)
    return environment


@key_app.command("create")
def create(
    ctx: typer.Context,
    environment_id: EnvironmentId,
    name: Annotated[str | None, typer.Option(help="A name to tell the key apart in `ls`.")] = None,
    workspace: WorkspaceOption = None,
) -> None:
    """Make a key for the environment's workers and print it: it is shown this once, never again."""
    from corral.envkeys import create_environment_key

    settings = settings_of(ctx)

    async def go() -> tuple[str, str]:
        records = await _records(ctx)
        environment = await _self_hosted(records, environment_id, workspace)
        key, _ = await create_environment_key(records, environment.workspace, environment.id, name)
        return key, environment.workspace

    key, owner = run(settings, go())
    show_once(settings, key, "environment key",
              f"This key opens the work queue of {environment_id} (workspace {owner}) and the sessions in it, nothing "
              "else. It is shown once: store it now, and give it to the environment's worker "
              "(client.beta.environments.work.worker(environment_key=...)).")  # fmt: skip


@key_app.command("ls")
def ls(ctx: typer.Context, environment_id: EnvironmentId, workspace: WorkspaceOption = None) -> None:
    """List the environment's keys, newest first, revoked ones included (only their first characters are shown)."""
    from corral.envkeys import list_environment_keys

    settings = settings_of(ctx)

    async def go() -> None:
        records = await _records(ctx)
        environment = await _self_hosted(records, environment_id, workspace)
        keys = await list_environment_keys(records, environment.workspace, environment.id)
        if not keys:
            settings.out.print(f"no keys for {environment_id}")
            return
        from rich.table import Table
        from rich.text import Text

        from cli.render import local_time, safe

        table = Table()
        for column in ("id", "name", "prefix", "created", "revoked"):
            table.add_column(column, no_wrap=column in ("id", "prefix"))
        for key in keys:
            revoked = key.body.get("revoked_at")
            table.add_row(
                Text(key.id),
                Text(safe(str(key.body.get("name") or "—"))),
                Text(safe(str(key.body.get("prefix") or "")) + "…"),
                local_time(key.created_at),
                Text(safe(str(revoked)), style="red") if revoked else Text("—", style="dim"),
            )
        settings.out.print(table)

    run(settings, go())


@key_app.command("revoke")
def revoke(
    ctx: typer.Context,
    environment_id: EnvironmentId,
    key_id: Annotated[str, typer.Argument(metavar="KEY_ID", help="The key's id (envkey_…), from `ls`.")],
    workspace: WorkspaceOption = None,
) -> None:
    """Revoke a key: from now on it opens nothing (a gateway that verified it lately forgets it within seconds).
    Revoking it again changes nothing."""
    from corral.envkeys import revoke_environment_key
    from corral.records import RecordNotFound

    settings = settings_of(ctx)

    async def go() -> None:
        records = await _records(ctx)
        environment = await _self_hosted(records, environment_id, workspace)
        try:
            view = await revoke_environment_key(records, environment.workspace, environment.id, key_id)
        except RecordNotFound as exc:
            raise CliError(f"no key {key_id} of {environment_id}", hint="`corral environment key ls ENV` lists them"
                           ) from exc  # fmt: skip
        settings.human.print(f"revoked {view.id} of {environment_id} at {view.body.get('revoked_at')}")

    run(settings, go())
