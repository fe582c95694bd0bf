"""`corral demo`: the first thing a new user runs. Up, one session with tools, followed live, then where to look.

It uses only what the other commands use (bring_up, start_session, send_text, tail), so a demo that works is
evidence that the commands work.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from temporalio.client import Client, WorkflowHandle

from cli import demo_services, demo_threads, session_ops, up
from cli.context import CliError, Settings, step
from cli.render import EventRenderer, blocks_text, compact_json, one_line
from cli.vault import vault_store
from corral.client import new_session_id, read_events, send_events, send_text, start_session
from corral.contract.events import (
    AgentMcpToolResult,
    AgentThreadMessageReceived,
    AgentToolResult,
    AgentToolUse,
    SessionEvent,
)
from corral.contract.outcomes import TERMINAL_RESULTS, OutcomeEvaluation
from corral.contract.session import SessionInfo
from corral.names import QUERY_SESSION
from corral.temporal import connect
from proxy import StaticBearerParams

DEMO_MESSAGE = "Hello! Please calculate 6*7 and then tell me the time with get_time."
"""The offline stand-in calls the first tool it sees named (`calculate`, with the clause after it: `6*7`); a real
model may call both tools."""
FOLLOW_UP_MESSAGES = (
    "please use get_time",
    # The first call of a sandbox tool is what provisions the container (lazily, never before).
    "now run bash uname -sr && id -un && pwd",
    # An MCP call through the proxy, with a bearer token only the proxy worker reads from Vault.
    "count words with mcp__demo__word_count corral keeps the brain apart from the hands",
    # A file edit in the sandbox's workspace (the cloned repository).
    'now use edit file_path=demo/README.md old_string="# demo" new_string="# corral demo"',
    # A git push from the sandbox: its origin is the git proxy, which adds the token outside the sandbox.
    "bash cd /workspace/demo && git checkout -q -b demo-change && date > CHANGES && git add -A && "
    "git -c user.name=corral -c user.email=demo@corral.invalid commit -qm demo && git push -q origin demo-change "
    "&& git log --oneline -1",
)
DEMO_OUTCOME = {
    "type": "user.define_outcome",
    "description": "Sum up in one sentence what this session has done so far.",
    "rubric": {"type": "text", "content": "One sentence. It says what the session did, and nothing it did not do."},
    "max_iterations": 2,
}
"""Last, an outcome: a grader (the same model, with its own prompt) judges the agent's answer against the rubric. It
names no tool, so the offline stand-in, which calls a tool the user names, only answers."""
DEMO_BRANCH = "demo-change"
IDLE_TIMEOUT = 60.0


async def _until_idle(
    settings: Settings, handle: WorkflowHandle, renderer: EventRenderer, after: int
) -> list[SessionEvent]:
    """Follow until the reply is complete; a session that stays busy for a minute is a failed demo."""
    try:
        following = session_ops.tail(handle, renderer, after=after, stream_url=settings.stream_url())
        result = await asyncio.wait_for(following, IDLE_TIMEOUT)
    except TimeoutError:
        raise CliError(
            f"session {handle.id} did not reach idle within {IDLE_TIMEOUT:.0f} s",
            hint=f"see `corral events {handle.id}` and the worker logs in {settings.paths.logs}",
        ) from None
    if result.reason != "idle":
        raise CliError(f"session {handle.id} ended unexpectedly ({result.reason})")
    return result.events


def _tool_calls(events: list[SessionEvent]) -> list[tuple[AgentToolUse, AgentToolResult | None]]:
    results = {event.tool_use_id: event for event in events if isinstance(event, AgentToolResult)}
    return [(event, results.get(event.id)) for event in events if isinstance(event, AgentToolUse)]


def _summary(settings: Settings, session_id: str, address: str, events: list[SessionEvent], pushed: bool,
             graded: OutcomeEvaluation) -> Panel:  # fmt: skip
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("Session", session_id)
    grid.add_row("Events", f"{len(events)} in the log (its Temporal workflow history)")
    calls = _tool_calls(events)
    for index, (use, result) in enumerate(calls):
        line = Text(f"{use.name} {compact_json(use.input)} → ")
        if result is None:
            line.append("(no result)", style="dim")
        else:
            line.append(one_line(blocks_text(result.content), 80), style="red" if result.is_error else "green")
        grid.add_row("Tool calls" if index == 0 else "", line)
    if not calls:
        grid.add_row("Tool calls", "none")
    mcp_results = [event for event in events if isinstance(event, AgentMcpToolResult)]
    for event in mcp_results:
        grid.add_row("MCP via the proxy", Text(one_line(blocks_text(event.content), 80), style="green"))
    git_state = f"branch {DEMO_BRANCH} arrived at the demo git server" if pushed else "the push did not arrive"
    grid.add_row("git push", Text(git_state, style="green" if pushed else "red"))
    verdict = f"{graded.result} after {graded.iteration + 1} grading cycle(s): {graded.explanation or ''}"
    grid.add_row("Outcome", Text(one_line(verdict, 100), style="green" if graded.result == "satisfied" else "yellow"))
    grid.add_row("Credentials", "MCP and git tokens: in Vault and the proxy worker only, never in the session")
    grid.add_row("Web UI", Text(settings.workflow_url(session_id), style="blue"))
    grid.add_row("Read it", f"corral events {session_id}")
    grid.add_row("", f'corral send {session_id} "please calculate 2**10" --follow')
    grid.add_row(
        "Or with temporal",
        f"temporal workflow query --address {address} --namespace {settings.namespace} "
        f"--workflow-id {session_id} --name events",
    )
    return Panel(grid, title="demo session finished", title_align="left", border_style="green", expand=False)


async def run_demo(settings: Settings, options: up.UpOptions) -> None:
    """Bring the stack up, run exchanges that call tools (in the sandbox, over MCP, with git), and summarise.

    Each step has a name: a failure says which step failed, the tool's own error and the log to read, and that the
    stack is still up (so it can be inspected, and stopped with `corral down`). A second run after a failed one
    starts over cleanly: every step is idempotent.
    """
    try:
        await _run_demo(settings, options)
    except CliError as error:
        raise up.note_running(error, settings.paths) from None


async def _run_demo(settings: Settings, options: up.UpOptions) -> None:
    report = await up.bring_up(settings.out, settings.paths, options, settings.namespace)
    settings.out.print(up.stack_panel(report, settings.paths))
    config = report.config
    logs = settings.paths.logs
    with step("connecting to Temporal", address=config.temporal_address):
        client = await connect(config.temporal_address, settings.namespace)
    session_id = new_session_id()
    with contextlib.ExitStack() as services:
        base, bare = _credentialed_services(settings, session_id, services)
        session_input = session_ops.build_session_input(
            base, default_model=settings.default_model(), message=DEMO_MESSAGE, title="corral demo", from_file=False
        )
        with step("starting the demo session", log=logs, address=config.temporal_address):
            handle = await start_session(client, session_input, session_id=session_id)
        with step(f"running the demo session {session_id}", log=logs, address=config.temporal_address):
            await _converse(settings, handle, session_input.agent.model, config.temporal_address, bare)
    await _run_threads(settings, client, config.model_url, config.temporal_address)


async def _run_threads(settings: Settings, client: Client, model_url: str | None, address: str) -> None:
    """The multi-agent run: a coordinator spawns two threads that work at once on the shared hands, and sums up."""
    logs = settings.paths.logs
    if model_url is not None:
        with step(
            "putting the multi-agent scripts on the offline model server", log=settings.paths.log_file("model-server")
        ):
            demo_threads.register_scripts(model_url)
    session_input = demo_threads.thread_demo_input(model_url is not None, settings.default_model())
    with step("starting the multi-agent demo session", log=logs, address=address):
        handle = await start_session(client, session_input)
    with step(f"running the multi-agent demo session {handle.id}", log=logs, address=address):
        settings.out.print()
        settings.out.rule(Text(f"session {handle.id} · a coordinator and two threads"))
        settings.out.print(Text(settings.workflow_url(handle.id), style="blue"))
        await _until_idle(settings, handle, EventRenderer(settings.out), after=0)
        events = await read_events(handle)
        settings.out.print()
        settings.out.print(demo_threads.thread_summary(settings, handle.id, events))
        replies = [e for e in events if isinstance(e, AgentThreadMessageReceived)]
        if len(replies) < 2:
            raise CliError(f"the multi-agent session {handle.id} got {len(replies)} of its 2 threads' replies")


def _credentialed_services(
    settings: Settings, session_id: str, services: contextlib.ExitStack
) -> tuple[dict[str, Any], Path]:
    """A local MCP server and git server with random tokens put in Vault; the session only names them."""
    root = settings.paths.root / "demo"
    mcp_token, git_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    with step("starting the demo MCP server"):
        mcp = services.enter_context(demo_services.demo_mcp_server(mcp_token))
    with step("making the demo git repository"):
        bare = demo_services.make_demo_repository(root / "git")
    with step("starting the demo git server"):
        git = services.enter_context(demo_services.demo_git_server(root / "git", git_token))
    mcp_url, git_url = f"{mcp.base_url}/mcp", f"{git.base_url}/demo.git"
    with step("storing the demo tokens in Vault", log=settings.paths.log_file("vault")):
        store = vault_store(settings)
        vault = store.create_vault("corral demo")
        # Its token is for a server that lives as long as this demo: the vault goes with it, rather than pile up
        # in the durable Vault run after run.
        services.callback(store.delete_vault, vault.id)
        store.add_credential(vault.id, StaticBearerParams(mcp_server_url=mcp_url, token=SecretStr(mcp_token)))
        store.store_repository_token(session_id, "demo", git_url, git_token)
    base: dict[str, Any] = {
        "agent": {
            "mcp_servers": [{"type": "url", "name": "demo", "url": mcp_url}],
            "tools": [{"type": "mcp_toolset", "mcp_server_name": "demo"}],
        },
        "vault_ids": [vault.id],
        "resources": [
            {"type": "github_repository", "url": git_url, "repository_id": "demo",
             "checkout": {"type": "branch", "name": "main"}},
        ],
    }  # fmt: skip
    return base, bare


async def _converse(settings: Settings, handle: WorkflowHandle, model: str, address: str, bare: Path) -> None:
    settings.out.rule(Text(f"session {handle.id} · model {model}"))
    settings.out.print(Text(settings.workflow_url(handle.id), style="blue"))
    renderer = EventRenderer(settings.out)
    first = await _until_idle(settings, handle, renderer, after=0)

    last = first[-1].position
    for message in FOLLOW_UP_MESSAGES:
        settings.out.print()
        await send_text(handle, message)
        last = (await _until_idle(settings, handle, renderer, after=last))[-1].position

    settings.out.print()
    await send_events(handle, [DEMO_OUTCOME])
    await _until_idle(settings, handle, renderer, after=last)
    (graded,) = (await handle.query(QUERY_SESSION, result_type=SessionInfo)).outcome_evaluations
    events = await read_events(handle)
    settings.out.print()
    pushed = DEMO_BRANCH in demo_services.branches(bare)
    settings.out.print(_summary(settings, handle.id, address, events, pushed, graded))
    if not pushed:
        raise CliError(f"the demo's git push did not arrive (branch {DEMO_BRANCH} is missing)")
    if graded.result not in TERMINAL_RESULTS:
        raise CliError(f"the demo's outcome {graded.outcome_id} did not end ({graded.result})")
