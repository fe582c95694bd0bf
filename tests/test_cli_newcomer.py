"""What a newcomer meets first: a relative state dir, a demo that failed halfway, a fast CLI, a terminal that session
content cannot take over, and live text printed under the event that caused it. No stack needed here; the
end-to-end runs are in test_cli.py."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from cli.context import CliError, step
from cli.demo_services import DemoRepositoryError, branches, make_demo_repository
from cli.live import LiveText
from cli.main import app
from cli.render import EventRenderer, safe, safe_json_line
from corral.contract.events import (
    AgentMessage,
    AgentThreadContextCompacted,
    AgentToolResult,
    AgentToolUse,
    SpanModelRequestStart,
    TextBlock,
)
from relay import StreamEvent

runner = CliRunner()
ESCAPES = "\x1b[2J\x1b]0;owned\x07\r\x9b31m\u202e"
"""Clear screen, set the window title, carriage return, an 8-bit CSI and a bidi override."""


def _console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=200, force_terminal=True, color_system=None), buffer


# ---- the demo repository ------------------------------------------------------------------------------------------


def test_demo_repository_with_a_relative_state_dir_and_after_a_failed_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default state dir `.corral` is relative; git runs elsewhere (the issue: `git clone … exit status 128`)."""
    monkeypatch.chdir(tmp_path)
    root = Path(".corral/demo/git")
    (root / "seed").mkdir(parents=True)  # what the old code left behind after failing
    (root / "seed" / "README.md").write_text("half made\n")
    (root / "demo.git").mkdir()  # a bare repository that never got its HEAD
    bare = make_demo_repository(root)
    assert bare.is_absolute() and (bare / "HEAD").is_file()
    assert branches(bare) == ["main"]
    assert make_demo_repository(root) == bare  # made once, then reused


def test_a_git_failure_shows_gits_own_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "git"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'fatal: simulated failure' >&2\nexit 128\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(DemoRepositoryError, match=r"`git init -q -b main` exited with code 128: fatal: simulated"):
        make_demo_repository(tmp_path / "git")
    with pytest.raises(CliError) as caught, step("making the demo git repository"):
        make_demo_repository(tmp_path / "git")
    assert caught.value.message.startswith("making the demo git repository failed: `git init")
    assert not list((tmp_path / "git").glob("seed-*")), "the scratch directory is gone"


def test_step_names_the_failing_command_and_its_output() -> None:
    with pytest.raises(CliError) as caught, step("building", log=Path("/var/log/x.log")):
        subprocess.run([sys.executable, "-c", "import sys; sys.exit('no disk left')"], check=True, capture_output=True)
    assert "building failed: `" in caught.value.message
    assert "exited with code 1: no disk left" in caught.value.message
    assert caught.value.hint == "the log to read: /var/log/x.log"


# ---- arguments ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("session", ["", "  ", "sesn_a b"])
def test_a_session_id_that_is_empty_or_has_spaces_is_a_usage_error(tmp_path: Path, session: str) -> None:
    result = runner.invoke(app, ["--state-dir", str(tmp_path), "events", session])
    assert result.exit_code == 2, result.output
    assert "session id" in result.output
    assert "Traceback" not in result.output and "WorkflowId is not set" not in result.output


def test_the_state_dir_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["--state-dir", "rel/state", "status"])
    assert result.exit_code == 0, result.output
    assert str(tmp_path / "rel" / "state") in " ".join(result.output.split())


# ---- start-up -------------------------------------------------------------------------------------------------------


def test_the_cli_imports_no_heavy_module_until_a_command_needs_it() -> None:
    """`corral --help` must answer in a fraction of a second: the Temporal client, the contract's pydantic models,
    the Docker SDK, the MCP SDK and the Vault client load only in the commands that use them."""
    heavy = ["temporalio", "corral.contract", "docker", "mcp", "hvac", "httpx", "anthropic", "proxy"]
    probe = (
        "import sys, cli.main\n"
        f"print([m for m in {heavy!r} if any(n == m or n.startswith(m + '.') for n in sys.modules)])"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
    shown = subprocess.run([sys.executable, "-m", "cli.main", "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "demo" in shown.stdout


# ---- what session content may not do to a terminal ------------------------------------------------------------------


def test_control_characters_are_shown_escaped() -> None:
    assert safe("a\x1b[2Jb\tc\nd") == "a\\x1b[2Jb\tc\nd"
    assert safe("\x9b\x7f\u202e") == "\\x9b\\x7f\\u202e"
    line = safe_json_line(json.dumps({"text": "x\x1by\x9bz"}, ensure_ascii=False))
    assert "\x1b" not in line and "\x9b" not in line
    assert json.loads(line) == {"text": "x\x1by\x9bz"}, "still valid JSON with the same value"


def test_events_print_no_raw_control_character() -> None:
    console, buffer = _console()
    renderer = EventRenderer(console)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    renderer.print(AgentMessage(id="sevt_1", position=1, created_at=now, content=[TextBlock(text=f"hi{ESCAPES}")]))
    renderer.print(AgentToolUse(id="sevt_2", position=2, created_at=now, name=f"bash{ESCAPES}", input={"c": ESCAPES}))
    result = AgentToolResult(
        id="sevt_3", position=3, created_at=now, tool_use_id="sevt_2", content=[TextBlock(text=ESCAPES)]
    )
    renderer.print(result)
    printed = buffer.getvalue()
    assert not [char for char in printed if char in "\x1b\x07\r\x9b\u202e"], repr(printed)
    assert printed.count("\\x1b") >= 4 and "\\x9b" in printed and "\\u202e" in printed


# ---- live text ---------------------------------------------------------------------------------------------------


def test_live_text_waits_for_the_event_that_opened_its_request() -> None:
    """Deltas arrive from the relay before the tail has read the request's start from the log; they are held, so
    the live line never shows up above the message that caused it."""
    console, buffer = _console()
    live = LiveText(console)
    renderer = EventRenderer(console)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    live.on_stream(StreamEvent(type="delta", span_id="sevt_3", kind="text", text="Hello\x1b[2J", block=0, offset=0))
    assert buffer.getvalue() == ""
    renderer.print(AgentMessage(id="sevt_1", position=1, created_at=now, content=[TextBlock(text="earlier reply")]))
    start = SpanModelRequestStart(id="sevt_3", position=3, created_at=now)
    renderer.print(start)
    live.release(start.id)
    live.on_stream(StreamEvent(type="delta", span_id="sevt_3", kind="text", text=" world", block=0, offset=10))
    live.close_line()
    printed = buffer.getvalue()
    assert printed.index("span.model_request_start") < printed.index("Hello") < printed.index(" world")
    assert "\x1b" not in printed and "Hello\\x1b[2J world" in printed
    assert live.already_shown(
        AgentMessage(id="sevt_4", position=4, created_at=now, content=[TextBlock(text="Hello\x1b[2J world")])
    )


def test_a_summary_shows_what_it_stands_for() -> None:
    console, buffer = _console()
    now = datetime(2026, 1, 1, tzinfo=UTC)
    compacted = AgentThreadContextCompacted(
        id="sevt_9", position=9, created_at=now, summary="the user asked for notes", start_position=1, end_position=7
    )
    EventRenderer(console).print(compacted)
    assert "agent.thread_context_compacted" in buffer.getvalue()
    assert "positions 1-7 summarised for the model: the user asked for notes" in buffer.getvalue()


def test_thread_events_say_which_thread_and_what_passed_between_threads() -> None:
    """A multi-agent session's primary log, as `corral tail` and the demo print it: each thread event names its
    thread and agent, a thread's cross-posted tool call names the thread, and messages show who sent what."""
    from corral.contract.events import (
        AgentThreadMessageReceived,
        AgentThreadMessageSent,
        EndTurn,
        SessionThreadCreated,
        SessionThreadStatusIdle,
    )

    console, buffer = _console()
    renderer = EventRenderer(console)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    text = [TextBlock(text="Which kernel runs here?")]
    for event in (
        SessionThreadCreated(id="sevt_1", position=1, created_at=now, session_thread_id="sthr_a", agent_name="shell"),
        AgentThreadMessageSent(id="sevt_2", position=2, created_at=now, to_session_thread_id="sthr_a",
                               to_agent_name="shell", content=text),
        AgentToolUse(id="sevt_3", position=3, created_at=now, name="bash", input={"command": "uname -sr"},
                     session_thread_id="sthr_a"),
        SessionThreadStatusIdle(id="sevt_4", position=4, created_at=now, session_thread_id="sthr_a",
                                agent_name="shell", stop_reason=EndTurn()),
        AgentThreadMessageReceived(id="sevt_5", position=5, created_at=now, from_session_thread_id="sthr_a",
                                   from_agent_name="shell", content=[TextBlock(text="Linux 6.1")]),
    ):  # fmt: skip
        renderer.print(event)
    lines = buffer.getvalue().splitlines()
    assert "session.thread_created" in lines[0] and lines[0].endswith("sthr_a (shell)")
    assert lines[1].endswith("to sthr_a (shell): Which kernel runs here?")
    assert lines[2].endswith('[sthr_a] bash {"command": "uname -sr"}')
    assert lines[3].endswith("sthr_a (shell): end_turn")
    assert lines[4].endswith("from sthr_a (shell): Linux 6.1")


def test_the_demos_multi_agent_session_gives_its_coordinator_a_roster_of_two() -> None:
    """Started from a Temporal client, so the roster holds full snapshots; offline, each role runs its own script
    (the scripts `corral demo` registers), and with a key every role runs the default model."""
    from cli.demo_threads import thread_demo_input
    from corral.contract.agent import AgentToolset20260401, UtilityToolset
    from modelserver.demo import THREAD_DEMO_SCRIPTS

    offline = thread_demo_input(offline=True, default_model="corral-offline-stand-in")
    multiagent = offline.agent.multiagent
    assert multiagent is not None and multiagent.spawns()
    roster = {entry.name(offline.agent): entry.config for entry in multiagent.agents}
    assert set(roster) == {"shell", "clock"} and all(config is not None for config in roster.values())
    models = {offline.agent.model, *(config.model for config in roster.values() if config is not None)}
    assert models == {f"script:{name}" for name in THREAD_DEMO_SCRIPTS}
    assert [tool.name for tool in offline.agent.resolved_tools()] == [
        "spawn_thread",
        "message_thread",
        "wait_for_threads",
    ]
    shell, clock = roster["shell"], roster["clock"]
    assert shell is not None and [t.name for t in shell.resolved_tools()] == ["bash"]
    assert isinstance(shell.tools[0], AgentToolset20260401)
    assert clock is not None and isinstance(clock.tools[0], UtilityToolset)
    online = thread_demo_input(offline=False, default_model="claude-sonnet-4-5")
    assert online.agent.model == "claude-sonnet-4-5"


def test_outcome_and_workflow_run_events_say_what_they_are_about() -> None:
    """`corral tail` names the outcome and its cycle, the grader's verdict and why, and a run's phases by name."""
    from corral.contract.events import (
        ModelUsage,
        SessionEvent,
        SpanOutcomeEvaluationEnd,
        TextRubric,
        UserDefineOutcome,
        WorkflowRunCreated,
        WorkflowRunError,
        WorkflowRunErrorObject,
        WorkflowRunPhase,
        WorkflowRunPhaseStarted,
        WorkflowRunResult,
        WorkflowRunStatusEnded,
    )

    console, buffer = _console()
    renderer = EventRenderer(console)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    at: dict[str, object] = {"id": "sevt_x", "position": 0, "created_at": now}
    run: dict[str, object] = {**at, "workflow_run_id": "wrun_1"}
    events: list[SessionEvent] = [
        UserDefineOutcome(outcome_id="outc_1", description="A haiku.", rubric=TextRubric(content="3 lines"), **at),
        SpanOutcomeEvaluationEnd(outcome_id="outc_1", iteration=0, outcome_evaluation_start_id="s",
                                 result="needs_revision", explanation="Two lines only.", usage=ModelUsage(), **at),
        WorkflowRunCreated(name="survey", phases=[WorkflowRunPhase(id="wrph_1", name="gather")], **run),
        WorkflowRunPhaseStarted(workflow_run_phase_id="wrph_1", **run),
        WorkflowRunError(error=WorkflowRunErrorObject(type="program_error", message="bad plan"), **at),
        WorkflowRunStatusEnded(result=WorkflowRunResult(type="completed"), **run),
    ]  # fmt: skip
    for n, event in enumerate(events, 1):
        renderer.print(event.model_copy(update={"position": n}))
    printed = buffer.getvalue()
    for shown in ["outc_1: A haiku. (up to 3 cycles)", "outc_1, cycle 1: needs_revision: Two lines only.",
                  "wrun_1 survey: phases gather", "wrun_1 phase gather", "(no run made): program_error: bad plan",
                  "wrun_1: completed"]:  # fmt: skip
        assert shown in printed, printed
