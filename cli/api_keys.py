"""`corral api-key`: the gateway's API keys (corral.apikeys). A key is shown once, when it is made; only its
digest and first characters are kept, so `ls` can tell keys apart but never show one again.

`create` with stdout captured prints the key alone, so `KEY=$(corral api-key create --workspace w)` works.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cli.app import app, client_of
from cli.context import CliError, run, settings_of

if TYPE_CHECKING:
    from corral.records import Records

# The Temporal client, the contract and rich are imported by the commands that use them: `corral --help` and
# every other command start without them (see bench/cli_startup.py).

api_key_app = typer.Typer(name="api-key", help="API keys of the gateway, one workspace each (shown once).")
app.add_typer(api_key_app, rich_help_panel="The gateway")


def _as_cli_error(error: Exception, key_id: str | None = None) -> Exception:
    from corral.records import InvalidRecord, RecordNotFound

    if isinstance(error, InvalidRecord):
        return CliError(str(error), exit_code=2)
    if isinstance(error, RecordNotFound):
        return CliError(f"no API key {key_id or error}", hint="`corral api-key ls` lists the keys")
    return error


async def _records(ctx: typer.Context) -> Records:
    from corral.records import Records

    return Records(await client_of(settings_of(ctx)))


@api_key_app.command("create")
def create(
    ctx: typer.Context,
    workspace: Annotated[str, typer.Option(help="The workspace the key opens.", show_default=False)],
    name: Annotated[str | None, typer.Option(help="A name to tell the key apart in `ls`.")] = None,
) -> None:
    """Make a key and print it: it is shown this once, never again."""
    from corral.apikeys import create_key
    from corral.records import RecordError

    settings = settings_of(ctx)

    async def go() -> str:
        try:
            key, _ = await create_key(await _records(ctx), workspace, name)
        except RecordError as exc:
            raise _as_cli_error(exc) from exc
        return key

    key = run(settings, go())
    if not settings.stdout_is_terminal:
        print(key, flush=True)  # only the key: what a script captures
        return
    from rich.text import Text

    settings.out.print(Text(key), soft_wrap=True)  # never wrapped: a copied key must be whole
    settings.out.print(
        Text(f"This key opens workspace {workspace}. It is shown once: store it now.", style="yellow"),
    )


@api_key_app.command("ls")
def ls(
    ctx: typer.Context,
    workspace: Annotated[str | None, typer.Option(help="Only this workspace's keys.", show_default=False)] = None,
) -> None:
    """List keys, newest first, revoked ones included (secrets are never shown, only their first characters)."""
    from corral.apikeys import list_keys
    from corral.records import RecordError

    settings = settings_of(ctx)

    async def go() -> None:
        try:
            keys = await list_keys(await _records(ctx), workspace)
        except RecordError as exc:
            raise _as_cli_error(exc) from exc
        if not keys:
            settings.out.print(f"no API keys{f' in workspace {workspace}' if workspace else ''}")
            return
        from rich.table import Table
        from rich.text import Text

        from cli.render import local_time, safe

        table = Table()
        for column in ("id", "workspace", "name", "prefix", "created", "revoked"):
            table.add_column(column, no_wrap=column in ("id", "prefix"))
        for key in keys:
            revoked = key.body.get("revoked_at")
            table.add_row(
                Text(key.id),
                Text(safe(key.workspace)),
                Text(safe(str(key.body.get("name") or "—"))),
                Text(safe(str(key.body.get("prefix") or "")) + "…"),
                local_time(key.created_at),
                Text(safe(str(revoked)), style="red") if revoked else Text("—", style="dim"),
            )
        settings.out.print(table)

    run(settings, go())


@api_key_app.command("revoke")
def revoke(
    ctx: typer.Context,
    key_id: Annotated[str, typer.Argument(metavar="KEY_ID", help="The key's id (apikey_…), from `ls`.")],
) -> None:
    """Revoke a key: from now on it opens nothing. Revoking it again changes nothing."""
    from corral.apikeys import revoke_key
    from corral.records import RecordError

    settings = settings_of(ctx)

    async def go() -> None:
        try:
            view = await revoke_key(await _records(ctx), key_id)
        except RecordError as exc:
            raise _as_cli_error(exc, key_id) from exc
        settings.human.print(f"revoked {view.id} (workspace {view.workspace}) at {view.body.get('revoked_at')}")

    run(settings, go())
