"""Workflow runs over the API, driven by the official `anthropic` SDK against a real gateway process on the real
Temporal dev server, a real harness and model worker, and the offline model server scripting the coordinator and
its tasks: an agent's `multiagent.workflows` resolved into the harness's `Multiagent.runs…` with the operator's
limits; each new event as the SDK reads it; a run of two phases (three threads at once, then one) whose events come
in order on `events.list` and the stream, whose threads carry its id, and that `corral runs` lists; a malformed plan
(`program_error`, no run) and a run over its thread limit (`thread_limit_error`)."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic._models import construct_type
from anthropic.types.beta import sessions as sdk
from anthropic.types.beta.beta_managed_agents_session_multiagent20261001 import (
    BetaManagedAgentsSessionMultiagent20261001,
)
from anthropic.types.beta.beta_managed_agents_session_multiagent_workflows_enabled import (
    BetaManagedAgentsSessionMultiagentWorkflowsEnabled,
)
from rich.console import Console
from temporalio.service import RPCError, RPCStatusCode
from typer.testing import CliRunner

from cli.main import app
from cli.run_commands import runs_table
from corral.contract import events
from corral.contract.agent import AgentConfig, Multiagent, ThreadAgent
from corral.contract.events import ModelUsage, SessionEvent, WorkflowRunErrorObject, WorkflowRunResult
from corral.contract.plans import RunPhaseInfo, WorkflowRunInfo
from corral.contract.threads import ThreadInfo, primary_thread_id
from corral.names import ENV_MAX_THREADS_PER_RUN, ENV_MAX_WORKFLOW_RUNS_PER_SESSION
from gateway.shapes import event_view
from gateway.threads import thread_view
from tests.conftest import Stack, texts
from tests.test_api_multiagent import start_input
from tests.test_gateway import Gateway, gateway, running_gateway  # noqa: F401 - the fixture
from tests.test_threads_api import coordinator_snapshot, info
from tests.waits import until

pytestmark = pytest.mark.timeout(300)

MODEL = "claude-sonnet-4-6"
RUN_ID = "wrun_" + "a" * 32
PHASE_ID = "wrph_" + "b" * 32


# ---- on the wire, as the SDK reads it (pure) ----------------------------------------------------------------------

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
BASE = {"id": "sevt_" + "c" * 26, "position": 7, "created_at": NOW, "processed_at": NOW}
ERROR = WorkflowRunErrorObject(type="thread_limit_error", message="the plan needs 12 threads; a run may spawn 10")
USAGE = ModelUsage(input_tokens=10, output_tokens=2)
NEW_EVENTS: list[tuple[SessionEvent, type[Any]]] = [
    (events.WorkflowRunCreated(**BASE, workflow_run_id=RUN_ID, name="review", description=None,
                               phases=[events.WorkflowRunPhase(id=PHASE_ID, name="read", description="read it")]),
     sdk.BetaManagedAgentsWorkflowRunCreatedEvent),
    (events.WorkflowRunStatusRunning(**BASE, workflow_run_id=RUN_ID),
     sdk.BetaManagedAgentsWorkflowRunStatusRunningEvent),
    (events.WorkflowRunPhaseStarted(**BASE, workflow_run_id=RUN_ID, workflow_run_phase_id=PHASE_ID),
     sdk.BetaManagedAgentsWorkflowRunPhaseStartedEvent),
    (events.WorkflowRunPhaseEnded(**BASE, workflow_run_id=RUN_ID, workflow_run_phase_id=PHASE_ID,
                                  phase_started_id="sevt_" + "d" * 26),
     sdk.BetaManagedAgentsWorkflowRunPhaseEndedEvent),
    (events.WorkflowRunStatusIdle(**BASE, workflow_run_id=RUN_ID), sdk.BetaManagedAgentsWorkflowRunStatusIdleEvent),
    (events.WorkflowRunError(**BASE, workflow_run_id=RUN_ID, error=ERROR), sdk.BetaManagedAgentsWorkflowRunErrorEvent),
    (events.WorkflowRunError(**BASE, workflow_run_id=None,
                             error=WorkflowRunErrorObject(type="program_error", message="plan.phases: required")),
     sdk.BetaManagedAgentsWorkflowRunErrorEvent),
    (events.WorkflowRunStatusEnded(**BASE, workflow_run_id=RUN_ID, result=WorkflowRunResult(type="completed"),
                                   report="[task1]\nthe coordinator's reading"),
     sdk.BetaManagedAgentsWorkflowRunStatusEndedEvent),
    (events.WorkflowRunStatusEnded(**BASE, workflow_run_id=RUN_ID, result=WorkflowRunResult(type="error", error=ERROR),
                                   report=None),
     sdk.BetaManagedAgentsWorkflowRunStatusEndedEvent),
    (events.WorkflowRunStatusEnded(**BASE, workflow_run_id=RUN_ID, result=WorkflowRunResult(type="stopped")),
     sdk.BetaManagedAgentsWorkflowRunStatusEndedEvent),
    (events.UserDefineOutcome(**BASE, outcome_id="outc_" + "e" * 32, description="a haiku",
                              rubric=events.TextRubric(content="5-7-5"), max_iterations=3, client_id="mine"),
     sdk.BetaManagedAgentsUserDefineOutcomeEvent),
    (events.SpanOutcomeEvaluationStart(**BASE, outcome_id="outc_" + "e" * 32, iteration=0),
     sdk.BetaManagedAgentsSpanOutcomeEvaluationStartEvent),
    (events.SpanOutcomeEvaluationOngoing(**BASE, outcome_id="outc_" + "e" * 32, iteration=0),
     sdk.BetaManagedAgentsSpanOutcomeEvaluationOngoingEvent),
    (events.SpanOutcomeEvaluationEnd(**BASE, outcome_id="outc_" + "e" * 32, iteration=0, result="needs_revision",
                                     outcome_evaluation_start_id="sevt_" + "f" * 26, explanation="line 2 is long",
                                     usage=USAGE),
     sdk.BetaManagedAgentsSpanOutcomeEvaluationEndEvent),
]  # fmt: skip


@pytest.mark.parametrize(("event", "sdk_type"), NEW_EVENTS, ids=lambda value: getattr(value, "type", ""))
def test_each_new_event_is_the_sdks_own_type_in_a_list_and_in_the_stream(event: SessionEvent, sdk_type: Any) -> None:
    """What `events.list` and `events.stream` make of the event as the gateway shows it: the SDK picks its class by
    `type` (`construct_type`, as the client does), and the view also validates strictly, every field it needs set."""
    view = event_view(event)
    for union in (sdk.BetaManagedAgentsSessionEvent, sdk.BetaManagedAgentsStreamSessionEvents):
        parsed = construct_type(type_=union, value=view)
        assert type(parsed) is sdk_type, (event.type, type(parsed))
    strict = sdk_type.model_validate(view)
    assert strict.id == event.id and strict.type == event.type and strict.processed_at == NOW
    assert "report" not in view and "client_id" not in view, "corral's own fields stay off the wire"
    assert all(name in view for name, field in sdk_type.model_fields.items() if field.is_required())


def test_the_wire_shows_a_runs_result_not_its_report() -> None:
    ended = event_view(NEW_EVENTS[8][0])
    assert ended["result"] == {"type": "error", "error": ERROR.model_dump()}
    parsed = sdk.BetaManagedAgentsWorkflowRunStatusEndedEvent.model_validate(ended)
    assert parsed.result.type == "error" and parsed.result.error.type == "thread_limit_error"


def test_a_run_thread_shows_its_workflow_run_id() -> None:
    memo: dict[str, Any] = {"agent": coordinator_snapshot("m")}
    primary = primary_thread_id("sesn_" + "a" * 26)
    ran = info("inline", "sthr_" + "b" * 32, primary, workflow_run_id=RUN_ID)
    spawned = info("inline", "sthr_" + "c" * 32, primary)
    parsed = sdk.BetaManagedAgentsSessionThread.model_validate(thread_view(ran, memo, None))
    assert parsed.workflow_run_id == RUN_ID
    assert sdk.BetaManagedAgentsSessionThread.model_validate(thread_view(spawned, memo, None)).workflow_run_id is None


async def test_a_session_resolves_workflows_into_runs_with_the_operators_limits(stack: Stack, tmp_path: Any) -> None:
    limits = {ENV_MAX_WORKFLOW_RUNS_PER_SESSION: "3", ENV_MAX_THREADS_PER_RUN: "4"}
    async with running_gateway(stack, tmp_path, **limits) as served:
        client = await served.client("runs-resolve")
        environment = await client.beta.environments.create(name="plain")
        checker = await client.beta.agents.create(name="checker", model=MODEL, system="check twice")
        clash: Any = [{"type": "custom", "name": "start_workflow_run", "input_schema": {"type": "object"}}]
        with pytest.raises(anthropic.BadRequestError, match=r"tools\[0\]\.name: 'start_workflow_run' is reserved"):
            await client.beta.agents.create(name="bad", model=MODEL, tools=clash,
                                            multiagent={"type": "multiagent_20261001"})  # fmt: skip
        lead = await client.beta.agents.create(
            name="lead", model=MODEL,
            multiagent={"type": "multiagent_20261001", "subagents": {"type": "disabled"},
                        "workflows": {"type": "enabled", "inline_agents": {"type": "disabled"},
                                      "predefined_agents": [checker.id, {"type": "self"}]}},
        )  # fmt: skip
        await client.beta.agents.update(checker.id, version=1, system="changed after the lead pinned it")
        session = await client.beta.sessions.create(agent=lead.id, environment_id=environment.id)
        stack.started.append(stack.client.get_workflow_handle(session.id))

        shown = session.agent.multiagent
        assert isinstance(shown, BetaManagedAgentsSessionMultiagent20261001)
        assert isinstance(shown.workflows, BetaManagedAgentsSessionMultiagentWorkflowsEnabled)
        assert shown.subagents.type == "disabled"
        first, itself = shown.workflows.predefined_agents
        assert (first.id, first.version, first.system) == (checker.id, 1, "check twice"), "a full pinned snapshot"
        assert (itself.id, itself.system) == (lead.id, None)

        started = (await start_input(stack, session.id)).agent.multiagent
        assert started is not None
        assert (started.runs, started.run_inline_agents, started.max_runs, started.max_threads_per_run) == (
            True, False, 3, 4)  # fmt: skip
        agent, own = started.run_agents
        assert (agent.type, agent.id, agent.version, own.type) == ("agent", checker.id, 1, "self")
        assert agent.config is not None and agent.config.system == "check twice"
        assert (started.subagents, started.agents) == (False, [])
        assert [tool.name for tool in started.tools()] == ["wait_for_threads", "start_workflow_run"]

        defaults = await client.beta.agents.create(name="defaults", model=MODEL,
                                                   multiagent={"type": "multiagent_20261001"})  # fmt: skip
        session = await client.beta.sessions.create(agent=defaults.id, environment_id=environment.id)
        stack.started.append(stack.client.get_workflow_handle(session.id))
        started = (await start_input(stack, session.id)).agent.multiagent
        assert started is not None
        assert (started.runs, started.run_inline_agents, started.run_agents) == (True, True, []), "enabled by default"

        coordinator: Any = {"type": "coordinator", "agents": [checker.id]}
        roster = await client.beta.agents.create(name="roster", model=MODEL, multiagent=coordinator)
        session = await client.beta.sessions.create(agent=roster.id, environment_id=environment.id)
        stack.started.append(stack.client.get_workflow_handle(session.id))
        started = (await start_input(stack, session.id)).agent.multiagent
        assert started is not None
        assert (started.runs, started.run_agents) == (False, []), "the coordinator form starts no workflow runs"
        assert "start_workflow_run" not in [tool.name for tool in started.tools()]


def test_a_session_needs_the_sandbox_when_only_a_run_agent_has_its_tools() -> None:
    toolset = AgentConfig.model_validate({"model": MODEL, "tools": [{"type": "agent_toolset_20260401"}]})
    coder = ThreadAgent(type="agent", id="agent_" + "1" * 26, version=1, config=toolset)
    lead = AgentConfig(model=MODEL, multiagent=Multiagent(subagents=False, runs=True, run_agents=[coder]))
    assert lead.uses_sandbox(), "a run's task may run the coder, whose tools run in the session's sandbox"
    assert not lead.model_copy(update={"multiagent": Multiagent(runs=True)}).uses_sandbox()


# ---- corral runs --------------------------------------------------------------------------------------------------


def test_the_runs_table_shows_each_runs_status_progress_and_result() -> None:
    phases = [RunPhaseInfo(id=PHASE_ID, name="read", status="ended"), RunPhaseInfo(id="wrph_" + "9" * 32, name="sum")]
    ended = [phase.model_copy(update={"status": "ended"}) for phase in phases]
    runs = [
        WorkflowRunInfo(id=RUN_ID, name="review", phases=phases, created_at=NOW),
        WorkflowRunInfo(id="wrun_" + "1" * 32, name="summary", status="ended", phases=ended, created_at=NOW,
                        result=WorkflowRunResult(type="completed"), ended_at=NOW + timedelta(minutes=2)),
        WorkflowRunInfo(id="wrun_" + "2" * 32, name="too big\x1b[31m", status="ended", phases=phases[1:],
                        created_at=NOW, result=WorkflowRunResult(type="error", error=ERROR)),
    ]  # fmt: skip
    console = Console(file=io.StringIO(), width=400, record=True, color_system=None)
    console.print(runs_table(runs))
    lines = console.export_text().splitlines()
    rows = {line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:-1]] for line in lines[3:-1]}
    assert rows[RUN_ID][:4] == ["review", "running", "1/2 phases", ""]
    assert rows["wrun_" + "1" * 32][:4] == ["summary", "ended", "2/2 phases", "completed"]
    assert rows["wrun_" + "2" * 32][:4] == [
        "too big\\x1b[31m",
        "ended",
        "0/1 phases",
        f"error: thread_limit_error: {ERROR.message}",
    ]


def test_corral_runs_refuses_a_thread_or_a_run_where_the_session_belongs(tmp_path: Path) -> None:
    runner = CliRunner()
    for given, kind in (("sthr_" + "0" * 32, "thread"), (RUN_ID, "workflow run")):
        result = runner.invoke(app, ["--state-dir", str(tmp_path), "--address", "127.0.0.1:1", "runs", given])
        assert result.exit_code == 2, result.output
        assert f"{given} is a {kind} id, not a session id" in result.output and "Traceback" not in result.output


async def corral(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` against the test's Temporal, as a terminal 200 columns wide would show it."""
    address = stack.client.service_client.config.target_host
    command = [sys.executable, "-m", "cli.main", "--address", address, *args]
    env = {**os.environ, "COLUMNS": "200"}
    return await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=120, env=env)


async def test_corral_runs_says_there_is_no_such_session(stack: Stack) -> None:
    missing = "sesn_" + "0" * 26
    ran = await corral(stack, "runs", missing)
    assert ran.returncode == 1 and f"no session {missing}" in ran.stderr and "Traceback" not in ran.stderr, ran


# ---- runs, end to end ---------------------------------------------------------------------------------------------

RUN_EVENT_TYPES = {
    "workflow_run.created": sdk.BetaManagedAgentsWorkflowRunCreatedEvent,
    "workflow_run.status_running": sdk.BetaManagedAgentsWorkflowRunStatusRunningEvent,
    "workflow_run.phase_started": sdk.BetaManagedAgentsWorkflowRunPhaseStartedEvent,
    "workflow_run.phase_ended": sdk.BetaManagedAgentsWorkflowRunPhaseEndedEvent,
    "workflow_run.status_idle": sdk.BetaManagedAgentsWorkflowRunStatusIdleEvent,
    "workflow_run.error": sdk.BetaManagedAgentsWorkflowRunErrorEvent,
    "workflow_run.status_ended": sdk.BetaManagedAgentsWorkflowRunStatusEndedEvent,
}
HELLO = {"type": "user.message", "content": [{"type": "text", "text": "review the three parts"}]}


def plan(*phases: tuple[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {"name": "review", "phases": [{"name": name, "tasks": tasks} for name, tasks in phases]}


async def session_of(stack: Stack, client: Any, lead_steps: list[dict[str, Any]]) -> Any:
    """A session of a coordinator scripted by `lead_steps` whose workflows may run `reader` (a saved agent that
    answers each message with the message); `HELLO` starts it."""
    environment = await client.beta.environments.create(name="plain")
    reader = await client.beta.agents.create(name="reader", model=stack.script([{"text": "read:", "echo_last_user":
                                                                                 True}], loop=True))  # fmt: skip
    config: Any = {"type": "multiagent_20261001", "subagents": {"type": "disabled"},
                   "workflows": {"type": "enabled", "predefined_agents": [reader.id]}}  # fmt: skip
    lead = await client.beta.agents.create(name="lead", model=stack.script(lead_steps), multiagent=config)
    session = await client.beta.sessions.create(agent=lead.id, environment_id=environment.id)
    stack.started.append(stack.client.get_workflow_handle(session.id))
    return session


async def hello(client: Any, session: Any) -> None:
    await client.beta.sessions.events.send(session.id, events=[HELLO])


async def listed(client: Any, session_id: str) -> list[Any]:
    return [event async for event in client.beta.sessions.events.list(session_id)]


async def until_listed(client: Any, session_id: str, wanted: str, what: str) -> list[Any]:
    """The session's events once one of type `wanted` is among them."""
    seen: list[Any] = []

    async def there() -> bool:
        seen[:] = await listed(client, session_id)
        return any(event.type == wanted for event in seen)

    await until(there, what, within=180)
    return seen


def run_events(events: list[Any]) -> list[Any]:
    found = [event for event in events if event.type.startswith("workflow_run.")]
    for event in found:
        assert type(event) is RUN_EVENT_TYPES[event.type], "the SDK reads each in its own class"
    return found


async def test_a_run_of_two_phases_fans_out_three_threads_then_one_and_reports_to_the_coordinator(
    stack: Stack,
    gateway: Gateway,  # noqa: F811
) -> None:
    client = await gateway.client("runs-e2e")
    reads = [{"name": part, "agent": "reader", "message": f"read part {part}"} for part in ("a", "b", "c")]
    summing = [{"name": "all", "agent": "reader", "message": "sum up:\n{{read}}"}]
    start = {"name": "start_workflow_run", "input": plan(("read", reads), ("sum", summing))}
    lead_steps: list[dict[str, Any]] = [
        {"tool_uses": [start]},
        {"text": "the run is on"},
        {"text": "the run reports:", "echo_last_user": True},
    ]
    session = await session_of(stack, client, lead_steps)
    stream = await client.beta.sessions.events.stream(session.id)  # open before anything of the run is written
    await hello(client, session)
    events = await until_listed(client, session.id, "workflow_run.status_ended", "the run's end")
    runs = run_events(events)
    assert [event.type for event in runs] == [
        "workflow_run.created", "workflow_run.status_running",
        "workflow_run.phase_started", "workflow_run.phase_ended",
        "workflow_run.phase_started", "workflow_run.phase_ended",
        "workflow_run.status_idle", "workflow_run.status_ended",
    ]  # fmt: skip
    created, _, read_started, read_ended, sum_started, sum_ended, _, ended = runs
    run_id = created.workflow_run_id
    assert run_id.startswith("wrun_") and all(event.workflow_run_id == run_id for event in runs)
    assert (created.name, [phase.name for phase in created.phases]) == ("review", ["read", "sum"])
    read_id, sum_id = (phase.id for phase in created.phases)
    assert (read_started.workflow_run_phase_id, read_ended.workflow_run_phase_id) == (read_id, read_id)
    assert (sum_started.workflow_run_phase_id, sum_ended.workflow_run_phase_id) == (sum_id, sum_id)
    assert (read_ended.phase_started_id, sum_ended.phase_started_id) == (read_started.id, sum_started.id)
    assert ended.result.type == "completed"
    raw = await client.beta.sessions.events.with_raw_response.list(session.id, limit=1000)
    [wire] = [event for event in raw.http_response.json()["data"] if event["type"] == "workflow_run.status_ended"]
    assert set(wire) == {"type", "id", "processed_at", "created_at", "position", "workflow_run_id", "result"}, wire

    def spawned_between(first: Any, last: Any) -> list[Any]:
        at = [event.id for event in events]
        return [event for event in events[at.index(first.id) : at.index(last.id)]
                if event.type == "session.thread_created"]  # fmt: skip

    read_threads, sum_threads = spawned_between(read_started, read_ended), spawned_between(sum_started, sum_ended)
    assert (len(read_threads), len(sum_threads)) == (3, 1), "three threads at once, then one"
    assert all(event.workflow_run_id == run_id for event in [*read_threads, *sum_threads])

    threads = [thread async for thread in client.beta.sessions.threads.list(session.id)]
    by_run = {thread.id: thread.workflow_run_id for thread in threads}
    assert by_run == {
        threads[0].id: None,
        **{event.session_thread_id: run_id for event in [*read_threads, *sum_threads]},
    }, "the primary thread, then the run's four, each with its run's id"
    [summer] = sum_threads
    summed: list[Any] = [e async for e in client.beta.sessions.threads.events.list(summer.session_thread_id,
                                                                          session_id=session.id)]  # fmt: skip
    said = " ".join(texts(summed))
    assert all(f"read part {part}" in said for part in ("a", "b", "c")), "phase 2 took phase 1's replies: " + said

    async def reported() -> bool:
        return any("the run reports:" in text for text in texts(await listed(client, session.id)))

    await until(reported, "the coordinator's turn on the run's report", within=120)

    streamed: list[Any] = []
    async for event in stream:
        streamed.append(event)
        if event.type == "workflow_run.status_ended":
            break
    await stream.close()
    assert [event.id for event in run_events(streamed)] == [event.id for event in runs], "the stream, in order"

    shown = await corral(stack, "runs", session.id, "--json")
    assert shown.returncode == 0, shown.stderr
    [info] = [WorkflowRunInfo.model_validate_json(line) for line in shown.stdout.splitlines()]
    assert (info.id, info.name, info.status, info.progress()) == (run_id, "review", "ended", "2/2 phases")
    assert info.result is not None and info.result.type == "completed"
    table = await corral(stack, "runs", session.id)
    assert table.returncode == 0 and run_id in table.stdout and "2/2 phases" in table.stdout, table.stdout
    listed_threads = await corral(stack, "threads", session.id, "--json")
    infos = [ThreadInfo.model_validate_json(line) for line in listed_threads.stdout.splitlines()]
    assert sorted(thread.workflow_run_id or "" for thread in infos) == ["", *[run_id] * 4]

    # Deleting the session deletes its children too: the run's workflow and its threads' logs.
    await client.beta.sessions.delete(session.id)
    for child in [run_id, *(thread.id for thread in infos)]:
        with pytest.raises(RPCError) as gone:
            await stack.client.get_workflow_handle(child).describe()
        assert gone.value.status == RPCStatusCode.NOT_FOUND, child


async def test_a_malformed_plan_is_a_program_error_the_model_reads_and_no_run(
    stack: Stack,
    gateway: Gateway,  # noqa: F811
) -> None:
    client = await gateway.client("runs-malformed")
    later = [{"agent": "reader", "message": "use {{sum}}"}]
    start = {"name": "start_workflow_run", "input": plan(("read", later), ("sum", [{"agent": "nobody",
                                                                                    "message": "m"}]))}  # fmt: skip
    session = await session_of(stack, client, [{"tool_uses": [start]}, {"text": "I see:", "echo_last_user": True}])
    await hello(client, session)
    events = await until_listed(client, session.id, "workflow_run.error", "the plan's error")
    [error] = run_events(events)
    assert (error.workflow_run_id, error.error.type) == (None, "program_error")
    assert "{{sum}} names no earlier phase" in error.error.message and "'nobody'" in error.error.message

    async def answered() -> bool:
        return any("I see:" in text for text in texts(await listed(client, session.id)))

    await until(answered, "the coordinator's turn on the tool's error")
    results = [e for e in await listed(client, session.id) if e.type == "agent.tool_result"]
    assert results and results[-1].is_error, "the tool's result is an error the model reads"
    threads = [thread async for thread in client.beta.sessions.threads.list(session.id)]
    assert [thread.parent_thread_id for thread in threads] == [None], "no run, so no thread: the primary alone"
    none = await corral(stack, "runs", session.id)
    assert none.returncode == 1 and f"session {session.id} has started no workflow runs" in none.stderr, none


async def test_a_run_over_its_thread_limit_is_created_and_ends_with_a_thread_limit_error(
    stack: Stack, tmp_path: Path
) -> None:
    async with running_gateway(stack, tmp_path, **{ENV_MAX_THREADS_PER_RUN: "2"}) as served:
        client = await served.client("runs-limit")
        reads = [{"agent": "reader", "message": f"read part {part}"} for part in ("a", "b", "c")]
        start = {"name": "start_workflow_run", "input": plan(("read", reads))}
        session = await session_of(
            stack, client, [{"tool_uses": [start]}, {"text": "noted"}, {"text": "the run ended"}]
        )
        await hello(client, session)
        events = await until_listed(client, session.id, "workflow_run.status_ended", "the run's end")
        runs = run_events(events)
        assert [event.type for event in runs] == [
            "workflow_run.created",
            "workflow_run.status_running",
            "workflow_run.error",
            "workflow_run.status_ended",
        ]
        created, _, error, ended = runs
        assert error.workflow_run_id == created.workflow_run_id and error.error.type == "thread_limit_error"
        assert ended.result.type == "error" and ended.result.error.type == "thread_limit_error"
        assert not [event for event in events if event.type == "session.thread_created"], "no thread spawned"


async def test_the_operators_run_limit_refuses_a_sessions_second_run(stack: Stack, tmp_path: Path) -> None:
    async with running_gateway(stack, tmp_path, **{ENV_MAX_WORKFLOW_RUNS_PER_SESSION: "1"}) as served:
        client = await served.client("runs-max")
        reads = [{"agent": "reader", "message": "read part a"}]
        start = {"name": "start_workflow_run", "input": plan(("read", reads))}
        session = await session_of(
            stack, client, [{"tool_uses": [start, start]}, {"text": "noted"}, {"text": "the run ended"}]
        )
        await hello(client, session)

        async def both() -> bool:
            kinds = [event.type for event in await listed(client, session.id)]
            return "workflow_run.status_ended" in kinds and "workflow_run.error" in kinds

        await until(both, "the first run's end and the second's refusal", within=180)
        runs = run_events(await listed(client, session.id))
        created = [event for event in runs if event.type == "workflow_run.created"]
        [refused] = [event for event in runs if event.type == "workflow_run.error"]
        assert len(created) == 1, "one run, the session's limit"
        assert (refused.workflow_run_id, refused.error.type) == (None, "max_workflow_runs_error")
        ended = [event for event in runs if event.type == "workflow_run.status_ended"]
        assert [event.result.type for event in ended] == ["completed"]
