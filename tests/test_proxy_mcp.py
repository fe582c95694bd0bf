"""MCP calls through the proxy against a real Streamable-HTTP MCP server (the `mcp` SDK) that checks bearer tokens
with expiry, a real OAuth token endpoint, and the real OpenBao dev server.

The token authority records which token each tool call carried and every refresh request, so the tests assert
the token used, not just the answer. Every token, refresh token and client secret is scanned for in the log,
in the results and in the errors."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import hvac
import pytest

from corral.serving import ServerThread
from proxy import (
    BindingRejected,
    McpAuthenticationFailed,
    McpConnectionFailed,
    McpOAuthParams,
    McpOAuthRefreshParams,
    McpProxy,
    McpServer,
    McpTokenRefreshFailed,
    SessionBinding,
    StaticBearerParams,
    TokenEndpointAuthBasic,
    TokenEndpointAuthNone,
    TokenEndpointAuthPost,
    Vault,
    VaultStore,
)
from proxy.devvault import DevVault
from proxy.models import TokenEndpointAuth
from tests.proxy_servers.devvault import scan_for, shared_dev_vault
from tests.proxy_servers.mcp_server import create_mcp_app
from tests.proxy_servers.oauth_server import TOKEN_PATH, create_token_app
from tests.proxy_servers.tokens import ClientAuth, TokenAuthority

CLIENT_SECRET = "canary-client-secret-5eed"


@dataclass
class McpWorld:
    """A session bound to one vault, the servers it talks to, and what they record."""

    authority: TokenAuthority
    store: VaultStore
    raw: hvac.Client
    proxy: McpProxy
    vault: Vault
    binding: SessionBinding
    server: McpServer
    token_endpoint: str
    mcp_base: str

    def secrets(self) -> list[str]:
        return [*self.authority.access_tokens, *self.authority.refresh_tokens, CLIENT_SECRET]

    def add_oauth(
        self,
        *,
        access: str,
        refresh: str | None,
        expires_at: datetime | None = None,
        client_auth: ClientAuth = "none",
        token_endpoint: str | None = None,
    ) -> str:
        auth: TokenEndpointAuth = TokenEndpointAuthNone()
        if client_auth == "client_secret_basic":
            auth = TokenEndpointAuthBasic(client_secret=CLIENT_SECRET)
        elif client_auth == "client_secret_post":
            auth = TokenEndpointAuthPost(client_secret=CLIENT_SECRET)
        refresh_params = None
        if refresh is not None:
            refresh_params = McpOAuthRefreshParams(
                token_endpoint=token_endpoint or self.token_endpoint,
                client_id=self.authority.client_id,
                refresh_token=refresh,
                token_endpoint_auth=auth,
            )
        params = McpOAuthParams(
            mcp_server_url=self.server.url,
            access_token=access,
            expires_at=expires_at or datetime.now(UTC) + timedelta(hours=1),
            refresh=refresh_params,
        )
        return self.store.add_credential(self.vault.id, params).id

    def stored_secret(self, credential_id: str) -> dict[str, str]:
        def read(folder: str) -> dict[str, Any]:
            return self.raw.secrets.kv.v2.read_secret_version(
                path=f"{folder}/{self.vault.id}/{credential_id}", mount_point="corral", raise_on_deleted_version=True
            )["data"]["data"]

        return dict(read("secrets"), expires_at=read("credentials")["auth"]["expires_at"])


@pytest.fixture(scope="session")
def dev_vault() -> DevVault:
    return shared_dev_vault()


@pytest.fixture
def authority() -> TokenAuthority:
    return TokenAuthority(client_secret=CLIENT_SECRET)


@pytest.fixture
def servers(authority: TokenAuthority) -> Iterator[tuple[str, str]]:
    with (
        ServerThread(create_token_app(authority), name="test-token-endpoint") as token_server,
        ServerThread(
            lambda base_url: create_mcp_app(authority, base_url), name="test-mcp", lifespan="on", app_takes_url=True
        ) as mcp_server,
    ):
        assert token_server.base_url is not None and mcp_server.base_url is not None
        yield mcp_server.base_url, token_server.base_url + TOKEN_PATH


@pytest.fixture
async def world(
    dev_vault: DevVault,
    authority: TokenAuthority,
    servers: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
) -> AsyncIterator[McpWorld]:
    caplog.set_level(logging.DEBUG)
    mcp_base, token_endpoint = servers
    store = VaultStore(dev_vault.client())
    vault = store.create_vault(f"mcp {request.node.name}")
    session_id = f"sesn_{vault.id[4:]}"
    binding = SessionBinding(session_id=session_id, reference=store.bind_session(session_id, [vault.id]))
    built = McpWorld(
        authority=authority,
        store=store,
        raw=dev_vault.client(),
        proxy=McpProxy(store, timeout=20),
        vault=vault,
        binding=binding,
        server=McpServer(name="tools", url=f"{mcp_base}/mcp"),
        token_endpoint=token_endpoint,
        mcp_base=mcp_base,
    )
    yield built
    assert scan_for(built.secrets(), caplog.text) == [], "a token reached the log"


def assert_clean(world: McpWorld, *objects: object) -> None:
    texts = [text for item in objects for text in (repr(item), str(item))]
    assert scan_for(world.secrets(), *texts) == []


async def test_lists_and_calls_tools_with_the_static_bearer_token(world: McpWorld) -> None:
    token = world.authority.issue_access_token()
    world.store.add_credential(
        world.vault.id,
        StaticBearerParams(mcp_server_url=world.server.url, token=token),
    )
    tools = await world.proxy.list_tools(world.binding, world.server)
    by_name = {tool.name: tool for tool in tools}
    assert {"echo", "add", "fail", "pixel"} <= set(by_name)
    assert by_name["add"].description == "Add two integers."
    assert set(by_name["add"].input_schema["properties"]) == {"a", "b"}

    added = await world.proxy.call_tool(world.binding, world.server, "add", {"a": 2, "b": 3})
    echoed = await world.proxy.call_tool(world.binding, world.server, "echo", {"text": "hello"})
    assert (added.text, added.is_error) == ("5", False)
    assert echoed.text == "hello"
    assert world.authority.tool_calls == [("add", token), ("echo", token)]
    assert_clean(world, tools, added, echoed, world.proxy)


async def test_tool_errors_and_non_text_content_reach_the_model_as_text(world: McpWorld) -> None:
    world.add_oauth(access=world.authority.issue_access_token(), refresh=None)
    failed = await world.proxy.call_tool(world.binding, world.server, "fail", {"reason": "disk on fire"})
    assert failed.is_error and "disk on fire" in failed.text
    image = await world.proxy.call_tool(world.binding, world.server, "pixel")
    assert not image.is_error and image.text.startswith("[image content: image/png")
    unknown = await world.proxy.call_tool(world.binding, world.server, "no_such_tool", {})
    assert unknown.is_error and "no_such_tool" in unknown.text


@pytest.mark.parametrize("client_auth", ["none", "client_secret_basic", "client_secret_post"])
async def test_a_401_refreshes_the_token_writes_it_back_and_retries_once(
    world: McpWorld, client_auth: ClientAuth
) -> None:
    world.authority.client_auth = client_auth
    old_access = world.authority.issue_access_token()
    old_refresh = world.authority.issue_refresh_token()
    credential_id = world.add_oauth(access=old_access, refresh=old_refresh, client_auth=client_auth)
    world.authority.expire(old_access)  # the server revoked it; Vault still believes it is good for an hour

    outcome = await world.proxy.call_tool(world.binding, world.server, "echo", {"text": "after refresh"})
    assert outcome.text == "after refresh"
    # One rejected attempt (the SDK's `auto` mode sends discover, then initialize, with it), then the retry.
    assert set(world.authority.rejected) == {old_access}
    assert [(r.refresh_token, r.client_auth, r.granted) for r in world.authority.refreshes] == [
        (old_refresh, client_auth, True)
    ]
    stored = world.stored_secret(credential_id)
    new_access, new_refresh = stored["access_token"], stored["refresh_token"]
    assert new_access.startswith("at-refreshed-") and new_refresh.startswith("rt-rotated-")
    assert world.authority.tool_calls == [("echo", new_access)]
    assert datetime.fromisoformat(stored["expires_at"]) > datetime.now(UTC) + timedelta(minutes=50)

    again = await world.proxy.call_tool(world.binding, world.server, "add", {"a": 1, "b": 1})
    assert again.text == "2"
    assert world.authority.tokens_used == [new_access, new_access]  # the old token is never used again
    assert len(world.authority.refreshes) == 1 and set(world.authority.rejected) == {old_access}
    assert_clean(world, outcome, again)


async def test_an_expired_token_is_refreshed_before_the_call(world: McpWorld) -> None:
    old_access = world.authority.issue_access_token()  # still accepted by the server ...
    world.add_oauth(
        access=old_access,
        refresh=world.authority.issue_refresh_token(),
        expires_at=datetime.now(UTC) - timedelta(minutes=1),  # ... but Vault says it has expired
    )
    await world.proxy.list_tools(world.binding, world.server)
    assert len(world.authority.refreshes) == 1
    assert world.authority.rejected == []  # the old token was never sent
    outcome = await world.proxy.call_tool(world.binding, world.server, "echo", {"text": "x"})
    assert outcome.text == "x" and old_access not in world.authority.tokens_used


async def test_a_refused_refresh_is_an_authentication_failure(world: McpWorld) -> None:
    access, refresh = world.authority.issue_access_token(), world.authority.issue_refresh_token()
    credential_id = world.add_oauth(access=access, refresh=refresh)
    world.authority.expire(access)
    world.authority.revoke_refresh_token(refresh)
    refused: list[tuple[str, str]] = []

    async def tell(vault_id: str, credential_id: str) -> None:  # the proxy worker emits a webhook event here
        refused.append((vault_id, credential_id))

    proxy = McpProxy(world.store, timeout=20, on_refresh_refused=tell)
    with pytest.raises(McpTokenRefreshFailed) as caught:
        await proxy.call_tool(world.binding, world.server, "echo", {"text": "x"})
    assert refused == [(world.vault.id, credential_id)], "a refused refresh is told once, naming the credential"
    assert isinstance(caught.value, McpAuthenticationFailed) and not caught.value.retryable
    assert "invalid_grant" in str(caught.value)
    assert world.stored_secret(credential_id)["access_token"] == access  # nothing written back
    assert world.authority.tool_calls == []
    assert_clean(world, caught.value)


async def test_a_token_still_rejected_after_refresh_fails_after_one_retry(world: McpWorld) -> None:
    world.authority.access_ttl = -5  # the endpoint issues tokens that are already expired
    access = world.authority.issue_access_token(ttl=-5)
    world.add_oauth(access=access, refresh=world.authority.issue_refresh_token())
    with pytest.raises(McpAuthenticationFailed, match="after a token refresh") as caught:
        await world.proxy.call_tool(world.binding, world.server, "echo", {"text": "x"})
    # Retried once: the original token and the one refreshed token were each rejected, nothing more.
    assert len(world.authority.refreshes) == 1 and len(set(world.authority.rejected)) == 2
    assert_clean(world, caught.value)


async def test_a_rejected_static_token_is_not_refreshed(world: McpWorld) -> None:
    world.store.add_credential(
        world.vault.id,
        StaticBearerParams(mcp_server_url=world.server.url, token="canary-unknown-static"),
    )
    with pytest.raises(McpAuthenticationFailed, match="cannot be refreshed") as caught:
        await world.proxy.list_tools(world.binding, world.server)
    assert "canary-unknown-static" not in str(caught.value) and world.authority.refreshes == []


async def test_no_credential_for_the_server_is_an_authentication_failure(world: McpWorld) -> None:
    with pytest.raises(McpAuthenticationFailed, match="no credential for MCP server tools"):
        await world.proxy.call_tool(world.binding, world.server, "echo", {"text": "x"})


async def test_a_server_that_is_down_or_failing_is_a_connection_failure(world: McpWorld) -> None:
    world.add_oauth(access=world.authority.issue_access_token(), refresh=None)
    down = McpServer(name="tools", url="http://127.0.0.1:9/mcp")
    world.store.add_credential(
        world.vault.id,
        StaticBearerParams(mcp_server_url=down.url, token=world.authority.issue_access_token()),
    )
    with pytest.raises(McpConnectionFailed, match="could not be reached") as unreachable:
        await world.proxy.call_tool(world.binding, down, "echo", {"text": "x"})
    assert unreachable.value.retryable

    failing = McpServer(name="flaky", url=f"{world.mcp_base}/unavailable")
    world.store.add_credential(
        world.vault.id,
        StaticBearerParams(mcp_server_url=failing.url, token=world.authority.issue_access_token()),
    )
    with pytest.raises(McpConnectionFailed, match="503") as unavailable:
        await world.proxy.list_tools(world.binding, failing)
    assert_clean(world, unreachable.value, unavailable.value)


async def test_a_token_endpoint_that_is_down_is_a_connection_failure(world: McpWorld) -> None:
    access = world.authority.issue_access_token()
    world.add_oauth(
        access=access,
        refresh=world.authority.issue_refresh_token(),
        token_endpoint="http://127.0.0.1:9/oauth/token",
    )
    world.authority.expire(access)
    with pytest.raises(McpConnectionFailed, match="token endpoint"):
        await world.proxy.call_tool(world.binding, world.server, "echo", {"text": "x"})


async def test_another_sessions_reference_cannot_reach_this_sessions_credential(world: McpWorld) -> None:
    world.add_oauth(access=world.authority.issue_access_token(), refresh=None)
    other_vault = world.store.create_vault("session B's vault")
    reference_b = world.store.bind_session("sesn_B_mcp", [other_vault.id])
    session_b = SessionBinding(session_id="sesn_B_mcp", reference=reference_b)
    with pytest.raises(McpAuthenticationFailed, match="no credential"):
        await world.proxy.call_tool(session_b, world.server, "echo", {"text": "x"})
    forged = SessionBinding(session_id=world.binding.session_id, reference=reference_b)
    with pytest.raises(BindingRejected):
        await world.proxy.call_tool(forged, world.server, "echo", {"text": "x"})
    world.store.revoke_session(world.binding.session_id)
    with pytest.raises(BindingRejected):
        await world.proxy.list_tools(world.binding, world.server)
    assert world.authority.tool_calls == []


async def test_concurrent_calls_share_one_refresh(world: McpWorld) -> None:
    access = world.authority.issue_access_token()
    world.add_oauth(
        access=access,
        refresh=world.authority.issue_refresh_token(),
        expires_at=datetime.now(UTC) - timedelta(seconds=1),
    )
    outcomes = await asyncio.gather(
        *(world.proxy.call_tool(world.binding, world.server, "add", {"a": i, "b": 1}) for i in range(4))
    )
    assert [outcome.text for outcome in outcomes] == ["1", "2", "3", "4"]
    assert len(world.authority.refreshes) == 1  # a rotated refresh token could not be spent twice
    assert len(set(world.authority.tokens_used)) == 1


async def test_a_call_that_outlasts_the_timeout_is_a_connection_failure(world: McpWorld) -> None:
    world.add_oauth(access=world.authority.issue_access_token(), refresh=None)
    impatient = McpProxy(world.store, timeout=0.5)
    with pytest.raises(McpConnectionFailed, match=r"timed out|did not answer in time"):
        await impatient.call_tool(world.binding, world.server, "slow", {"seconds": 3})


async def test_a_url_that_is_not_an_mcp_endpoint_is_a_connection_failure(world: McpWorld) -> None:
    wrong = McpServer(name="typo", url=f"{world.mcp_base}/not-mcp")
    world.store.add_credential(
        world.vault.id,
        StaticBearerParams(mcp_server_url=wrong.url, token=world.authority.issue_access_token()),
    )
    with pytest.raises(McpConnectionFailed, match="HTTP 404"):
        await world.proxy.list_tools(world.binding, wrong)
