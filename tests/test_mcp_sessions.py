"""MCP tools in a real session: discovered and called through the proxy worker with credentials from Vault.

Real components: the Temporal dev server, the OpenBao dev server, a Streamable-HTTP MCP server built with the `mcp`
SDK that checks bearer tokens, a real OAuth token endpoint, the Docker sandbox for the exfiltration probes.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import anthropic
import docker
import pytest

from activities.proxy import ProxyActivities
from corral.client import start_session
from corral.contract.events import AgentMcpToolResult, AgentMcpToolUse, SessionError
from corral.contract.session import SessionInput
from corral.serving import ServerThread
from proxy import McpOAuthParams, McpOAuthRefreshParams, StaticBearerParams, Vault, VaultStore
from proxy.devvault import DevVault
from proxy.layout import secret_path
from tests.conftest import Stack, history_text, read_events, texts, unique, wait_for_idle
from tests.proxy_servers.devvault import shared_dev_vault
from tests.proxy_servers.mcp_server import create_mcp_app
from tests.proxy_servers.oauth_server import TOKEN_PATH, create_token_app
from tests.proxy_servers.tokens import TokenAuthority
from tests.waits import until
from workers.proxy import proxy_worker, revoke_closed_sessions
from workers.roles import model_worker


@dataclass
class McpStack:
    stack: Stack
    vault: Vault
    store: VaultStore
    authority: TokenAuthority
    mcp_url: str
    token_endpoint: str
    dev_vault: DevVault

    def agent_tools(self, server_url: str | None = None) -> dict[str, Any]:
        return {
            "mcp_servers": [{"type": "url", "name": "tools", "url": server_url or self.mcp_url}],
            "tools": [{"type": "mcp_toolset", "mcp_server_name": "tools"}],
        }


@pytest.fixture
def authority() -> TokenAuthority:
    return TokenAuthority(client_secret="canary-client-secret-" + uuid.uuid4().hex)


@pytest.fixture
def mcp_servers(authority: TokenAuthority) -> Iterator[tuple[str, str]]:
    with (
        ServerThread(create_token_app(authority), name="token-endpoint") as token_server,
        ServerThread(lambda url: create_mcp_app(authority, url), name="mcp", lifespan="on", app_takes_url=True) as mcp,
    ):
        assert token_server.base_url and mcp.base_url
        yield f"{mcp.base_url}/mcp", token_server.base_url + TOKEN_PATH


@pytest.fixture
async def mcp_stack(stack: Stack, authority: TokenAuthority, mcp_servers: tuple[str, str]) -> AsyncIterator[McpStack]:
    dev_vault = shared_dev_vault()
    store = VaultStore(dev_vault.client())
    vault = store.create_vault(unique("mcp-session-test"))
    async with proxy_worker(stack.client, ProxyActivities(store)):
        yield McpStack(stack, vault, store, authority, mcp_servers[0], mcp_servers[1], dev_vault)


async def test_mcp_tools_are_discovered_and_called_through_the_proxy(mcp_stack: McpStack) -> None:
    token = mcp_stack.authority.issue_access_token()
    mcp_stack.store.add_credential(
        mcp_stack.vault.id, StaticBearerParams(mcp_server_url=mcp_stack.mcp_url, token=token)
    )
    model = mcp_stack.stack.script(
        [
            {"tool_uses": [{"name": "mcp__tools__add", "input": {"a": 2, "b": 40}}]},
            {"text": "sum:", "echo_last_user": True},
        ]
    )
    handle = await mcp_stack.stack.start(
        model, message="add", vault_ids=[mcp_stack.vault.id], **_agent(model, mcp_stack.agent_tools())
    )
    events = await wait_for_idle(handle, within_seconds=60)
    [use] = [e for e in events if isinstance(e, AgentMcpToolUse)]
    [result] = [e for e in events if isinstance(e, AgentMcpToolResult)]
    assert (use.mcp_server_name, use.name, use.input) == ("tools", "add", {"a": 2, "b": 40})
    assert result.mcp_tool_use_id == use.id and not result.is_error and result.content[0].text == "42"
    assert texts(events) == ["sum:\n42"]
    assert mcp_stack.authority.tool_calls == [("add", token)], "the call must carry the token from Vault"
    offered = {tool["name"] for tool in mcp_stack.stack.requests(model)[0]["body"]["tools"]}
    assert {"mcp__tools__echo", "mcp__tools__add"} <= offered
    assert token not in await history_text(handle)


async def test_a_long_mcp_result_is_cut_like_sandbox_output(mcp_stack: McpStack) -> None:
    """MCP results keep their first and last 50 KB with a marker, like every other hand's output."""
    token = mcp_stack.authority.issue_access_token()
    mcp_stack.store.add_credential(
        mcp_stack.vault.id, StaticBearerParams(mcp_server_url=mcp_stack.mcp_url, token=token)
    )
    text = "HEAD" + "m" * 300_000 + "TAIL"
    model = mcp_stack.stack.script(
        [{"tool_uses": [{"name": "mcp__tools__echo", "input": {"text": text}}]}, {"text": "read"}]
    )
    handle = await mcp_stack.stack.start(
        model, message="echo", vault_ids=[mcp_stack.vault.id], **_agent(model, mcp_stack.agent_tools())
    )
    events = await wait_for_idle(handle, within_seconds=60)
    [result] = texts(events, "agent.mcp_tool_result")
    assert result.startswith("HEAD") and result.endswith("TAIL")
    assert "[output truncated: 200008 of 300008 characters cut]" in result and len(result) < 101_000


async def test_an_expired_oauth_token_is_refreshed_and_written_back(mcp_stack: McpStack) -> None:
    authority = mcp_stack.authority
    old, refresh = authority.issue_access_token(), authority.issue_refresh_token()
    credential = mcp_stack.store.add_credential(
        mcp_stack.vault.id,
        McpOAuthParams(
            mcp_server_url=mcp_stack.mcp_url,
            access_token=old,
            expires_at=datetime.now(UTC) + timedelta(hours=1),
            refresh=McpOAuthRefreshParams(
                token_endpoint=mcp_stack.token_endpoint, client_id=authority.client_id, refresh_token=refresh
            ),
        ),
    )
    authority.expire(old)  # the server rejects it (401) although Vault still thinks it is valid
    model = mcp_stack.stack.script(
        [{"tool_uses": [{"name": "mcp__tools__echo", "input": {"text": "hi"}}]}, {"text": "done"}]
    )
    handle = await mcp_stack.stack.start(
        model, message="echo", vault_ids=[mcp_stack.vault.id], **_agent(model, mcp_stack.agent_tools())
    )
    events = await wait_for_idle(handle, within_seconds=60)
    assert texts(events, "agent.mcp_tool_result") == ["hi"]
    [(tool, used)] = authority.tool_calls
    assert tool == "echo" and used not in (old, refresh), "the call must use the refreshed token"
    stored = mcp_stack.dev_vault.client().secrets.kv.v2.read_secret_version(
        path=secret_path(mcp_stack.vault.id, credential.id), mount_point="corral", raise_on_deleted_version=True
    )["data"]["data"]
    assert stored["access_token"] == used, "the refreshed token must be written back to Vault"
    history = await history_text(handle)
    assert old not in history and used not in history and refresh not in history


async def test_a_server_that_is_down_is_a_connection_error_and_the_session_goes_on(mcp_stack: McpStack) -> None:
    down = "http://127.0.0.1:9/mcp"
    mcp_stack.store.add_credential(mcp_stack.vault.id, StaticBearerParams(mcp_server_url=down, token="unused"))
    model = mcp_stack.stack.script([{"text": "still here"}])
    tools = mcp_stack.agent_tools(server_url=down)
    handle = await mcp_stack.stack.start(model, message="hi", vault_ids=[mcp_stack.vault.id], **_agent(model, tools))
    events = await wait_for_idle(handle, within_seconds=90)
    errors = [e.error for e in events if isinstance(e, SessionError)]
    assert [(e.type, e.retry_status.type) for e in errors] == [
        ("mcp_connection_failed_error", "retrying"),
        ("mcp_connection_failed_error", "retrying"),
        ("mcp_connection_failed_error", "exhausted"),
    ]
    assert texts(events) == ["still here"]


async def test_a_rejected_credential_is_an_authentication_error(mcp_stack: McpStack) -> None:
    mcp_stack.store.add_credential(
        mcp_stack.vault.id, StaticBearerParams(mcp_server_url=mcp_stack.mcp_url, token="not-a-token-it-issued")
    )
    model = mcp_stack.stack.script([{"text": "without tools"}])
    handle = await mcp_stack.stack.start(
        model, message="hi", vault_ids=[mcp_stack.vault.id], **_agent(model, mcp_stack.agent_tools())
    )
    events = await wait_for_idle(handle, within_seconds=60)
    errors = [e.error for e in events if isinstance(e, SessionError)]
    assert [(e.type, e.retry_status.type) for e in errors] == [("mcp_authentication_failed_error", "exhausted")]
    assert "not-a-token-it-issued" not in await history_text(handle)


async def test_unknown_vault_is_refused_clearly(mcp_stack: McpStack) -> None:
    model = mcp_stack.stack.script([{"text": "ok"}])
    handle = await mcp_stack.stack.start(
        model, message="hi", vault_ids=["vlt_doesnotexist"], **_agent(model, mcp_stack.agent_tools())
    )
    events = await wait_for_idle(handle, within_seconds=60)
    [error] = [e.error for e in events if isinstance(e, SessionError)]
    assert error.type == "mcp_authentication_failed_error" and "vlt_doesnotexist" in error.message


def _agent(model: str, tools: dict[str, Any]) -> dict[str, Any]:
    """`Stack.start` takes tools as a list; MCP needs servers too, so pass the agent whole."""
    return {"agent": {"model": model, **tools}}


PROBES = {
    "env": "env; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done 2>/dev/null | sort -u",
    "token-like files": (
        "grep -rsIE -o '(at|rt)-[A-Za-z0-9_-]{16,}|pxr_[A-Za-z0-9_-]+|sk-ant-[A-Za-z0-9_-]+|[sh]vs\\.[A-Za-z0-9]+' "
        "/ --exclude-dir=proc --exclude-dir=sys | head -50; echo scanned"
    ),
    "git config": "cat /workspace/.git/config ~/.gitconfig /etc/gitconfig 2>&1; echo read",
    "vault from loopback": "curl -s --max-time 2 http://127.0.0.1:8200/v1/sys/health || echo unreachable",
    "docker socket": "ls -la /var/run/docker.sock /run/docker.sock 2>&1; echo done",
    "processes": "ps auxwwe",
}


async def test_exfiltration_attempts_find_no_canary_anywhere(
    mcp_stack: McpStack, sandbox_stack: Stack, docker_client: docker.DockerClient
) -> None:
    stack = mcp_stack.stack
    authority = mcp_stack.authority
    canaries = {
        "mcp access token": authority.issue_access_token(prefix="at-canary"),
        "mcp refresh token": authority.issue_refresh_token(prefix="rt-canary"),
        "git token": f"ghp_canary{uuid.uuid4().hex}",
        "vault token": mcp_stack.dev_vault.root_token.get_secret_value(),
        "model api key": f"sk-ant-canary-{uuid.uuid4().hex}",
    }
    mcp_stack.store.add_credential(
        mcp_stack.vault.id,
        McpOAuthParams(
            mcp_server_url=mcp_stack.mcp_url,
            access_token=canaries["mcp access token"],
            expires_at=datetime.now(UTC) + timedelta(hours=1),
            refresh=McpOAuthRefreshParams(
                token_endpoint=mcp_stack.token_endpoint,
                client_id=authority.client_id,
                refresh_token=canaries["mcp refresh token"],
            ),
        ),
    )
    session_id = f"sesn_{uuid.uuid4().hex[:26]}"
    mcp_stack.store.store_repository_token(
        session_id, "repo1", "https://git.example/acme/app.git", canaries["git token"]
    )
    name = unique("threat")
    stack.model_server.register(
        name,
        {
            "steps": [
                {"tool_uses": [{"name": "mcp__tools__echo", "input": {"text": "through the proxy"}}]},
                *({"tool_uses": [{"name": "bash", "input": {"command": command}}]} for command in PROBES.values()),
                {"text": "probed"},
            ]
        },
    )
    # A model worker of its own, holding the canary model key (the way a real one holds ANTHROPIC_API_KEY).
    model_queue = unique("threat-model")
    model_client = anthropic.AsyncAnthropic(
        base_url=stack.model_server.base_url, api_key=canaries["model api key"], max_retries=0
    )
    async with AsyncExitStack() as workers:
        await workers.enter_async_context(model_worker(stack.client, model_client, model_queue))
        agent = {"model": f"script:{name}", **mcp_stack.agent_tools()}
        agent["tools"] = [*agent["tools"], {"type": "agent_toolset_20260401"}]
        handle = await start_session(
            stack.client,
            SessionInput.model_validate(
                {"agent": agent, "message": "probe", "vault_ids": [mcp_stack.vault.id], "model_task_queue": model_queue}
            ),
            session_id=session_id,
            task_queue=stack.harness_queue,
        )
        stack.started.append(handle)
        events = await wait_for_idle(handle, within_seconds=180)
    assert texts(events)[-1] == "probed" and len(texts(events, "agent.tool_result")) == len(PROBES)
    assert texts(events, "agent.mcp_tool_result") == ["through the proxy"]
    assert authority.tool_calls == [("echo", canaries["mcp access token"])], "the proxy used the vault token"

    [container] = docker_client.containers.list(filters={"label": f"corral.session={session_id}"})
    filesystem = container.exec_run(["tar", "-cf", "-", "--exclude=/proc", "--exclude=/sys", "/"], user="0").output
    processes = container.exec_run(["ps", "auxwwe"], user="0").output
    places = {
        "events": "\n".join(event.model_dump_json() for event in await read_events(handle)),
        "workflow history": await history_text(handle),
        "container filesystem": filesystem.decode("latin-1"),
        "container processes": processes.decode("latin-1"),
        "harness worker environment": "\n".join(f"{k}={v}" for k, v in os.environ.items()),
    }
    leaks = [(what, where) for what, canary in canaries.items() for where, text in places.items() if canary in text]
    assert leaks == [], f"canaries found: {leaks}"
    assert len(places["container filesystem"]) > 10_000_000, "the filesystem scan must have read the container"


async def test_a_terminated_sessions_reference_is_revoked_by_the_proxy_reaper(mcp_stack: McpStack) -> None:
    token = mcp_stack.authority.issue_access_token()
    mcp_stack.store.add_credential(
        mcp_stack.vault.id, StaticBearerParams(mcp_server_url=mcp_stack.mcp_url, token=token)
    )
    model = mcp_stack.stack.script([{"text": "bound"}])
    kept = await mcp_stack.stack.start(
        model, message="hi", vault_ids=[mcp_stack.vault.id], **_agent(model, mcp_stack.agent_tools())
    )
    ended = await mcp_stack.stack.start(
        model, message="hi", vault_ids=[mcp_stack.vault.id], **_agent(model, mcp_stack.agent_tools())
    )
    for handle in (kept, ended):
        await wait_for_idle(handle, within_seconds=60)
    assert {kept.id, ended.id} <= set(mcp_stack.store.bound_sessions())
    await ended.terminate("terminate runs no workflow code: the proxy reaper revokes the reference")
    revoked = await revoke_closed_sessions(mcp_stack.stack.client, mcp_stack.store)
    assert ended.id in revoked and kept.id not in revoked
    bound = set(mcp_stack.store.bound_sessions())
    assert ended.id not in bound and kept.id in bound


async def test_a_thread_calls_mcp_tools_with_the_sessions_vaults(mcp_stack: McpStack) -> None:
    """A subagent's MCP calls go through the proxy with the credentials of its session's vaults, which never reach
    the thread's history either; the call is cross-posted to the session's log."""
    token = mcp_stack.authority.issue_access_token()
    mcp_stack.store.add_credential(
        mcp_stack.vault.id, StaticBearerParams(mcp_server_url=mcp_stack.mcp_url, token=token)
    )
    stack = mcp_stack.stack
    adder = stack.script([{"tool_uses": [{"name": "mcp__tools__add", "input": {"a": 1, "b": 2}}]},
                          {"text": "sum:", "echo_last_user": True}])  # fmt: skip
    lead = stack.script([
        {"tool_uses": [{"name": "spawn_thread", "input": {"agent": "adder", "message": "add"}}]},
        {"tool_uses": [{"name": "wait_for_threads", "input": {}}]},
        {"text": "done"},
    ])  # fmt: skip
    config = {"model": adder, "name": "adder", **mcp_stack.agent_tools()}
    roster = [{"type": "agent", "id": "agent_adder", "version": 1, "config": config}]
    agent = {"model": lead, "multiagent": {"agents": roster}}
    handle = await stack.start(lead, message="go", vault_ids=[mcp_stack.vault.id], agent=agent)

    async def done() -> bool:
        return "done" in texts(await read_events(handle))

    await until(done, "the coordinator's answer after the thread's MCP call")
    events = await read_events(handle)
    assert texts(events, "agent.thread_message_received") == ["sum:\n3"]
    [use] = [e for e in events if isinstance(e, AgentMcpToolUse)]
    assert use.session_thread_id is not None and (use.name, use.input) == ("add", {"a": 1, "b": 2})
    assert mcp_stack.authority.tool_calls == [("add", token)], "the thread's call carried the vault's token"
    thread = stack.client.get_workflow_handle(use.session_thread_id)
    assert token not in await history_text(thread) and token not in await history_text(handle)
