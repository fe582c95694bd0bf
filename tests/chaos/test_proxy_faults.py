"""The fault matrix's proxy rows: MCP servers that are down, slow or answer garbage, Vault frozen and back, and a
credential revoked mid-session.

Each test runs `chaos_n()` sessions that bind at the real proxy worker, discover the tools of two real MCP servers
(`gate` and `tools`, `mcp` SDK servers behind a fault switch, `tests/proxy_servers/faulty_mcp.py`) and call
`mcp__gate__echo`, which the gate holds: every session is then mid-turn, inside a tool call. The test injects its
fault, opens the gate, and the sessions' next call (`mcp__tools__echo`) meets it. The scripted model answers with
the last tool result it read, so each test asserts what the model saw, not only what the log says. A later turn,
with the fault gone, shows that the session goes on. The ground they share is in `_proxy_world.py`.

Vault is made unreachable by stopping its process (SIGSTOP, then SIGCONT): the OpenBao dev server keeps its data in
memory, so a real stop would lose it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.client import send_text
from corral.contract.events import SessionError
from proxy import StaticBearerParams
from proxy.devvault import start_dev_vault
from tests.chaos._proxy_world import (
    GATE_CALL,
    SAW,
    TIMED_OUT,
    calls_retried,
    frozen,
    idle_after,
    proxy_chaos,
    recover,
    tools_call,
    tools_results,
    whole_logs,
)
from tests.chaos.matrix import Outcome, chaos_n, errors_of, record
from tests.conftest import Stack, stop_reason, texts
from tests.ports import free_port_pair
from tests.proxy_servers.devvault import scan_for
from tests.proxy_servers.faulty_mcp import Fault


@pytest.fixture
def worker_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)
    yield caplog


async def test_an_mcp_server_that_goes_down_mid_turn_is_a_connection_error_and_the_session_goes_on(
    stack: Stack, worker_log: pytest.LogCaptureFixture
) -> None:
    """An MCP server that stops while sessions are mid-turn: their next call to it is a tool error the model reads
    ("could not be reached") and a `session.error` `mcp_connection_failed_error` (exhausted: a tool call is not
    retried); the turn ends normally, and once the server is back the next turn's call works."""
    n = chaos_n()
    async with proxy_chaos(stack) as world:
        await world.start(n, [{"tool_uses": [GATE_CALL]}, tools_call("during"), SAW, tools_call("after"), SAW])
        await world.all_at_the_gate(n)
        world.tools.thread.stop()
        fault = time.monotonic()
        world.gate.faults.release()
        turn, recovery = await idle_after(world.handles, [0] * n, fault)
        for events in turn:
            [gate, during] = tools_results(events)
            assert not gate.is_error and during.is_error
            assert "could not be reached" in during.content[0].text
            assert texts(events)[-1] == "saw:\n" + during.content[0].text, "the model must read the tool error"
            assert errors_of(events) == [("mcp_connection_failed_error", "exhausted")]
            assert stop_reason(events[-1]).type == "end_turn"
        world.tools.thread.start()  # the same port: the sessions' agents name this URL
        await recover(world, turn, "after")
        lost, duplicated = await whole_logs(world)
        ran = world.calls_run(world.tools)
        assert (world.calls_run(world.gate), ran) == (n, n), "each call ran once; none reached the server while down"
    assert scan_for(world.secrets(), worker_log.text) == []
    record(
        Outcome(
            fault="MCP server down mid-turn",
            expected="tool error (mcp_connection_failed_error, exhausted); the session goes on",
            n=n,
            observed="tool error 'could not be reached' read by the model; next turn's call worked",
            lost=lost,
            duplicated=duplicated + ran - n,
            recovery_seconds=recovery,
        )
    )


async def test_an_mcp_server_slower_than_the_proxy_timeout_is_a_tool_error_not_a_hang(
    stack: Stack, worker_log: pytest.LogCaptureFixture
) -> None:
    """An MCP server that takes a call and never answers: the proxy gives up at its timeout, the model reads a
    tool error ("timed out") with a `session.error` `mcp_connection_failed_error` (exhausted), nothing hangs, and
    once the server answers again the next turn's call works."""
    n = chaos_n()
    async with proxy_chaos(stack, mcp_timeout=3) as world:
        world.gate.faults.release()  # no gate: the slow server holds the sessions mid-turn by itself
        world.tools.faults.fault = "hold"
        fault = time.monotonic()
        await world.start(n, [tools_call("during"), SAW, tools_call("after"), SAW])
        turn, recovery = await idle_after(world.handles, [0] * n, fault)
        for events in turn:
            [during] = tools_results(events)
            assert during.is_error and TIMED_OUT.search(during.content[0].text), during.content[0].text
            assert texts(events)[-1] == "saw:\n" + during.content[0].text
            assert errors_of(events) == [("mcp_connection_failed_error", "exhausted")]
        assert world.tools.faults.held == n, "each session's call reached the server once: no retry of a tool call"
        world.tools.faults.fault = "none"
        world.tools.faults.release()  # the abandoned calls go on to a server session the proxy has closed
        await recover(world, turn, "after")
        lost, duplicated = await whole_logs(world)
        assert n <= world.calls_run(world.tools) <= 2 * n, "the recovered call ran once, an abandoned one at most once"
    assert scan_for(world.secrets(), worker_log.text) == []
    record(
        Outcome(
            fault="MCP server slower than the proxy's timeout",
            expected="tool error (mcp_connection_failed_error, exhausted) at the proxy's timeout; no hang",
            n=n,
            observed="tool error 'timed out' read by the model after the timeout; next turn's call worked",
            lost=lost,
            duplicated=duplicated + world.tools.faults.held - n,
            recovery_seconds=recovery,
        )
    )


async def test_an_mcp_server_answering_garbage_is_a_tool_error_and_the_proxy_worker_stays_up(
    stack: Stack, worker_log: pytest.LogCaptureFixture
) -> None:
    """An MCP server whose answer to a tool call is not JSON, is a JSON-RPC response to another request id, or is
    a result that is not a `CallToolResult`: each is one tool error the model reads (the call is never sent again),
    the proxy worker stays up, and the next call to a sane server works. Not JSON and a malformed result are
    tool-level errors (no `session.error`); an answer for another id leaves the call unanswered until the proxy's
    timeout (`mcp_connection_failed_error`, exhausted)."""
    n = chaos_n()
    async with proxy_chaos(stack, mcp_timeout=10) as world:
        steps = [{"tool_uses": [GATE_CALL]}, tools_call("garbage"), SAW, tools_call("bad result"), SAW]
        steps += [tools_call("wrong id"), SAW, tools_call("after"), SAW]
        await world.start(n, steps)
        await world.all_at_the_gate(n)
        world.tools.faults.fault = "garbage"
        fault = time.monotonic()
        world.gate.faults.release()
        turn, recovery = await idle_after(world.handles, [0] * n, fault)
        for events in turn:
            [_, garbage] = tools_results(events)
            assert garbage.is_error and "Failed to parse JSON response" in garbage.content[0].text
            assert texts(events)[-1] == "saw:\n" + garbage.content[0].text
            assert errors_of(events) == []
        turns = [turn]
        expectations: list[tuple[Fault, re.Pattern[str], list[tuple[str, str]]]] = [
            ("bad_result", re.compile("not valid MCP"), []),
            ("wrong_id", TIMED_OUT, [("mcp_connection_failed_error", "exhausted")]),
        ]
        for fault_kind, said, errors in expectations:
            world.tools.faults.fault = fault_kind
            positions = [events[-1].position for events in turns[-1]]
            for handle in world.handles:
                await send_text(handle, fault_kind)
            since = time.monotonic()
            turn, seconds = await idle_after(world.handles, positions, since)
            recovery += seconds
            for events in turn:
                [result] = tools_results(events)
                assert result.is_error and said.search(result.content[0].text), (fault_kind, result.content[0].text)
                assert texts(events)[-1] == "saw:\n" + result.content[0].text
                assert errors_of(events) == errors, fault_kind
            turns.append(turn)
        calls_met = world.tools.faults.calls
        assert calls_met == 3 * n, f"{calls_met} tool calls reached the server for {3 * n} the model made"
        world.tools.faults.fault = "none"
        await recover(world, turns[-1], "after")
        lost, duplicated = await whole_logs(world)
        assert world.calls_run(world.tools) == n
    assert scan_for(world.secrets(), worker_log.text) == []
    record(
        Outcome(
            fault="MCP server answering garbage (not JSON, another request id, a malformed result)",
            expected="one tool error per call, read by the model; the proxy worker stays up",
            n=n,
            observed="parse error and malformed-result tool errors; a timeout for another id; next call worked",
            lost=lost,
            duplicated=duplicated + calls_met - 3 * n,
            recovery_seconds=recovery,
        )
    )


async def test_vault_frozen_mid_turn_is_a_tool_error_and_a_shorter_freeze_is_retried_away(
    stack: Stack, worker_log: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """Vault unreachable (its process stopped) while sessions are mid-turn: the call's activity retries
    (`VaultUnavailable` is retryable, 5 attempts), and when Vault stays away past them the model reads a tool error
    naming Vault with a `session.error` `mcp_connection_failed_error` (exhausted). Vault back during the retries:
    the call succeeds and the session sees nothing. Nothing in Vault is lost."""
    n = chaos_n()
    dev_vault = start_dev_vault(tmp_path / "vault", port=free_port_pair())
    try:
        async with proxy_chaos(stack, dev_vault=dev_vault, vault_timeout=2) as world:
            steps = [{"tool_uses": [GATE_CALL]}, tools_call("during"), SAW, tools_call("retried"), SAW]
            await world.start(n, [*steps, tools_call("after"), SAW])
            await world.all_at_the_gate(n)
            with frozen(dev_vault):
                fault = time.monotonic()
                world.gate.faults.release()
                turn, recovery = await idle_after(world.handles, [0] * n, fault)
            for events in turn:
                [_, during] = tools_results(events)
                assert during.is_error and "Vault at" in during.content[0].text, during.content[0].text
                assert texts(events)[-1] == "saw:\n" + during.content[0].text
                assert errors_of(events) == [("mcp_connection_failed_error", "exhausted")]
            assert world.calls_run(world.tools) == 0

            positions = [events[-1].position for events in turn]
            with frozen(dev_vault):
                for handle in world.handles:
                    await send_text(handle, "again")
                await calls_retried(world.handles)
                back = time.monotonic()
            retried, seconds = await idle_after(world.handles, positions, back)
            for events in retried:
                [result] = tools_results(events)
                assert (result.is_error, result.content[0].text, errors_of(events)) == (False, "retried", [])
            await recover(world, retried, "after")
            lost, duplicated = await whole_logs(world)
            assert world.calls_run(world.tools) == 2 * n, "each call that succeeded ran once"
    finally:
        dev_vault.stop()
    assert scan_for([*world.secrets(), dev_vault.root_token.get_secret_value()], worker_log.text) == []
    record(
        Outcome(
            fault="Vault stopped (SIGSTOP: unreachable), then back (SIGCONT)",
            expected="a freeze past the call's retries is a tool error (mcp_connection_failed_error, exhausted); "
            "a shorter one is retried away; the session goes on",
            n=n,
            observed="tool error naming Vault read by the model; a freeze ended during the retries went unseen",
            lost=lost,
            duplicated=duplicated + world.calls_run(world.tools) - 2 * n,
            recovery_seconds=[*recovery, *seconds],
        )
    )


async def test_a_credential_revoked_mid_session_is_an_authentication_tool_error(
    stack: Stack, worker_log: pytest.LogCaptureFixture
) -> None:
    """A credential revoked mid-session, first by the MCP server (it rejects the token), then by deleting it from
    the vault: each next call is a tool error the model reads and a `session.error`
    `mcp_authentication_failed_error` (exhausted); no token reaches an event, the history or a log line, and a
    new credential added to the vault works at the next call."""
    n = chaos_n()
    async with proxy_chaos(stack) as world:
        steps = [{"tool_uses": [GATE_CALL]}, tools_call("revoked"), SAW, tools_call("deleted"), SAW]
        await world.start(n, [*steps, tools_call("after"), SAW])
        await world.all_at_the_gate(n)
        world.authority.expire(world.tools.token)
        fault = time.monotonic()
        world.gate.faults.release()
        turn, recovery = await idle_after(world.handles, [0] * n, fault)
        for events in turn:
            [_, revoked] = tools_results(events)
            assert revoked.is_error and "rejected credential" in revoked.content[0].text, revoked.content[0].text
            assert texts(events)[-1] == "saw:\n" + revoked.content[0].text
            assert errors_of(events) == [("mcp_authentication_failed_error", "exhausted")]

        world.store.delete_credential(world.vault.id, world.tools.credential_id)
        positions = [events[-1].position for events in turn]
        for handle in world.handles:
            await send_text(handle, "again")
        deleted, seconds = await idle_after(world.handles, positions, time.monotonic())
        for events in deleted:
            [result] = tools_results(events)
            assert result.is_error and "no credential for MCP server tools" in result.content[0].text
            assert errors_of(events) == [("mcp_authentication_failed_error", "exhausted")]

        old = world.tools.token
        world.tools.token = world.authority.issue_access_token(prefix="at-canary-new")
        params = StaticBearerParams(mcp_server_url=world.tools.url, token=world.tools.token)
        world.store.add_credential(world.vault.id, params)
        await recover(world, deleted, "after")
        lost, duplicated = await whole_logs(world)
        assert world.calls_run(world.tools) == n and old in world.authority.rejected
        assert not any(token == old for _, token in world.authority.tool_calls), "a revoked token ran a tool"
    assert scan_for([*world.secrets(), old], worker_log.text) == []
    record(
        Outcome(
            fault="credential revoked mid-session (rejected by the MCP server, then deleted from the vault)",
            expected="tool error (mcp_authentication_failed_error, exhausted); no secret anywhere; the session goes on",
            n=n,
            observed="authentication tool errors read by the model; a new credential worked at the next call",
            lost=lost,
            duplicated=duplicated + world.calls_run(world.tools) - n,
            recovery_seconds=[*recovery, *seconds],
        )
    )


async def test_an_mcp_server_answering_discovery_with_garbage_is_a_connection_error_retried(
    stack: Stack, worker_log: pytest.LogCaptureFixture
) -> None:
    """An MCP server that answers `tools/list` with garbage (not JSON, or a result that is not MCP) is a server in
    trouble, not a refused credential: discovery reports `mcp_connection_failed_error` (retrying twice, then
    exhausted), and the session goes on with its other servers' tools."""
    n = chaos_n()
    async with proxy_chaos(stack) as world:
        world.gate.faults.release()
        world.tools.faults.methods = frozenset({"tools/list"})
        rows = []
        for fault_kind, said in (("garbage", "Failed to parse JSON response"), ("bad_result", "not valid MCP")):
            world.tools.faults.fault = fault_kind  # type: ignore[assignment]
            fault = time.monotonic()
            handles = await world.start(n, [{"tool_uses": [GATE_CALL]}, SAW])
            turn, recovery = await idle_after(handles[-n:], [0] * n, fault)
            for events in turn:
                assert errors_of(events) == [
                    ("mcp_connection_failed_error", "retrying"),
                    ("mcp_connection_failed_error", "retrying"),
                    ("mcp_connection_failed_error", "exhausted"),
                ], (fault_kind, [e.error.message for e in events if isinstance(e, SessionError)])
                messages = [e.error.message for e in events if isinstance(e, SessionError)]
                assert all(said in message for message in messages), messages
                assert texts(events) == ["saw:\ngate"], "the other server's tools still work"
            rows.append(recovery)
        lost, duplicated = await whole_logs(world)
    assert scan_for(world.secrets(), worker_log.text) == []
    record(
        Outcome(
            fault="MCP server answering discovery (tools/list) with garbage",
            expected="mcp_connection_failed_error, retried twice then exhausted; the other servers' tools work",
            n=2 * n,
            observed="connection errors naming the bad answer; the session went on with the gate server's tools",
            lost=lost,
            duplicated=duplicated,
            recovery_seconds=[seconds for row in rows for seconds in row],
        )
    )


async def test_vault_away_when_a_session_binds_is_a_session_error_and_the_next_turn_binds_again(
    stack: Stack, worker_log: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """Vault unreachable while sessions bind at the proxy (their first turn): the bind's retries run out, a
    `session.error` says the proxy could not serve the session, and the turn goes on without MCP tools. Once Vault
    is back, the next turn binds again and its MCP call works."""
    n = chaos_n()
    dev_vault = start_dev_vault(tmp_path / "vault", port=free_port_pair())
    try:
        async with proxy_chaos(stack, dev_vault=dev_vault, vault_timeout=2) as world:
            world.gate.faults.release()
            with frozen(dev_vault):
                fault = time.monotonic()
                await world.start(n, [{"text": "without tools"}, tools_call("after"), SAW])
                turn, recovery = await idle_after(world.handles, [0] * n, fault)
            for events in turn:
                [(kind, retry)] = errors_of(events)
                assert retry == "exhausted" and texts(events) == ["without tools"]
            positions = [events[-1].position for events in turn]
            for handle in world.handles:
                await send_text(handle, "again")
            after, seconds = await idle_after(world.handles, positions, time.monotonic())
            observed = [texts(events)[-1].removeprefix("saw:\n") for events in after]  # what the model read
            lost, duplicated = await whole_logs(world)
            calls = world.calls_run(world.tools)
    finally:
        dev_vault.stop()
    record(
        Outcome(
            fault="Vault away while a session binds at the proxy, then back",
            expected=f"{kind} (exhausted) in the first turn; the next turn binds again and its MCP call works",
            n=n,
            observed=f"next turn's MCP call got: {observed[0][:160]}",
            lost=lost + n - calls,
            duplicated=duplicated,
            recovery_seconds=[*recovery, *seconds],
        )
    )
    assert observed == ["after"] * n and calls == n
