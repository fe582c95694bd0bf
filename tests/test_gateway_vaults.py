"""Vaults, credentials and repository tokens through the gateway, driven by the `anthropic` SDK against a real
gateway process logged in to the OpenBao dev server: a credential written over HTTP is what the proxy worker uses
for a session's MCP call, and its secret shows in no response, no history, no event and no gateway log line."""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import docker
import httpx2
import pytest

from activities.proxy import ProxyActivities
from activities.sandbox import SandboxActivities
from corral.apikeys import create_key
from corral.contract.events import AgentMcpToolResult
from corral.records import Records
from corral.serving import ServerThread
from corral.temporal import cluster_id
from proxy import GitProxyServer, McpProxy, McpServer, SessionBinding, VaultStore
from proxy.access import ensure_gateway_role
from tests.chaos._processes import RoleProcess, role_process, until_healthy
from tests.conftest import Stack, history_text, remove_sandboxes, texts, unique, wait_for_idle
from tests.ports import closed_port, free_port
from tests.proxy_servers.devvault import scan_for, shared_dev_vault
from tests.proxy_servers.git_server import GitServerLog, create_git_app, make_bare_repository
from tests.proxy_servers.mcp_server import create_mcp_app
from tests.proxy_servers.oauth_server import TOKEN_PATH, create_token_app
from tests.proxy_servers.tokens import TokenAuthority
from workers.proxy import proxy_worker
from workers.roles import sandbox_workers

pytestmark = pytest.mark.timeout(300)


@dataclass
class Gateway:
    url: str
    process: RoleProcess
    records: Records
    responses: list[str] = field(default_factory=list)
    """Every response body any client of this gateway read: the scans for secrets read them all."""

    async def client(self, workspace: str) -> anthropic.AsyncAnthropic:
        # Each test its own workspaces: a listing must not meet records whose test (and worker) is gone.
        key, _ = await create_key(self.records, unique(workspace))

        async def keep(response: httpx2.Response) -> None:
            await response.aread()
            self.responses.append(response.text)

        http = anthropic.DefaultAsyncHttpxClient(event_hooks={"response": [keep]})
        return anthropic.AsyncAnthropic(base_url=self.url, api_key=key, max_retries=0, http_client=http)


def gateway_argv(stack: Stack, port: int) -> list[str]:
    address = stack.client.service_client.config.target_host
    return [sys.executable, "-m", "gateway", "--port", str(port), "--temporal", address,
            "--harness-queue", stack.harness_queue, "--model-queue", stack.model_queue]  # fmt: skip


def vault_login_env() -> dict[str, str]:
    """A gateway's environment as `corral up` gives it: the dev Vault, and the write-only AppRole's login."""
    dev_vault = shared_dev_vault()
    login = ensure_gateway_role(dev_vault.client(), dev_vault.mount)
    return {"VAULT_ADDR": dev_vault.address, "VAULT_ROLE_ID": login.role_id,
            "VAULT_SECRET_ID": login.secret_id.get_secret_value(), "CORRAL_VAULT_MOUNT": dev_vault.mount}  # fmt: skip


@pytest.fixture
async def gateway(stack: Stack, tmp_path: Path) -> AsyncIterator[Gateway]:
    """A gateway logged in to the dev Vault as `corral up`'s is: through its environment, with the write-only
    AppRole (proxy/access.py), so every test here also shows the routes need no read of a secret."""
    port, env = free_port(), vault_login_env()
    with role_process("gateway", gateway_argv(stack, port), tmp_path, **env) as process:
        url = f"http://127.0.0.1:{port}"
        await until_healthy(url, process)
        yield Gateway(url, process, Records(stack.client, task_queue=stack.harness_queue))


@pytest.fixture
def store() -> VaultStore:
    dev_vault = shared_dev_vault()
    return VaultStore(dev_vault.client(), dev_vault.mount)


@pytest.fixture
async def proxy(stack: Stack, store: VaultStore) -> AsyncIterator[None]:
    """The proxy worker: the one process that reads secrets, so it runs the validations the gateway asks for."""
    async with proxy_worker(stack.client, ProxyActivities(store)):
        yield


@pytest.fixture
def authority() -> TokenAuthority:
    return TokenAuthority(client_secret="canary-client-secret-" + uuid.uuid4().hex)


@pytest.fixture
def mcp_url(authority: TokenAuthority) -> Iterator[str]:
    with ServerThread(lambda url: create_mcp_app(authority, url), name="mcp", lifespan="on", app_takes_url=True) as mcp:
        assert mcp.base_url
        yield f"{mcp.base_url}/mcp"


@pytest.fixture
def token_endpoint(authority: TokenAuthority) -> Iterator[str]:
    with ServerThread(create_token_app(authority), name="token-endpoint") as server:
        assert server.base_url
        yield server.base_url + TOKEN_PATH


def user_message(text: str) -> Any:
    return {"type": "user.message", "content": [{"type": "text", "text": text}]}


async def test_vaults_are_records_of_the_workspace_and_the_proxys_vaults(gateway: Gateway, store: VaultStore) -> None:
    client, other = await gateway.client("team-a"), await gateway.client("team-b")
    vault = await client.beta.vaults.create(display_name="tools", metadata={"team": "a"})
    assert (vault.type, vault.display_name, vault.metadata, vault.archived_at) == (
        "vault",
        "tools",
        {"team": "a"},
        None,
    )
    assert vault.id.startswith("vlt_")
    assert store.get_vault(vault.id).display_name == "tools", "the proxy knows the vault by the same id"

    updated = await client.beta.vaults.update(vault.id, display_name="mcp tools", metadata={"team": None, "x": "1"})
    assert (updated.display_name, updated.metadata) == ("mcp tools", {"x": "1"})
    assert (await client.beta.vaults.retrieve(vault.id)).display_name == "mcp tools"
    assert store.get_vault(vault.id).display_name == "mcp tools"
    listed = [v.id async for v in client.beta.vaults.list()]
    assert vault.id in listed
    assert vault.id not in [v.id async for v in other.beta.vaults.list()]
    for lookup in (
        other.beta.vaults.retrieve(vault.id),
        other.beta.vaults.update(vault.id, display_name="taken"),
        other.beta.vaults.archive(vault.id),
        other.beta.vaults.delete(vault.id),
        other.beta.vaults.credentials.list(vault.id),
        other.beta.vaults.credentials.create(
            vault.id, auth={"type": "static_bearer", "mcp_server_url": "https://mcp.example/mcp", "token": "t0k"}
        ),
    ):
        with pytest.raises(anthropic.NotFoundError):
            await lookup
    assert store.list_credentials(vault.id) == [], "another workspace wrote nothing"
    with pytest.raises(anthropic.BadRequestError, match="display_name"):
        await client.beta.vaults.create(display_name="")

    # Credentials of both kinds; what comes back is metadata only.
    secrets = ["at-" + uuid.uuid4().hex, "rt-" + uuid.uuid4().hex, "cs-" + uuid.uuid4().hex, "sb-" + uuid.uuid4().hex]
    refresh: Any = {"token_endpoint": "https://auth.example/token", "client_id": "corral", "refresh_token": secrets[1],
                    "token_endpoint_auth": {"type": "client_secret_basic", "client_secret": secrets[2]}}  # fmt: skip
    oauth = await client.beta.vaults.credentials.create(
        vault.id,
        auth={
            "type": "mcp_oauth",
            "mcp_server_url": "https://a.example/mcp",
            "access_token": secrets[0],
            "expires_at": "2030-01-02T03:04:05Z",
            "refresh": refresh,
        },
    )
    bearer = await client.beta.vaults.credentials.create(
        vault.id, auth={"type": "static_bearer", "mcp_server_url": "https://b.example/mcp", "token": secrets[3]}
    )
    assert oauth.auth.type == "mcp_oauth" and oauth.auth.refresh is not None
    assert oauth.auth.refresh.token_endpoint_auth.type == "client_secret_basic"
    assert oauth.auth.expires_at is not None and oauth.auth.expires_at.year == 2030
    paged = [c.id async for c in client.beta.vaults.credentials.list(vault.id, limit=1)]
    assert sorted(paged) == sorted([oauth.id, bearer.id]), "pages of one, each credential once"
    with pytest.raises(anthropic.BadRequestError, match=r"auth\.refresh"):
        await client.beta.vaults.credentials.update(
            oauth.id, vault_id=vault.id, auth={"type": "mcp_oauth", "access_token": "at-new"}
        )
    with pytest.raises(anthropic.BadRequestError, match="cannot become"):
        await client.beta.vaults.credentials.update(
            bearer.id, vault_id=vault.id, auth={"type": "mcp_oauth", "access_token": "at-new"}
        )
    with pytest.raises(anthropic.BadRequestError, match="mcp_server_url"):
        await client.beta.vaults.credentials.create(
            vault.id, auth={"type": "static_bearer", "mcp_server_url": "ftp://c.example", "token": "t0k"}
        )
    assert scan_for(secrets, *gateway.responses) == []

    archived = await client.beta.vaults.archive(vault.id)
    assert archived.archived_at is not None and store.get_vault(vault.id).archived_at is not None
    assert vault.id not in [v.id async for v in client.beta.vaults.list()]
    assert vault.id in [v.id async for v in client.beta.vaults.list(include_archived=True)]
    with pytest.raises(anthropic.BadRequestError, match="archived"):
        await client.beta.vaults.credentials.create(
            vault.id, auth={"type": "static_bearer", "mcp_server_url": "https://mcp.example/mcp", "token": "t0k"}
        )
    deleted = await client.beta.vaults.delete(vault.id)
    assert (deleted.id, deleted.type) == (vault.id, "vault_deleted")
    with pytest.raises(anthropic.NotFoundError):
        await client.beta.vaults.retrieve(vault.id)
    with pytest.raises(Exception, match="no vault"):
        store.get_vault(vault.id)
    with pytest.raises(Exception, match="no vault"):
        store.list_credentials(vault.id)


async def test_an_mcp_oauth_credential_is_validated_live_against_its_server(
    gateway: Gateway, proxy: None, store: VaultStore, authority: TokenAuthority, mcp_url: str, token_endpoint: str
) -> None:
    """`mcp_oauth_validate` has the proxy worker (the gateway may not read the token) probe the real MCP server
    with the stored token; on a 401 it refreshes at the real
    token endpoint, stores the new token (which the proxy's calls then use) and probes again. No answer shows a
    token, a refresh token or the client secret, even the answer of a server that quotes the token back."""
    client, other = await gateway.client("team-a"), await gateway.client("team-b")
    authority.client_auth = "client_secret_basic"
    assert authority.client_secret is not None
    secrets = [authority.client_secret]

    async def credential(
        access: str, refresh: str | None = None, url: str = mcp_url, endpoint: str = token_endpoint
    ) -> tuple[str, str]:
        """A vault of its own (one credential per server URL and vault) with one mcp_oauth credential."""
        vault = await client.beta.vaults.create(display_name="validated")
        auth: Any = {"type": "mcp_oauth", "mcp_server_url": url, "access_token": access}
        if refresh is not None:
            client_auth = {"type": "client_secret_basic", "client_secret": authority.client_secret}
            auth["refresh"] = {"token_endpoint": endpoint, "client_id": authority.client_id, "refresh_token": refresh,
                               "token_endpoint_auth": client_auth}  # fmt: skip
        created = await client.beta.vaults.credentials.create(vault.id, auth=auth)
        secrets.extend([access, *([refresh] if refresh else [])])
        return vault.id, created.id

    async def validate(ids: tuple[str, str]) -> Any:
        vault_id, credential_id = ids
        return await client.beta.vaults.credentials.mcp_oauth_validate(credential_id, vault_id=vault_id)

    # A token the server accepts.
    good = await credential(authority.issue_access_token())
    valid = await validate(good)
    assert (valid.type, valid.vault_id, valid.credential_id) == ("vault_credential_validation", *good)
    assert (valid.status, valid.mcp_probe, valid.refresh, valid.has_refresh_token) == ("valid", None, None, False)
    assert valid.validated_at.tzinfo is not None

    # A token the server rejects, and nothing to refresh it with: the server's 401 is the failing step.
    rejected = await validate(await credential("at-unknown-" + uuid.uuid4().hex))
    assert (rejected.status, rejected.has_refresh_token) == ("invalid", False)
    assert rejected.refresh is not None and rejected.refresh.status == "no_refresh_token"
    assert rejected.mcp_probe is not None and rejected.mcp_probe.method in ("server/discover", "initialize")
    answer = rejected.mcp_probe.http_response
    assert answer is not None and answer.status_code == 401 and "invalid_token" in answer.body
    assert answer.content_type.startswith("application/json") and not answer.body_truncated

    # A rejected token with a working refresh token: refreshed, stored, probed again with the new token.
    stale_refresh = authority.issue_refresh_token()
    refreshed_ids = await credential("at-stale-" + uuid.uuid4().hex, stale_refresh)
    refreshed = await validate(refreshed_ids)
    assert (refreshed.status, refreshed.mcp_probe, refreshed.has_refresh_token) == ("valid", None, True)
    assert refreshed.refresh is not None
    assert (refreshed.refresh.status, refreshed.refresh.http_response) == ("succeeded", None)
    assert [(r.refresh_token, r.granted) for r in authority.refreshes] == [(stale_refresh, True)]
    stored = store._resolve_mcp_credential([refreshed_ids[0]], mcp_url)
    assert stored is not None and stored.token.get_secret_value().startswith("at-refreshed-")
    assert stored.refresh_token is not None
    secrets.extend([stored.token.get_secret_value(), stored.refresh_token.get_secret_value()])
    # The stored token is the one a session's MCP call carries (no second refresh), and it validates as it is.
    session_id = "sesn_" + uuid.uuid4().hex
    binding = SessionBinding(session_id=session_id, reference=store.bind_session(session_id, [refreshed_ids[0]]))
    added = await McpProxy(store).call_tool(binding, McpServer(name="tools", url=mcp_url), "add", {"a": 2, "b": 3})
    assert added.text == "5" and authority.tool_calls == [("add", stored.token.get_secret_value())]
    again = await validate(refreshed_ids)
    assert (again.status, again.refresh, len(authority.refreshes)) == ("valid", None, 1)

    # A refresh token the endpoint refuses: its OAuth error is shown, the credential is invalid, nothing stored.
    revoked = authority.issue_refresh_token()
    authority.revoke_refresh_token(revoked)
    refused_ids = await credential("at-stale-" + uuid.uuid4().hex, revoked)
    refused = await validate(refused_ids)
    assert refused.status == "invalid" and refused.mcp_probe is not None and refused.refresh is not None
    assert refused.mcp_probe.http_response is not None and refused.mcp_probe.http_response.status_code == 401
    endpoint_answer = refused.refresh.http_response
    assert refused.refresh.status == "failed" and endpoint_answer is not None
    assert endpoint_answer.status_code == 400 and "invalid_grant" in endpoint_answer.body
    unchanged = store._resolve_mcp_credential([refused_ids[0]], mcp_url)
    assert unchanged is not None and unchanged.token.get_secret_value().startswith("at-stale-")

    # A token endpoint that cannot be reached: whether the credential works is unknown.
    with closed_port() as port:
        nowhere = f"http://127.0.0.1:{port}{TOKEN_PATH}"
        cut_off = await validate(await credential("at-stale-" + uuid.uuid4().hex, "rt-lost", endpoint=nowhere))
    assert cut_off.status == "unknown" and cut_off.refresh is not None and cut_off.refresh.status == "connect_error"
    assert cut_off.refresh.http_response is None and cut_off.mcp_probe is not None

    # A token endpoint in trouble (503): its answer is shown, and the verdict waits for a better time.
    in_trouble = mcp_url.removesuffix("/mcp") + "/unavailable"
    troubled = await validate(await credential("at-stale-" + uuid.uuid4().hex, "rt-kept", endpoint=in_trouble))
    assert troubled.status == "unknown" and troubled.refresh is not None and troubled.refresh.status == "failed"
    assert troubled.refresh.http_response is not None and troubled.refresh.http_response.status_code == 503

    # An MCP server that cannot be reached: unknown, and the step that got no answer.
    with closed_port() as port:
        down = await validate(await credential(authority.issue_access_token(), url=f"http://127.0.0.1:{port}/mcp"))
    assert (down.status, down.refresh) == ("unknown", None)
    assert down.mcp_probe is not None and down.mcp_probe.method in ("server/discover", "initialize")
    assert down.mcp_probe.http_response is None

    # A server that quotes the token back in its 401: its answer is shown, scrubbed.
    careless_url = mcp_url.removesuffix("/mcp") + "/careless"
    quoted = await validate(await credential("at-quoted-" + uuid.uuid4().hex, url=careless_url))
    assert quoted.status == "invalid" and quoted.mcp_probe is not None
    quoted_answer = quoted.mcp_probe.http_response
    assert quoted_answer is not None and "invalid_token" in quoted_answer.body and "[redacted]" in quoted_answer.body

    # Not this workspace's, not there, not mcp_oauth, archived: refused, in the upstream error shape.
    with pytest.raises(anthropic.NotFoundError):
        await other.beta.vaults.credentials.mcp_oauth_validate(good[1], vault_id=good[0])
    their_vault = await other.beta.vaults.create(display_name="theirs")
    with pytest.raises(anthropic.NotFoundError):
        await other.beta.vaults.credentials.mcp_oauth_validate(good[1], vault_id=their_vault.id)
    with pytest.raises(anthropic.NotFoundError, match="credential"):
        await client.beta.vaults.credentials.mcp_oauth_validate("vcrd_nosuchcredential", vault_id=good[0])
    bearer_vault = await client.beta.vaults.create(display_name="bearer")
    bearer_token = authority.issue_access_token()
    secrets.append(bearer_token)
    bearer = await client.beta.vaults.credentials.create(
        bearer_vault.id, auth={"type": "static_bearer", "mcp_server_url": mcp_url, "token": bearer_token}
    )
    with pytest.raises(anthropic.BadRequestError, match=r"static_bearer: .* mcp_oauth credentials only"):
        await client.beta.vaults.credentials.mcp_oauth_validate(bearer.id, vault_id=bearer_vault.id)
    await client.beta.vaults.credentials.archive(good[1], vault_id=good[0])
    with pytest.raises(anthropic.BadRequestError, match="archived"):
        await client.beta.vaults.credentials.mcp_oauth_validate(good[1], vault_id=good[0])

    validations = [text for text in gateway.responses if "vault_credential_validation" in text]
    assert len(validations) == 9, "every validation's answer was kept for the scan"
    assert scan_for(secrets, *gateway.responses, gateway.process.log.read_text()) == []


async def test_a_credential_over_http_authenticates_a_sessions_mcp_call_and_is_never_shown(
    stack: Stack, gateway: Gateway, store: VaultStore, authority: TokenAuthority, mcp_url: str
) -> None:
    client, other = await gateway.client("team-a"), await gateway.client("team-b")
    vault = await client.beta.vaults.create(display_name="mcp")
    token = authority.issue_access_token()  # the canary: a real token the MCP server accepts
    credential = await client.beta.vaults.credentials.create(
        vault.id,
        auth={"type": "static_bearer", "mcp_server_url": mcp_url, "token": token},
        display_name="test server",
    )
    assert (credential.type, credential.vault_id, credential.auth.type) == (
        "vault_credential",
        vault.id,
        "static_bearer",
    )
    assert (
        credential.auth.type == "static_bearer"
        and credential.auth.mcp_server_url == mcp_url
        and credential.display_name == "test server"
    )
    assert [c.id async for c in client.beta.vaults.credentials.list(vault.id)] == [credential.id]
    retrieved = await client.beta.vaults.credentials.retrieve(credential.id, vault_id=vault.id)
    assert retrieved.id == credential.id

    # One active credential per server URL: the second is a conflict, another spelling of the URL too.
    for url in (mcp_url, mcp_url + "/"):
        with pytest.raises(anthropic.ConflictError, match=credential.id):
            await client.beta.vaults.credentials.create(
                vault.id, auth={"type": "static_bearer", "mcp_server_url": url, "token": "second-" + token}
            )
    # A secret meant for the sandbox is refused, and the answer says why and what to use.
    with pytest.raises(anthropic.BadRequestError) as refused:
        await client.beta.vaults.credentials.create(
            vault.id,
            auth={
                "type": "environment_variable",
                "secret_name": "API_KEY",
                "secret_value": "env-" + token,
                "networking": {"type": "unrestricted"},
            },
        )
    message = str(refused.value)
    assert "never reach the sandbox" in message and "static_bearer" in message and "github_repository" in message
    assert len(store.list_credentials(vault.id)) == 1, "refused credentials wrote nothing"
    relabelled = await client.beta.vaults.credentials.update(credential.id, vault_id=vault.id, metadata={"k": "v"})
    assert relabelled.metadata == {"k": "v"}

    model = stack.script(
        [
            {"tool_uses": [{"name": "mcp__tools__add", "input": {"a": 2, "b": 40}}]},
            {"text": "sum:", "echo_last_user": True},
            {"tool_uses": [{"name": "mcp__tools__add", "input": {"a": 1, "b": 1}}]},
            {"text": "again:", "echo_last_user": True},
        ]
    )
    agent = await client.beta.agents.create(
        name="mcp user",
        model=model,
        mcp_servers=[{"type": "url", "name": "tools", "url": mcp_url}],
        tools=[
            {
                "type": "mcp_toolset",
                "mcp_server_name": "tools",
                "default_config": {"permission_policy": {"type": "always_allow"}},
            }
        ],
    )
    environment = await client.beta.environments.create(name="plain")
    theirs = await other.beta.agents.create(name="theirs", model=model)
    their_environment = await other.beta.environments.create(name="theirs")
    with pytest.raises(anthropic.NotFoundError, match="vault"):
        await other.beta.sessions.create(agent=theirs.id, environment_id=their_environment.id, vault_ids=[vault.id])
    with pytest.raises(anthropic.NotFoundError, match="vault"):
        await client.beta.sessions.create(agent=agent.id, environment_id=environment.id, vault_ids=["vlt_nosuchvault"])

    async with proxy_worker(stack.client, ProxyActivities(store)):
        session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id, vault_ids=[vault.id])
        assert session.vault_ids == [vault.id]
        await client.beta.sessions.events.send(session.id, events=[user_message("add")])
        handle = stack.client.get_workflow_handle(session.id)
        events = await wait_for_idle(handle, within_seconds=60)
        [result] = [e for e in events if isinstance(e, AgentMcpToolResult)]
        assert not result.is_error and result.content[0].text == "42"
        assert authority.tool_calls == [("add", token)], "the call carried the token written over HTTP"

        # A rotation over HTTP: the running session's next call carries the new token.
        rotated_token = authority.issue_access_token()
        rotated = await client.beta.vaults.credentials.update(
            credential.id, vault_id=vault.id, auth={"type": "static_bearer", "token": rotated_token}
        )
        assert rotated.auth.type == "static_bearer" and rotated.auth.mcp_server_url == mcp_url
        await client.beta.sessions.events.send(session.id, events=[user_message("again")])
        events = await wait_for_idle(handle, after=events[-1].position, within_seconds=60)
        [result] = [e for e in events if isinstance(e, AgentMcpToolResult)]
        assert not result.is_error and result.content[0].text == "2"
    assert authority.tool_calls == [("add", token), ("add", rotated_token)]

    listed = [e.model_dump_json() async for e in client.beta.sessions.events.list(session.id)]
    assert "agent.mcp_tool_result" in "".join(listed)
    archived = await client.beta.vaults.credentials.archive(credential.id, vault_id=vault.id)
    assert archived.archived_at is not None
    deleted = await client.beta.vaults.credentials.delete(credential.id, vault_id=vault.id)
    assert deleted.type == "vault_credential_deleted"
    with pytest.raises(anthropic.NotFoundError):
        await client.beta.vaults.credentials.retrieve(credential.id, vault_id=vault.id)

    secrets = [token, rotated_token, "second-" + token, "env-" + token]
    assert gateway.responses, "the responses were kept"
    assert (
        scan_for(secrets, *gateway.responses, *listed, await history_text(handle), gateway.process.log.read_text())
        == []
    )


async def test_a_repository_token_goes_to_vault_and_never_into_the_session(
    stack: Stack, gateway: Gateway, store: VaultStore
) -> None:
    client = await gateway.client("team-a")
    agent = await client.beta.agents.create(name="coder", model=stack.script([{"text": "ok"}]))
    environment = await client.beta.environments.create(name="plain")
    token = "ghp_canary" + uuid.uuid4().hex
    url = "https://git.example/acme/widgets.git"
    session = await client.beta.sessions.create(
        agent=agent.id,
        environment_id=environment.id,
        resources=[
            {
                "type": "github_repository",
                "url": url,
                "authorization_token": token,
                "checkout": {"type": "branch", "name": "main"},
            }
        ],
    )
    [resource] = session.resources
    assert resource.type == "github_repository"
    assert (resource.type, resource.url, resource.mount_path) == ("github_repository", url, "/workspace/widgets")
    [stored] = store.list_repositories(session.id)
    assert (stored.repo_id, stored.url) == (resource.id, url), "the token is in Vault under the session"
    resolved = store._resolve_repository(session.id, resource.id)
    assert resolved is not None and resolved.token.get_secret_value() == token
    handle = stack.client.get_workflow_handle(session.id)
    history = await history_text(handle)
    assert url in history, "the session has the repository"

    listed = [r async for r in client.beta.sessions.resources.list(session.id)]
    assert [r.model_dump(exclude_none=True) for r in listed] == [resource.model_dump(exclude_none=True)]
    retrieved = await client.beta.sessions.resources.retrieve(resource.id, session_id=session.id)
    assert retrieved.type == "github_repository" and retrieved.url == url
    assert retrieved.checkout is not None and retrieved.checkout.model_dump() == {"type": "branch", "name": "main"}
    rotated_token = "ghp_rotated" + uuid.uuid4().hex
    await client.beta.sessions.resources.update(resource.id, session_id=session.id, authorization_token=rotated_token)
    resolved = store._resolve_repository(session.id, resource.id)
    assert resolved is not None and resolved.token.get_secret_value() == rotated_token, "the token was rotated"
    with pytest.raises(anthropic.BadRequestError, match="rotate its token"):
        await client.beta.sessions.resources.delete(resource.id, session_id=session.id)
    assert [r.model_dump()["id"] async for r in client.beta.sessions.resources.list(session.id)] == [resource.id]
    stranger = await gateway.client("team-b")
    with pytest.raises(anthropic.NotFoundError):
        await stranger.beta.sessions.resources.list(session.id)
    with pytest.raises(anthropic.NotFoundError):
        await stranger.beta.sessions.resources.update(resource.id, session_id=session.id, authorization_token="x" * 9)
    with pytest.raises(anthropic.BadRequestError, match="authorization_token"):
        await client.beta.sessions.create(
            agent=agent.id, environment_id=environment.id, resources=[{"type": "github_repository", "url": url}]
        )
    with pytest.raises(anthropic.NotFoundError, match="file 'file_1' was not found"):  # files: test_api_knowledge
        await client.beta.sessions.create(
            agent=agent.id, environment_id=environment.id, resources=[{"type": "file", "file_id": "file_1"}]
        )
    await handle.terminate("test over")
    with pytest.raises(anthropic.BadRequestError, match="ended"):
        await client.beta.sessions.resources.update(resource.id, session_id=session.id, authorization_token="late")
    history = await history_text(handle)
    assert scan_for([token, rotated_token], *gateway.responses, history, gateway.process.log.read_text()) == []


async def test_a_gateway_without_vault_answers_503_on_vaults_only(stack: Stack, tmp_path: Path) -> None:
    port = free_port()
    env = {"VAULT_ADDR": "", "BAO_ADDR": "", "VAULT_TOKEN": "", "BAO_TOKEN": ""}
    with role_process("gateway", gateway_argv(stack, port), tmp_path, **env) as process:
        url = f"http://127.0.0.1:{port}"
        await until_healthy(url, process)
        key, _ = await create_key(Records(stack.client, task_queue=stack.harness_queue), unique("team"))
        client = anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0)
        with pytest.raises(anthropic.InternalServerError, match="no Vault configured") as unavailable:
            await client.beta.vaults.create(display_name="nowhere")
        assert unavailable.value.status_code == 503
        assert [v async for v in client.beta.vaults.list()] == [], "no vault record was written"
        assert (await client.beta.environments.create(name="still works")).id.startswith("env_")


async def test_a_repository_given_over_http_is_cloned_through_the_git_proxy(
    stack: Stack,
    gateway: Gateway,
    store: VaultStore,
    docker_client: docker.DockerClient,
    sandbox_image: str,
    tmp_path: Path,
) -> None:
    """The whole way: the token of a `github_repository` resource given to the gateway is what the git proxy
    sends to the git server when the sandbox clones, and the sandbox never sees it."""
    token = f"ghp_canary{uuid.uuid4().hex}"
    root = tmp_path / "repos"
    root.mkdir()
    make_bare_repository(root, "app", tmp_path / "scratch")
    log = GitServerLog()
    port = free_port()
    git_proxy = GitProxyServer(store, host="0.0.0.0", port=port)
    git_proxy.start()
    sandbox = SandboxActivities(docker_client, sandbox_image, await cluster_id(stack.client), git_proxy_port=port)
    session_id = None
    try:
        with ServerThread(create_git_app(root, token, log), name="git-server") as server:
            async with AsyncExitStack() as workers:
                await workers.enter_async_context(proxy_worker(stack.client, ProxyActivities(store)))
                for worker in sandbox_workers(stack.client, sandbox):
                    await workers.enter_async_context(worker)
                client = await gateway.client("team-a")
                commands = ["cd /workspace/app && git log --oneline | wc -l", "env; cat /workspace/app/.git/config"]
                script: list[dict[str, Any]] = [
                    *({"tool_uses": [{"name": "bash", "input": {"command": command}}]} for command in commands),
                    {"text": "done"},
                ]
                agent = await client.beta.agents.create(
                    name="coder", model=stack.script(script), tools=[{"type": "agent_toolset_20260401"}]
                )
                environment = await client.beta.environments.create(name="plain")
                session = await client.beta.sessions.create(
                    agent=agent.id,
                    environment_id=environment.id,
                    resources=[
                        {"type": "github_repository", "url": f"{server.base_url}/app.git", "authorization_token": token}
                    ],
                )
                session_id = session.id
                handle = stack.client.get_workflow_handle(session.id)
                await client.beta.sessions.events.send(session.id, events=[user_message("work on the repo")])
                events = await wait_for_idle(handle, within_seconds=120)
                results = texts(events, "agent.tool_result")
                assert results[0] == "1", results
                assert "pxr_" in results[1], "origin points at the git proxy"
                assert log.credentials and all(c == ("x-access-token", token) for c in log.credentials if c)
                places = [results[1], await history_text(handle), *gateway.responses, gateway.process.log.read_text()]
                assert scan_for([token], *places) == []
                await handle.terminate("test over")
    finally:
        git_proxy.stop()
        if session_id is not None:
            remove_sandboxes(docker_client, [stack.client.get_workflow_handle(session_id)])
