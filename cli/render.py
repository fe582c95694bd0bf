"""Rendering sessions with rich: one line per event, tables of sessions and processes.

Event text comes from users, models and tools, so it is never trusted with the terminal: it is always wrapped in
`Text` (never parsed as rich markup: a model writing "[bold]" must print as is), and every control character in
it is shown escaped (`\\x1b`), never sent raw (an escape sequence could rewrite the user's terminal).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from corral.contract.events import (
    AgentCustomToolUse,
    AgentMcpToolResult,
    AgentMcpToolUse,
    AgentMessage,
    AgentThreadContextCompacted,
    AgentThreadMessageReceived,
    AgentThreadMessageSent,
    AgentToolResult,
    AgentToolUse,
    RequiresAction,
    SessionError,
    SessionEvent,
    SessionStatusIdle,
    SessionThreadCreated,
    SessionThreadStatusIdle,
    SessionThreadStatusRescheduled,
    SessionThreadStatusRunning,
    SessionThreadStatusTerminated,
    SpanModelRequestEnd,
    SpanOutcomeEvaluationEnd,
    SpanOutcomeEvaluationOngoing,
    SpanOutcomeEvaluationStart,
    SystemMessage,
    UserCustomToolResult,
    UserDefineOutcome,
    UserMessage,
    UserToolConfirmation,
    UserToolResult,
    WorkflowRunCreated,
    WorkflowRunError,
    WorkflowRunPhaseEnded,
    WorkflowRunPhaseStarted,
    WorkflowRunStatusEnded,
    WorkflowRunStatusIdle,
    WorkflowRunStatusRunning,
)

if TYPE_CHECKING:
    from cli.processes import ProcessState

FAMILY_STYLES = {"user": "cyan", "agent": "green", "session": "yellow", "span": "magenta", "workflow_run": "blue"}
ERROR_STYLE = "bold red"
PREFIX_WIDTH = 4 + 2 + 8 + 2 + 26 + 2
"""Position, time and type columns; the summary gets the rest of the line."""
CAPTURED_SUMMARY_WIDTH = 240
"""When output is not a terminal there is no width to fit; keep lines long enough to be useful to grep."""


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""C0 controls but tab and newline, DEL, C1 controls, and the bidirectional overrides that reorder what is shown."""
_JSON_UNESCAPED = re.compile("[\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""What JSON leaves raw in strings: its serialiser already escapes C0 controls."""


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def safe(text: str) -> str:
    """`text` with every control character (tab and newline kept) written as a visible escape like `\\x1b`."""
    return _CONTROL.sub(_escape, text)


def safe_json_line(line: str) -> str:
    """A JSON text with the controls JSON leaves raw (DEL, C1, bidi) written as `\\u` escapes: still valid JSON."""
    return _JSON_UNESCAPED.sub(lambda match: f"\\u{ord(match.group()):04x}", line)


def one_line(text: str, width: int) -> str:
    """Collapse whitespace, escape control characters, and cut to `width` characters with an ellipsis."""
    flat = " ".join(safe(text).split())
    return flat if len(flat) <= width else flat[: max(width - 1, 0)] + "…"


def blocks_text(blocks: Iterable[Any]) -> str:
    """The text of content blocks; images and documents show as a placeholder."""
    parts = []
    for block in blocks:
        kind = getattr(block, "type", "")
        parts.append(block.text if kind == "text" else f"[{kind}]")
    return " ".join(parts)


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def event_style(event_type: str) -> str:
    if event_type == "session.error":
        return ERROR_STYLE
    return FAMILY_STYLES.get(event_type.split(".", 1)[0], "")


class EventRenderer:
    """Prints events one line each; remembers tool names so a tool result says which tool it answers."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.tool_names: dict[str, str] = {}
        self.phase_names: dict[str, str] = {}

    @property
    def summary_width(self) -> int:
        if not self.console.is_terminal:
            return CAPTURED_SUMMARY_WIDTH
        return max(self.console.width - PREFIX_WIDTH, 30)

    def summary(self, event: SessionEvent) -> Text:
        """What matters in one event, short: text, tool call, result, stop reason, error, or usage."""
        width = self.summary_width
        match event:
            case UserMessage() | AgentMessage() | SystemMessage():
                return Text(one_line(blocks_text(event.content), width))
            case AgentToolUse() | AgentCustomToolUse():
                self.tool_names[event.id] = event.name
                waiting = " (waits for user.custom_tool_result)" if isinstance(event, AgentCustomToolUse) else ""
                where = f"[{event.session_thread_id}] " if event.session_thread_id else ""  # a thread's, cross-posted
                return Text(one_line(f"{where}{event.name} {compact_json(event.input)}{waiting}", width), style="bold")
            case AgentMcpToolUse():
                self.tool_names[event.id] = f"{event.mcp_server_name}/{event.name}"
                return Text(one_line(f"{event.mcp_server_name}/{event.name} {compact_json(event.input)}", width))
            case AgentToolResult() | UserToolResult():
                name = self.tool_names.get(event.tool_use_id, event.tool_use_id)
                return self._result(name, blocks_text(event.content), event.is_error)
            case AgentMcpToolResult():
                name = self.tool_names.get(event.mcp_tool_use_id, event.mcp_tool_use_id)
                return self._result(name, blocks_text(event.content), event.is_error)
            case UserCustomToolResult():
                name = self.tool_names.get(event.custom_tool_use_id, event.custom_tool_use_id)
                return self._result(name, blocks_text(event.content), event.is_error)
            case UserToolConfirmation():
                denied = f": {event.deny_message}" if event.deny_message else ""
                return Text(one_line(f"{event.result} {event.tool_use_id}{denied}", width))
            case SessionStatusIdle():
                reason = event.stop_reason
                waiting = ""
                if isinstance(reason, RequiresAction):
                    waiting = f" (waiting for {', '.join(reason.event_ids)})"
                return Text(one_line(f"{reason.type}{waiting}", width), style="bold")
            case SessionError():
                error = event.error
                return Text(one_line(f"{error.type} ({error.retry_status.type}): {error.message}", width), ERROR_STYLE)
            case AgentThreadContextCompacted():
                covered = f"positions {event.start_position}-{event.end_position} summarised for the model: "
                return Text(one_line(covered + event.summary, width), style="dim")
            case SessionThreadCreated() | SessionThreadStatusRunning() | SessionThreadStatusRescheduled():
                return Text(one_line(f"{event.session_thread_id} ({event.agent_name})", width))
            case SessionThreadStatusIdle() | SessionThreadStatusTerminated():
                why = f": {event.stop_reason.type}" if isinstance(event, SessionThreadStatusIdle) else ""
                return Text(one_line(f"{event.session_thread_id} ({event.agent_name}){why}", width))
            case AgentThreadMessageSent():
                to = f"{event.to_session_thread_id} ({event.to_agent_name or 'the coordinator'})"
                return Text(one_line(f"to {to}: {blocks_text(event.content)}", width))
            case AgentThreadMessageReceived():
                sender = f"{event.from_session_thread_id} ({event.from_agent_name or 'the coordinator'})"
                return Text(one_line(f"from {sender}: {blocks_text(event.content)}", width))
            case UserDefineOutcome():
                line = f"{event.outcome_id}: {event.description} (up to {event.max_iterations} cycles)"
                return Text(one_line(line, width), style="bold")
            case SpanOutcomeEvaluationStart() | SpanOutcomeEvaluationOngoing():
                return Text(f"{event.outcome_id}, cycle {event.iteration + 1}", style="dim")
            case SpanOutcomeEvaluationEnd():
                line = f"{event.outcome_id}, cycle {event.iteration + 1}: {event.result}: {event.explanation}"
                return Text(one_line(line, width), style=ERROR_STYLE if event.result == "failed" else "bold")
            case WorkflowRunCreated():
                self.phase_names.update({phase.id: phase.name for phase in event.phases})
                phases = ", ".join(phase.name for phase in event.phases)
                return Text(one_line(f"{event.workflow_run_id} {event.name}: phases {phases}", width), style="bold")
            case WorkflowRunPhaseStarted() | WorkflowRunPhaseEnded():
                phase = self.phase_names.get(event.workflow_run_phase_id, event.workflow_run_phase_id)
                return Text(one_line(f"{event.workflow_run_id} phase {phase}", width))
            case WorkflowRunStatusRunning() | WorkflowRunStatusIdle():
                return Text(event.workflow_run_id)
            case WorkflowRunError():
                line = f"{event.workflow_run_id or '(no run made)'}: {event.error.type}: {event.error.message}"
                return Text(one_line(line, width), style=ERROR_STYLE)
            case WorkflowRunStatusEnded():
                return Text(f"{event.workflow_run_id}: {event.result.type}", style="bold")
            case SpanModelRequestEnd():
                usage = event.model_usage
                text = f"{usage.input_tokens} in / {usage.output_tokens} out tokens"
                if usage.cache_read_input_tokens or usage.cache_creation_input_tokens:
                    text += f" (cache read {usage.cache_read_input_tokens}, write {usage.cache_creation_input_tokens})"
                return Text(text + (" — failed" if event.is_error else ""), style="dim")
            case _:
                return Text("")

    def _result(self, name: str, text: str, is_error: bool) -> Text:
        line = Text(f"{one_line(name, 60)} → ", style="bold")
        if is_error:
            line.append("error: ", style=ERROR_STYLE)
        line.append(one_line(text, max(self.summary_width - len(line), 10)), style="red" if is_error else "")
        return line

    def line(self, event: SessionEvent) -> Text:
        local = event.created_at.astimezone().strftime("%H:%M:%S")
        line = Text(f"{event.position:>4}  ", style="dim")
        line.append(f"{local}  ", style="dim")
        line.append(f"{event.type:<26}  ", style=event_style(event.type))
        line.append_text(self.summary(event))
        return line

    def print(self, event: SessionEvent) -> None:
        self.console.print(self.line(event), soft_wrap=True, overflow="ignore", crop=False)


def processes_table(states: Iterable[ProcessState]) -> Table:
    table = Table(title="corral stack processes", title_justify="left")
    table.add_column("process")
    table.add_column("pid", justify="right")
    table.add_column("alive")
    table.add_column("log", overflow="fold")
    for state in states:
        alive = Text("yes", style="green") if state.alive else Text("no", style="red")
        table.add_row(state.name, str(state.pid) if state.pid else "—", alive, str(state.log))
    return table


def local_time(value: datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else "—"


def sessions_table(rows: Iterable[tuple[str, str, str, datetime | None, str]]) -> Table:
    """Rows of (id, CorralStatus, CorralModel, start time, workflow status)."""
    table = Table()
    table.add_column("session", no_wrap=True)
    table.add_column("status")
    table.add_column("model")
    table.add_column("started")
    table.add_column("workflow")
    status_styles = {"idle": "green", "running": "yellow", "rescheduling": "yellow", "terminated": "dim"}
    for session_id, status, model, started, workflow_status in rows:
        table.add_row(
            safe(session_id),
            Text(safe(status), style=status_styles.get(status, "")),
            safe(model),
            local_time(started),
            Text(workflow_status, style="" if workflow_status == "Running" else "dim"),
        )
    return table
