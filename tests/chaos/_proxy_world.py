"""The ground of the proxy rows of the fault matrix: two real MCP servers behind fault switches, a vault holding a
credential for each, a proxy worker with short timeouts, and the checks every proxy fault test makes.

The `gate` server holds every tool call until the test opens it: a session calling `mcp__gate__echo` is mid-turn,
inside a tool call, while the test injects its fault; its next call, `mcp__tools__echo`, meets the fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import hvac
from temporalio.client import WorkflowHandle

from activities.proxy import ProxyActivities
from corral.client import send_text
from corral.contract.events import AgentMcpToolResult, SessionEvent
from corral.serving import ServerThread
from proxy import McpProxy, StaticBearerParams, Vault, VaultStore
from proxy.devvault import DevVault
from tests.chaos.matrix import check_log, errors_of
from tests.conftest import Stack, assert_log_is_whole, history_text, read_events, texts, wait_for_idle
from tests.proxy_servers.devvault import scan_for, shared_dev_vault
from tests.proxy_servers.faulty_mcp import FaultyMcp, McpFaults
from tests.proxy_servers.mcp_server import create_mcp_app
from tests.proxy_servers.tokens import TokenAuthority
from workers.proxy import proxy_worker

WAIT = 180  # seconds: generous, the machine is shared; no test asserts on how long anything took
GATE_CALL = {"name": "mcp__gate__echo", "input": {"text": "gate"}}


def tools_call(text: str) -> dict[str, Any]:
    return {"tool_uses": [{"name": "mcp__tools__echo", "input": {"text": text}}]}


TIMED_OUT = re.compile(r"timed out|did not answer in time")
"""The proxy's words for a call past its timeout (the HTTP read or the SDK's wait for the answer fires first)."""

SAW = {"text": "saw:", "echo_last_user": True}
"""The model's answer after a tool call: `saw:` and the tool result it was given (what the model saw)."""


@dataclass
class McpServerUnderTest:
    """One MCP server in its thread, with its fault switch and the token the session's vault holds for it."""

    name: str
    faults: McpFaults
    thread: ServerThread
    token: str = ""
    credential_id: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.thread.port}/mcp"


@dataclass
class ProxyChaos:
    stack: Stack
    store: VaultStore
    vault: Vault
    authority: TokenAuthority
    gate: McpServerUnderTest
    tools: McpServerUnderTest
    handles: list[WorkflowHandle] = field(default_factory=list)

    def agent(self, model: str) -> dict[str, Any]:
        servers = [self.gate, self.tools]
        return {
            "model": model,
            "mcp_servers": [{"type": "url", "name": s.name, "url": s.url} for s in servers],
            "tools": [{"type": "mcp_toolset", "mcp_server_name": s.name} for s in servers],
        }

    async def start(self, n: int, steps: list[dict[str, Any]], message: str = "go") -> list[WorkflowHandle]:
        model = self.stack.script(steps)
        for _ in range(n):
            handle = await self.stack.start(model, message=message, vault_ids=[self.vault.id], agent=self.agent(model))
            self.handles.append(handle)
        return self.handles

    async def all_at_the_gate(self, n: int) -> None:
        """Wait until `n` sessions are inside their gated tool call (mid-turn)."""
        deadline = time.monotonic() + WAIT
        while self.gate.faults.held < n:
            assert time.monotonic() < deadline, f"only {self.gate.faults.held} of {n} sessions reached the gate"
            await asyncio.sleep(0.1)

    def secrets(self) -> list[str]:
        return list(self.authority.access_tokens)

    def calls_run(self, server: McpServerUnderTest) -> int:
        """How many tool calls the real server behind `server` ran (its side effects), told apart by token."""
        return sum(1 for _, token in self.authority.tool_calls if token == server.token)


def _mcp_server(authority: TokenAuthority, name: str, faults: McpFaults) -> McpServerUnderTest:
    def app(base_url: str) -> Any:
        return FaultyMcp(create_mcp_app(authority, base_url), faults)

    thread = ServerThread(app, name=f"chaos-mcp-{name}", lifespan="on", app_takes_url=True)
    thread.start()
    return McpServerUnderTest(name=name, faults=faults, thread=thread)


@contextlib.asynccontextmanager
async def proxy_chaos(
    stack: Stack, *, mcp_timeout: float = 60.0, dev_vault: DevVault | None = None, vault_timeout: float = 10
) -> AsyncIterator[ProxyChaos]:
    """Two MCP servers (the gate held shut), a vault with a credential for each, and a proxy worker whose MCP
    calls give up after `mcp_timeout` and whose Vault reads after `vault_timeout` seconds."""
    authority = TokenAuthority()
    gate = _mcp_server(authority, "gate", McpFaults(fault="hold"))
    tools = _mcp_server(authority, "tools", McpFaults())
    vault_server = dev_vault or shared_dev_vault()
    raw = hvac.Client(url=vault_server.address, token=vault_server.root_token.get_secret_value(), timeout=vault_timeout)
    store = VaultStore(raw)
    vault = store.create_vault(f"chaos-{uuid.uuid4().hex[:8]}")
    for server in (gate, tools):
        server.token = authority.issue_access_token(prefix=f"at-canary-{server.name}")
        params = StaticBearerParams(mcp_server_url=server.url, token=server.token)
        server.credential_id = store.add_credential(vault.id, params).id
    world = ProxyChaos(stack, store, vault, authority, gate, tools)
    try:
        async with proxy_worker(stack.client, ProxyActivities(store, McpProxy(store, timeout=mcp_timeout))):
            yield world
    finally:
        for server in (gate, tools):
            server.faults.release()
            server.thread.stop()


async def idle_after(
    handles: list[WorkflowHandle], positions: list[int], since: float
) -> tuple[list[list[SessionEvent]], list[float]]:
    """Each session's events up to its next idle after `positions`, and the seconds from `since` to that idle."""

    async def one(handle: WorkflowHandle, after: int) -> tuple[list[SessionEvent], float]:
        events = await wait_for_idle(handle, after=after, within_seconds=WAIT)
        return events, time.monotonic() - since

    done = await asyncio.gather(*(one(h, p) for h, p in zip(handles, positions, strict=True)))
    return [events for events, _ in done], [seconds for _, seconds in done]


def tools_results(events: list[SessionEvent]) -> list[AgentMcpToolResult]:
    return [e for e in events if isinstance(e, AgentMcpToolResult)]


async def whole_logs(world: ProxyChaos) -> tuple[int, int]:
    """Every session's log is whole and clean of secrets; returns (lost, duplicated) summed over the sessions."""
    lost = duplicated = 0
    for handle in world.handles:
        events = await read_events(handle)
        check = check_log(events)
        lost, duplicated = lost + check.gaps, duplicated + check.duplicates
        assert_log_is_whole(events)
        dumped = "\n".join(event.model_dump_json() for event in events)
        assert scan_for(world.secrets(), dumped, await history_text(handle)) == []
    return lost, duplicated


async def recover(world: ProxyChaos, turn: list[list[SessionEvent]], text: str) -> None:
    """The fault is gone: a new message to every session runs the tool again, and the model reads its result."""
    positions = [events[-1].position for events in turn]
    for handle in world.handles:
        await send_text(handle, "again")
    after, _ = await idle_after(world.handles, positions, time.monotonic())
    for events in after:
        [result] = tools_results(events)
        assert (result.is_error, result.content[0].text) == (False, text)
        assert texts(events)[-1] == f"saw:\n{text}" and errors_of(events) == []


@contextlib.contextmanager
def frozen(vault: DevVault) -> Iterator[None]:
    """Vault unreachable: its process stopped (SIGSTOP). Connections are accepted by the kernel and never
    answered, the worst kind of down; SIGCONT brings it back with everything it held."""
    assert vault.pid is not None
    os.kill(vault.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(vault.pid, signal.SIGCONT)


async def calls_retried(handles: list[WorkflowHandle]) -> None:
    """Wait until every session's MCP call activity has failed at least once and is being tried again."""
    deadline = time.monotonic() + WAIT
    for handle in handles:
        while True:
            pending = (await handle.describe()).raw_description.pending_activities
            if any(a.activity_type.name == "mcp_call_tool" and a.attempt >= 2 for a in pending):
                break
            assert time.monotonic() < deadline, f"{handle.id}: its MCP call was never retried"
            await asyncio.sleep(0.1)
