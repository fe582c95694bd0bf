"""The multi-agent part of `corral demo`: a coordinator with two predefined subagents, `shell` (bash in the sandbox)
and `clock` (the utility hand). The coordinator spawns a thread of each, they work at once on the session's shared
hands and reply, and it sums up.

The session is started from a Temporal client, so its `multiagent` config is the harness's resolved form given
directly (roster snapshots), as docs/threads.md shows. Offline, each role runs a script of the stand-in
(`modelserver.demo.THREAD_DEMO_SCRIPTS`), registered on the stack's model server; with an API key, the default model.
"""

from __future__ import annotations

import httpx
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from cli.context import Settings
from cli.render import blocks_text, compact_json, one_line
from corral.contract.agent import AgentConfig, Multiagent, ThreadAgent, UtilityToolset
from corral.contract.events import (
    AgentMessage,
    AgentThreadMessageReceived,
    AgentToolUse,
    SessionEvent,
    SessionThreadCreated,
    SessionThreadStatusIdle,
    SessionThreadStatusRunning,
)
from corral.contract.sandbox import AgentToolset20260401, ToolConfig, ToolsetDefaultConfig
from corral.contract.session import SessionInput
from modelserver.demo import THREAD_DEMO_SCRIPTS

THREAD_DEMO_MESSAGE = (
    "Ask the shell agent which kernel the sandbox runs and the clock agent what time it is, both at once; "
    "then sum up their replies."
)
SYSTEMS = {
    "coordinator": "You coordinate two agents, shell and clock. Spawn a thread of each, wait for both replies, and "
    "sum them up in two lines.",
    "shell": "Answer with the output of one bash command run in the sandbox, nothing more.",
    "clock": "Answer with the current time from get_time, nothing more.",
}


def thread_demo_input(offline: bool, default_model: str) -> SessionInput:
    """The coordinator's session: its roster holds full snapshots of `shell` and `clock` (no gateway resolves them
    here). Offline, each role is a `script:` model of its own."""

    def agent(name: str, **tools: object) -> AgentConfig:
        model = f"script:demo-{name}" if offline else default_model
        return AgentConfig.model_validate({"name": name, "model": model, "system": SYSTEMS[name], **tools})

    bash_only = AgentToolset20260401(
        default_config=ToolsetDefaultConfig(enabled=False), configs=[ToolConfig(name="bash", enabled=True)]
    )
    shell = agent("shell", tools=[bash_only])
    clock = agent("clock", tools=[UtilityToolset()])
    roster = [ThreadAgent(config=shell), ThreadAgent(config=clock)]
    coordinator = agent("coordinator", multiagent=Multiagent(type="coordinator", agents=roster))
    return SessionInput(agent=coordinator, message=THREAD_DEMO_MESSAGE, title="corral demo: threads")


def register_scripts(model_url: str) -> None:
    """Put the coordinator's and the subagents' scripts on the stack's offline model server (idempotent)."""
    for name, script in THREAD_DEMO_SCRIPTS.items():
        response = httpx.put(f"{model_url}/_corral/scripts/{name}", json=script.model_dump(mode="json"), timeout=10)
        response.raise_for_status()


def thread_summary(settings: Settings, session_id: str, events: list[SessionEvent]) -> Panel:
    """Each thread: its agent, what it ran on the shared hands, how long it worked, and its reply; then the answer."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("Session", f"{session_id} (the primary thread, its coordinator)")
    started = {e.session_thread_id: e.created_at for e in events if isinstance(e, SessionThreadStatusRunning)}
    created = [event for event in events if isinstance(event, SessionThreadCreated)]
    for event in created:
        tid = event.session_thread_id
        calls = [e for e in events if isinstance(e, AgentToolUse) and e.session_thread_id == tid]
        idle = next((e for e in events if isinstance(e, SessionThreadStatusIdle) and e.session_thread_id == tid), None)
        worked = f", worked {(idle.created_at - started[tid]).total_seconds():.1f} s" if idle and tid in started else ""
        replies = [e for e in events if isinstance(e, AgentThreadMessageReceived) and e.from_session_thread_id == tid]
        reply = replies[0] if replies else None
        line = Text(f"{tid} running {event.agent_name}{worked}\n", style="")
        for call in calls:
            line.append(f"  {call.name} {compact_json(call.input)}\n", style="dim")
        line.append("  replied: ")
        line.append(one_line(blocks_text(reply.content), 80) if reply else "(no reply)", "green" if reply else "red")
        grid.add_row("Thread", line)
    answers = [event for event in events if isinstance(event, AgentMessage)]
    if answers:
        grid.add_row("Coordinator", Text(one_line(blocks_text(answers[-1].content), 100)))
    grid.add_row("Web UI", Text(f"{settings.workflow_url(session_id)} (its threads are its child workflows)", "blue"))
    grid.add_row("Read them", f"corral threads {session_id}")
    if created:
        grid.add_row("", f"corral events {session_id} --thread {created[0].session_thread_id}")
    grid.add_row("More", "docs/threads.md")
    grid.add_row("Stop the stack", "corral down")
    title = f"multi-agent run: {len(created)} threads"
    return Panel(grid, title=title, title_align="left", border_style="green", expand=False)
