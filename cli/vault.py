"""`corral vault`: vaults and their credentials. Secrets are write-only: read from stdin or a file, never from an
argument (arguments end up in shell history and `ps`), and never printed back.

Vault access comes from `VAULT_ADDR` + `VAULT_TOKEN` (an operator's own), else from the state dir's durable OpenBao
that `corral up` runs (its address and token are kept in the state directory, readable by this user only).
"""

from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from cli.context import CliError, Settings, fail, settings_of
from corral.names import ENV_VAULT_MOUNT

if TYPE_CHECKING:
    from pydantic import SecretStr

    from proxy import VaultStore

# The Vault client, the proxy library and the contract are imported by the commands that use them: `corral --help`
# and every other command start without them (see bench/cli_startup.py).

vault_app = typer.Typer(name="vault", help="Vaults of credentials for MCP servers (secrets are write-only).")


def vault_store(settings: Settings) -> VaultStore:
    """The Vault this CLI user may write to: `VAULT_ADDR`/`VAULT_TOKEN`, else the state dir's OpenBao."""
    import hvac

    from cli import stack
    from proxy import ProxyError, VaultStore, ensure_local_vault

    address = os.environ.get("VAULT_ADDR") or os.environ.get("BAO_ADDR")
    token = os.environ.get("VAULT_TOKEN") or os.environ.get("BAO_TOKEN")
    if address and token:
        client = hvac.Client(url=address, token=token)
    else:
        try:
            local = ensure_local_vault(settings.state_dir)
        except ProxyError as exc:
            raise CliError(f"no Vault: {exc}", hint="run `corral up`, or set VAULT_ADDR and VAULT_TOKEN") from exc
        settings.paths.ensure()  # started here if `corral up` has not: `corral down` stops it all the same
        settings.paths.pid_file(stack.VAULT).write_text(f"{local.vault.pid}\n")
        client = local.vault.client()
    return VaultStore(client, os.environ.get(ENV_VAULT_MOUNT, "corral"))


def _read_secret(source: Path | None, what: str) -> SecretStr:
    """A secret from a file, or from stdin (`-` or no file); trailing newlines are dropped."""
    from pydantic import SecretStr

    if source is None or str(source) == "-":
        if sys.stdin.isatty():
            raise CliError(f"give the {what} on stdin (e.g. `… < token.txt`) or with a --*-file option", exit_code=2)
        text = sys.stdin.read()
    else:
        try:
            text = source.read_text()
        except OSError as exc:
            raise CliError(f"cannot read the {what} from {source}: {exc.strerror}", exit_code=2) from None
    secret = text.strip("\r\n")
    if not secret:
        raise CliError(f"the {what} is empty", exit_code=2)
    return SecretStr(secret)


def _as_cli_error(error: Exception) -> CliError:
    """A Vault failure as a message; a ValueError is the store refusing the input (a name too long, say)."""
    if isinstance(error, CliError):
        return error
    return CliError(str(error), exit_code=2 if isinstance(error, ValueError) else 1)


@vault_app.command("create")
def create(ctx: typer.Context, name: Annotated[str, typer.Argument(help="A display name.")]) -> None:
    """Create a vault; prints its id (`vlt_…`)."""
    from proxy import ProxyError

    settings = settings_of(ctx)
    try:
        vault = vault_store(settings).create_vault(name)
    except (CliError, ProxyError, ValueError) as exc:
        fail(settings, _as_cli_error(exc))
    print(vault.id)


@vault_app.command("add-credential")
def add_credential(
    ctx: typer.Context,
    vault_id: Annotated[str, typer.Argument(help="The vault (`vlt_…`).")],
    mcp_server_url: Annotated[str, typer.Option("--mcp-server-url", help="The MCP server this credential is for.")],
    kind: Annotated[Literal["static_bearer", "mcp_oauth"], typer.Option(help="Credential kind.")] = "static_bearer",
    token_file: Annotated[
        Path | None, typer.Option(help="File holding the token / access token; default: stdin.")
    ] = None,
    expires_at: Annotated[datetime | None, typer.Option(help="mcp_oauth: when the access token expires.")] = None,
    token_endpoint: Annotated[str | None, typer.Option(help="mcp_oauth: the OAuth token endpoint.")] = None,
    client_id: Annotated[str | None, typer.Option(help="mcp_oauth: the OAuth client id.")] = None,
    refresh_token_file: Annotated[Path | None, typer.Option(help="mcp_oauth: file holding the refresh token.")] = None,
    client_auth: Annotated[
        Literal["none", "client_secret_basic", "client_secret_post"], typer.Option(help="mcp_oauth: client auth.")
    ] = "none",
    client_secret_file: Annotated[Path | None, typer.Option(help="mcp_oauth: file holding the client secret.")] = None,
) -> None:
    """Add a credential bound to one MCP server URL (one active per URL per vault); prints its id."""
    from pydantic import ValidationError

    from proxy import (
        McpOAuthParams,
        McpOAuthRefreshParams,
        ProxyError,
        StaticBearerParams,
        TokenEndpointAuthBasic,
        TokenEndpointAuthNone,
        TokenEndpointAuthPost,
    )
    from proxy.models import TokenEndpointAuth

    settings = settings_of(ctx)
    try:
        token = _read_secret(token_file, "token")
        params: McpOAuthParams | StaticBearerParams
        if kind == "static_bearer":
            params = StaticBearerParams(mcp_server_url=mcp_server_url, token=token)
        else:
            refresh = None
            if refresh_token_file is not None:
                if not (token_endpoint and client_id):
                    raise CliError("a refresh token needs --token-endpoint and --client-id", exit_code=2)
                auth: TokenEndpointAuth = TokenEndpointAuthNone()
                if client_auth != "none":
                    secret = _read_secret(client_secret_file, "client secret")
                    auth = (
                        TokenEndpointAuthBasic(client_secret=secret)
                        if client_auth == "client_secret_basic"
                        else TokenEndpointAuthPost(client_secret=secret)
                    )
                refresh = McpOAuthRefreshParams(
                    token_endpoint=token_endpoint,
                    client_id=client_id,
                    refresh_token=_read_secret(refresh_token_file, "refresh token"),
                    token_endpoint_auth=auth,
                )
            params = McpOAuthParams(
                mcp_server_url=mcp_server_url, access_token=token, expires_at=expires_at, refresh=refresh
            )
        credential = vault_store(settings).add_credential(vault_id, params)
    except ValidationError as exc:
        fail(settings, CliError(f"invalid credential: {exc.errors()[0]['msg']}", exit_code=2))
    except (CliError, ProxyError, ValueError) as exc:
        fail(settings, _as_cli_error(exc))
    print(credential.id)


@vault_app.command("ls")
def list_vaults(
    ctx: typer.Context,
    vault_id: Annotated[str | None, typer.Argument(help="List this vault's credentials instead.")] = None,
) -> None:
    """List vaults, or the credentials of one vault (metadata only; secrets are never shown)."""
    from rich.table import Table

    from proxy import ProxyError

    settings = settings_of(ctx)
    try:
        store = vault_store(settings)
        table = Table()
        if vault_id is None:
            for column in ("id", "name", "created"):
                table.add_column(column)
            for vault in store.list_vaults():
                table.add_row(vault.id, vault.display_name, str(vault.created_at))
        else:
            for column in ("id", "kind", "mcp server url", "expires"):
                table.add_column(column)
            for credential in store.list_credentials(vault_id):
                expires = str(credential.expires_at) if credential.expires_at else "—"
                table.add_row(credential.id, credential.kind, credential.mcp_server_url, expires)
    except (CliError, ProxyError, ValueError) as exc:
        fail(settings, _as_cli_error(exc))
    settings.out.print(table)


def store_repository(
    settings: Settings, session_id: str, url: str, token_file: Path | None, branch: str | None
) -> dict[str, object]:
    """Put a repository's token in Vault for this session (before it starts) and return the resource the
    workflow gets instead: the URL and an id, never the token."""
    from pydantic import ValidationError

    from corral.contract.proxy import GitRepositoryResource
    from proxy import ProxyError

    resource: dict[str, object] = {"type": "github_repository", "url": url, "repository_id": "repo1"}
    if branch:
        resource["checkout"] = {"type": "branch", "name": branch}
    try:
        GitRepositoryResource.model_validate(resource)
    except ValidationError as exc:
        error = exc.errors()[0]
        option = "--repo-branch" if error["loc"][:1] == ("checkout",) else "--repo"
        raise CliError(f"{option}: {error['msg']}", exit_code=2) from None
    token = _read_secret(token_file, "repository token")
    try:
        vault_store(settings).store_repository_token(session_id, "repo1", url, token.get_secret_value())
    except ProxyError as exc:
        raise CliError(f"could not store the repository token: {exc}") from exc
    return resource
