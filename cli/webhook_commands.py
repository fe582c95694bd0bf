"""`corral webhook`: a workspace's webhook endpoints from the operator's side, on the same database and Vault as the
gateway's `/v1/webhook_endpoints` (docs/webhooks.md).

`add` and `rotate` print the endpoint's new signing secret, shown this once: with stdout captured, the secret alone,
so `SECRET=$(corral webhook add …)` works. The secret is written to Vault (where `corral vault` writes, see
cli/vault.py) and read back by nothing but the proxy, which signs the deliveries. `deliveries` shows what became of
the events owed to an endpoint, and why a failing one failed; `enable` turns an endpoint that was given up on back on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cli.app import app
from cli.context import CliError, Settings, fail, settings_of, show_once

if TYPE_CHECKING:
    from corral.webhooks import Endpoint, WebhookEndpoints

# The database, Vault and rich are imported by the commands that use them (see cli/main.py on start-up time).

webhook_app = typer.Typer(name="webhook", help="Webhook endpoints: where a workspace's events are delivered, signed.",
                          no_args_is_help=True)  # fmt: skip
app.add_typer(webhook_app, rich_help_panel="The gateway")

EndpointId = Annotated[str, typer.Argument(metavar="ENDPOINT", help="The endpoint's id (whep_…).", show_default=False)]
WorkspaceOption = Annotated[
    str | None, typer.Option(help="The endpoint's workspace (checked when given).", show_default=False)
]


def _endpoints(settings: Settings) -> WebhookEndpoints:
    import os

    from corral.knowledge_db import knowledge_db_path, open_knowledge_db
    from corral.names import ENV_STATE_DIR
    from corral.webhooks import WebhookEndpoints

    return WebhookEndpoints(
        open_knowledge_db(knowledge_db_path({**os.environ, ENV_STATE_DIR: str(settings.state_dir)}))
    )


def _wake(settings: Settings, endpoints: WebhookEndpoints, workspace: str) -> None:
    """Tell the workspace's running sessions to emit from now on; when Temporal cannot be reached, say so (the
    endpoint is made all the same, and those sessions emit from their next start)."""
    import asyncio

    from cli.app import client_of
    from corral.webhooks import Webhooks

    async def wake() -> int:
        return await Webhooks(await client_of(settings), endpoints.db).wake_sessions(workspace)

    try:
        asyncio.run(wake())
    except Exception as exc:  # the endpoint stands: only the running sessions' events wait
        settings.err.print(f"the running sessions of {workspace} were not told ({type(exc).__name__}: {exc}): "
                           "they emit from their next start", style="yellow")  # fmt: skip


def _endpoint(settings: Settings, endpoints: WebhookEndpoints, endpoint_id: str, workspace: str | None) -> Endpoint:
    from corral.webhooks import EndpointNotFound

    try:
        endpoint = endpoints.get_any(endpoint_id)
    except EndpointNotFound:
        endpoint = None
    if endpoint is None or workspace not in (None, endpoint.workspace):
        where = f" in workspace {workspace}" if workspace else ""
        fail(settings, CliError(f"no webhook endpoint {endpoint_id}{where}", hint="`corral webhook ls --workspace "
                                "NAME` lists them"))  # fmt: skip
    return endpoint


def _show_secret(settings: Settings, secret: str, endpoint: Endpoint, what: str) -> None:
    show_once(settings, secret, "webhook signing secret",
              f"{what} {endpoint.id} ({endpoint.url}, workspace {endpoint.workspace}). This signing secret is shown "
              "once: give it to your receiver, which verifies each delivery with it (client.beta.webhooks.unwrap("
              "body, headers=headers, key=secret)).")  # fmt: skip


def _store_secret(settings: Settings, endpoint_id: str) -> str:
    from cli.vault import vault_store
    from proxy import ProxyError, new_webhook_secret

    secret = new_webhook_secret()
    try:
        vault_store(settings).store_webhook_secret(endpoint_id, secret)
    except ProxyError as exc:
        raise CliError(f"could not write the signing secret to Vault: {exc}") from exc
    return secret.get_secret_value()


@webhook_app.command("add")
def add(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(help="Where the deliveries are POSTed (http:// or https://).")],
    workspace: Annotated[str, typer.Option(help="The workspace whose events it gets.", show_default=False)],
    events: Annotated[
        str,
        typer.Option(help="Event types, comma-separated, or `all` (see `corral webhook types`).", show_default=False),
    ],
    description: Annotated[str, typer.Option(help="What the endpoint is for.")] = "",
) -> None:
    """Register an endpoint and print its signing secret (shown this once)."""
    from corral.webhooks import InvalidEndpoint

    settings = settings_of(ctx)
    endpoints = _endpoints(settings)
    types = [t.strip() for t in events.split(",") if t.strip()]
    try:
        endpoint = endpoints.create(workspace, url, types, description)
    except InvalidEndpoint as exc:
        fail(settings, CliError(str(exc), exit_code=2))
    try:
        secret = _store_secret(settings, endpoint.id)
    except BaseException as exc:
        endpoints.delete(workspace, endpoint.id)  # no endpoint without its secret
        fail(settings, exc if isinstance(exc, CliError) else CliError(str(exc)))
    _wake(settings, endpoints, workspace)
    _show_secret(settings, secret, endpoint, "A new endpoint,")


@webhook_app.command("ls")
def ls(ctx: typer.Context, workspace: Annotated[str, typer.Option(help="The workspace.", show_default=False)]) -> None:
    """List the workspace's endpoints: what each wants, and whether it is enabled (and if not, why)."""
    settings = settings_of(ctx)
    found = _endpoints(settings).in_workspace(workspace)
    if not found:
        settings.out.print(f"no webhook endpoints in workspace {workspace}")
        return
    from rich.table import Table
    from rich.text import Text

    from cli.render import safe

    table = Table()
    for column in ("id", "url", "events", "status"):
        table.add_column(column, no_wrap=column == "id")
    for endpoint in found:
        status = Text(endpoint.status, style="green" if endpoint.status == "enabled" else "red")
        if endpoint.disabled_reason:
            status += Text(f": {safe(endpoint.disabled_reason)}", style="dim")
        table.add_row(Text(endpoint.id), Text(safe(endpoint.url)), Text(", ".join(endpoint.events)), status)
    settings.out.print(table)


@webhook_app.command("rotate")
def rotate(ctx: typer.Context, endpoint_id: EndpointId, workspace: WorkspaceOption = None) -> None:
    """Replace the endpoint's signing secret and print the new one: the old one signs nothing from now on."""
    settings = settings_of(ctx)
    endpoint = _endpoint(settings, _endpoints(settings), endpoint_id, workspace)
    try:
        secret = _store_secret(settings, endpoint.id)
    except CliError as exc:
        fail(settings, exc)
    _show_secret(settings, secret, endpoint, "The new secret of")


@webhook_app.command("enable")
def enable(ctx: typer.Context, endpoint_id: EndpointId, workspace: WorkspaceOption = None) -> None:
    """Enable an endpoint again (after a delivery was given up on, say): new events are delivered to it."""
    from corral.webhooks import ENABLED

    settings = settings_of(ctx)
    endpoints = _endpoints(settings)
    endpoint = _endpoint(settings, endpoints, endpoint_id, workspace)
    endpoints.set_status(endpoint.id, ENABLED)
    _wake(settings, endpoints, endpoint.workspace)
    settings.out.print(f"{endpoint.id} is enabled")


@webhook_app.command("rm")
def rm(ctx: typer.Context, endpoint_id: EndpointId, workspace: WorkspaceOption = None) -> None:
    """Delete an endpoint and destroy its secret; deliveries still owed to it stop."""
    from cli.vault import vault_store

    settings = settings_of(ctx)
    endpoints = _endpoints(settings)
    endpoint = _endpoint(settings, endpoints, endpoint_id, workspace)
    endpoints.delete(endpoint.workspace, endpoint.id)
    vault_store(settings).destroy_webhook_secret(endpoint.id)
    settings.out.print(f"deleted {endpoint.id}")


@webhook_app.command("deliveries")
def deliveries(
    ctx: typer.Context,
    endpoint_id: EndpointId,
    workspace: WorkspaceOption = None,
    failed: Annotated[bool, typer.Option("--failed", help="Only the deliveries that failed.")] = False,
    limit: Annotated[int, typer.Option(min=1, max=100, help="At most this many, newest first.")] = 20,
) -> None:
    """What became of the events owed to the endpoint: delivered, still being retried (and why), or failed (why)."""
    from corral.webhook_deliveries import FAILED, WebhookDeliveries

    settings = settings_of(ctx)
    endpoints = _endpoints(settings)
    endpoint = _endpoint(settings, endpoints, endpoint_id, workspace)
    rows = WebhookDeliveries(endpoints.db).of_endpoint(endpoint.id, FAILED if failed else None, limit)
    if not rows:
        settings.out.print(f"no {'failed ' if failed else ''}deliveries to {endpoint.id}")
        return
    from rich.table import Table
    from rich.text import Text

    from cli.render import safe

    table = Table()
    for column in ("event", "type", "status", "attempts", "last answer", "why", "updated"):
        table.add_column(column, no_wrap=column in ("event", "type"))
    styles = {"delivered": "green", "pending": "yellow", "failed": "red"}
    for row in rows:
        table.add_row(Text(row.event_id), Text(row.type), Text(row.status, style=styles.get(row.status, "")),
                      str(row.attempts), str(row.last_status or "—"), Text(safe(row.last_error or "")),
                      row.updated_at[:19].replace("T", " "))  # fmt: skip
    settings.out.print(table)


@webhook_app.command("types")
def types(ctx: typer.Context) -> None:
    """Every event type an endpoint can subscribe to (`all`: every one, and any added later)."""
    from corral.contract.webhooks import WEBHOOK_EVENT_TYPES

    for name in sorted(WEBHOOK_EVENT_TYPES):
        print(name)
