"""Workflow runs from a Temporal client: a coordinator's plan of phases runs as a child workflow of its session, its
tasks as session threads; the run's events land on the session's log in order, and its report reaches the
coordinator. Malformed plans, limits and interrupts each end in their typed error. The model is the offline scripted
server."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError

from corral.client import read_events, send_events, wait_for_idle
from corral.contract.events import (
    SessionEvent,
    SessionThreadCreated,
    WorkflowRunCreated,
    WorkflowRunError,
    WorkflowRunPhaseEnded,
    WorkflowRunPhaseStarted,
    WorkflowRunResult,
    WorkflowRunStatusEnded,
)
from corral.contract.plans import Plan, WorkflowRunInfo
from corral.contract.threads import ThreadInfo
from corral.names import (
    NO_WORKFLOW_RUNS,
    QUERY_THREADS,
    QUERY_WORKFLOW_RUNS,
    SIGNAL_RUN_REPORT,
    UPDATE_START_WORKFLOW_RUN,
)
from tests.conftest import Stack, assert_log_is_whole, texts
from tests.test_threads import coordinator, roster_agent
from tests.waits import until

pytestmark = pytest.mark.timeout(300)

RUN_EVENTS = ("workflow_run.", "session.thread_created")
WAIT = {"name": "wait_for_threads", "input": {}}


def runs_agent(lead: str, run_agents: list[dict[str, Any]], **multiagent: Any) -> dict[str, Any]:
    """A coordinator that may start workflow runs of `run_agents` (and spawns no threads itself)."""
    return coordinator(lead, [], subagents=False, runs=True, run_agents=run_agents, **multiagent)


def start_run(plan: dict[str, Any]) -> dict[str, Any]:
    return {"name": "start_workflow_run", "input": plan}


def task(agent: str, message: str, name: str | None = None) -> dict[str, Any]:
    return {"agent": agent, "message": message, **({"name": name} if name else {})}


async def runs_of(handle: WorkflowHandle) -> list[WorkflowRunInfo]:
    return await handle.query(QUERY_WORKFLOW_RUNS, result_type=list[WorkflowRunInfo])


async def until_ended(handle: WorkflowHandle) -> list[SessionEvent]:
    async def ended() -> bool:
        return any(isinstance(e, WorkflowRunStatusEnded) for e in await read_events(handle))

    await until(ended, "the run's workflow_run.status_ended on the session's log", 180)
    return await read_events(handle)


def run_trail(events: list[SessionEvent]) -> list[str]:
    return [e.type for e in events if e.type.startswith(RUN_EVENTS)]


async def test_a_run_of_two_phases_fans_out_then_in_and_reports_to_the_coordinator(stack: Stack) -> None:
    workers = {name: stack.script([{"text": f"{name} found {n}"}]) for n, name in enumerate(("alpha", "beta", "gamma"))}
    writer = stack.script([{"text": "the final report"}])
    plan = {
        "name": "survey",
        "phases": [
            {"name": "gather", "tasks": [task(name, f"look at part {name}", name) for name in workers]},
            {"name": "write", "tasks": [task("writer", "Sum up:\n{{gather}}")]},
        ],
    }
    lead = stack.script([{"tool_uses": [start_run(plan)]}, {"tool_uses": [WAIT]}, {"text": "Read the report."}])
    roster = [*(roster_agent(name, model, []) for name, model in workers.items()), roster_agent("writer", writer, [])]
    handle = await stack.start(lead, "survey everything", agent=runs_agent(lead, roster))

    events = await until_ended(handle)
    await until(lambda: _said(handle, "Read the report."), "the coordinator's turn on the run's report")
    events = await read_events(handle)
    assert_log_is_whole(events)
    assert run_trail(events) == [
        "workflow_run.created",
        "workflow_run.status_running",
        "workflow_run.phase_started",
        "session.thread_created",
        "session.thread_created",
        "session.thread_created",
        "workflow_run.phase_ended",
        "workflow_run.phase_started",
        "session.thread_created",
        "workflow_run.phase_ended",
        "workflow_run.status_idle",
        "workflow_run.status_ended",
    ]
    (created,) = [e for e in events if isinstance(e, WorkflowRunCreated)]
    run_id = created.workflow_run_id
    assert run_id.startswith("wrun_") and [p.name for p in created.phases] == ["gather", "write"]
    assert all(p.id.startswith("wrph_") for p in created.phases)
    assert all(getattr(e, "workflow_run_id", run_id) == run_id for e in events if e.type.startswith(RUN_EVENTS))
    started = [e for e in events if isinstance(e, WorkflowRunPhaseStarted)]
    ended_phases = [e for e in events if isinstance(e, WorkflowRunPhaseEnded)]
    assert [e.workflow_run_phase_id for e in started] == [p.id for p in created.phases]
    assert [e.phase_started_id for e in ended_phases] == [e.id for e in started]
    spawned = [e for e in events if isinstance(e, SessionThreadCreated)]
    assert sorted(e.agent_name or "" for e in spawned[:3]) == ["alpha", "beta", "gamma"]
    assert spawned[3].agent_name == "writer"
    (ended,) = [e for e in events if isinstance(e, WorkflowRunStatusEnded)]
    assert ended.result.type == "completed" and ended.report is not None and "the final report" in ended.report

    # The second phase's thread got every reply of the first.
    (asked,) = stack.requests(writer)
    shown = str(asked["body"]["messages"])
    assert all(f"{name} found {n}" in shown for n, name in enumerate(workers)), shown
    # The coordinator waited for the run, then read its report; no thread of the run replied to it.
    assert texts(events, "agent.tool_result")[-1] == f"Replies from {run_id} follow this result."
    last = str(stack.requests(lead)[-1]["body"]["messages"])
    assert f"Workflow run {run_id} ended (completed)" in last and "the final report" in last
    assert texts(events, "agent.thread_message_received") == [], "a run's threads answer the run, not the coordinator"

    threads = (await handle.query(QUERY_THREADS, result_type=list[ThreadInfo]))[1:]
    assert sorted(t.id for t in threads) == sorted(e.session_thread_id for e in spawned)
    assert all(t.workflow_run_id == run_id for t in threads)
    (info,) = await runs_of(handle)
    assert (info.id, info.status, info.progress()) == (run_id, "ended", "2/2 phases")
    assert info.result is not None and info.result.type == "completed"
    run = stack.client.get_workflow_handle(run_id)
    described = await run.describe()
    assert described.parent_id == handle.id, "the Web UI shows the run as the session's child workflow"
    assert await described.static_summary() == f"workflow run survey of {handle.id}"
    assert described.status is not None and described.status.name == "COMPLETED"
    metadata = await run.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert metadata.current_details.splitlines() == ["1. gather: ended (3/3 replied)", "2. write: ended (1/1 replied)"]


async def _said(handle: WorkflowHandle, text: str) -> bool:
    return text in texts(await read_events(handle))


async def test_a_malformed_plan_is_a_program_error_the_model_reads(stack: Stack) -> None:
    worker = stack.script([{"text": "ok"}])
    bad = {"name": "broken", "phases": [{"name": "one", "tasks": [task("nobody", "go"), task("worker", "{{later}}")]}]}
    lead = stack.script([{"tool_uses": [start_run(bad)]}, {"text": "I will fix the plan."}])
    handle = await stack.start(lead, "go", agent=runs_agent(lead, [roster_agent("worker", worker, [])]))
    events = await wait_for_idle(handle)
    (error,) = [e for e in events if isinstance(e, WorkflowRunError)]
    assert error.workflow_run_id is None and error.error.type == "program_error"
    assert "'nobody'" in error.error.message and "{{later}}" in error.error.message
    (result,) = [e for e in events if e.type == "agent.tool_result"]
    assert result.is_error and error.error.message in texts([result], "agent.tool_result")[0]
    assert not [e for e in events if e.type.startswith("workflow_run.") and e.type != "workflow_run.error"]
    assert await runs_of(handle) == []


async def test_limits_refuse_runs_with_their_typed_errors(stack: Stack) -> None:
    worker = stack.script([{"text": "ok"}])
    wide = {"name": "wide", "phases": [{"name": "all", "tasks": [task("worker", f"part {n}") for n in range(3)]}]}
    small = {"name": "small", "phases": [{"name": "one", "tasks": [task("worker", "go")]}]}
    lead = stack.script([
        {"tool_uses": [start_run(wide)]},
        {"tool_uses": [start_run(small)]},
        {"text": "Tried both."},
        {"text": "Read a report."},
        {"text": "Read another report."},
    ])  # fmt: skip
    agent = runs_agent(lead, [roster_agent("worker", worker, [])], max_runs=1, max_threads_per_run=2)
    handle = await stack.start(lead, "go", agent=agent)
    events = await until_ended(handle)
    errors = [e for e in events if isinstance(e, WorkflowRunError)]
    # The refusal is written in the coordinator's turn, the run's error when the run reports it: either first.
    assert sorted((e.error.type, e.workflow_run_id is None) for e in errors) == [
        ("max_workflow_runs_error", True),
        ("thread_limit_error", False),
    ]
    (limited,) = [e for e in errors if e.error.type == "thread_limit_error"]
    assert run_trail([e for e in events if getattr(e, "workflow_run_id", None) == limited.workflow_run_id]) == [
        "workflow_run.created",
        "workflow_run.status_running",
        "workflow_run.error",
        "workflow_run.status_ended",
    ], "a run over its thread limit is created, and fails at once"
    (ended,) = [e for e in events if isinstance(e, WorkflowRunStatusEnded)]
    assert ended.result.type == "error" and ended.result.error is not None
    assert ended.result.error.type == "thread_limit_error"
    results = [e for e in events if e.type == "agent.tool_result"]
    assert [r.is_error for r in results] == [False, True]
    assert (
        texts(events, "agent.tool_result")[1]
        == "start_workflow_run: this session has started 1 workflow runs, its limit"
    )
    assert [e for e in events if isinstance(e, SessionThreadCreated)] == [], "no thread was spawned"


async def test_an_interrupt_of_the_session_stops_a_running_run(stack: Stack) -> None:
    sleeper = stack.script([{"tool_uses": [{"name": "sleep", "input": {"seconds": 120}}]}, {"text": "up"}])
    plan = {"name": "nap", "phases": [{"name": "sleep", "tasks": [task("sleeper", "nap")]},
                                      {"name": "after", "tasks": [task("sleeper", "{{sleep}}")]}]}  # fmt: skip
    lead = stack.script([{"tool_uses": [start_run(plan)]}, {"text": "Started."}, {"text": "It stopped."}])
    roster = [roster_agent("sleeper", sleeper, [stack.hand_tool("sleep")])]
    handle = await stack.start(lead, "go", agent=runs_agent(lead, roster))

    async def sleeping() -> bool:  # a thread's calls are cross-posted to the session's log
        return any(e.type == "agent.tool_use" and e.session_thread_id for e in await read_events(handle))

    await until(sleeping, "the run's thread at work")
    await send_events(handle, [{"type": "user.interrupt"}])
    events = await until_ended(handle)
    (ended,) = [e for e in events if isinstance(e, WorkflowRunStatusEnded)]
    assert ended.result.type == "stopped" and ended.result.error is None
    assert [e for e in events if isinstance(e, WorkflowRunError)] == [], "a stop is no error"
    assert run_trail(events)[-2:] == ["workflow_run.phase_ended", "workflow_run.status_ended"]
    assert len([e for e in events if isinstance(e, WorkflowRunPhaseStarted)]) == 1, "no phase after the stop"
    (info,) = await runs_of(handle)
    assert info.status == "ended" and info.progress() == "1/2 phases"
    described = await stack.client.get_workflow_handle(ended.workflow_run_id).describe()
    assert described.status is not None and described.status.name == "COMPLETED"
    # The run's end is input to the coordinator, idle since the interrupt: it starts a turn.
    await until(lambda: _said(handle, "It stopped."), "the coordinator's turn on the stopped run")
    assert f"Workflow run {ended.workflow_run_id} ended (stopped)" in str(stack.requests(lead)[-1]["body"]["messages"])


async def test_a_temporal_client_starts_a_run_by_update_and_waits_for_it(stack: Stack) -> None:
    worker = stack.script([{"text": "done by the worker"}])
    lead = stack.script([{"text": "Saw the report."}])
    handle = await stack.start(lead, agent=runs_agent(lead, [roster_agent("worker", worker, [])]))
    plan = Plan.model_validate({"name": "by update", "phases": [{"name": "one", "tasks": [task("worker", "go")]}]})
    info = await handle.execute_update(UPDATE_START_WORKFLOW_RUN, plan, result_type=WorkflowRunInfo)
    assert info.id.startswith("wrun_") and info.status == "running"
    bad = Plan.model_validate({"name": "bad", "phases": [{"name": "one", "tasks": [task("nobody", "go")]}]})
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(UPDATE_START_WORKFLOW_RUN, bad)
    assert "nobody" in str(refused.value.cause)
    events = await until_ended(handle)
    assert [e.type for e in events if e.type == "workflow_run.error"] == [], "a refused update writes nothing"
    # The run's end started a turn of the idle coordinator, which read the report.
    events = await wait_for_idle(handle)
    assert texts(events) == ["Saw the report."]
    (asked,) = stack.requests(lead)
    assert f"Workflow run {info.id} ended (completed)" in str(asked["body"]["messages"])
    assert "done by the worker" in str(asked["body"]["messages"])

    plain = await stack.start(lead, agent={"model": lead})
    with pytest.raises(WorkflowUpdateFailedError) as no_runs:
        await plain.execute_update(UPDATE_START_WORKFLOW_RUN, plan)
    assert getattr(no_runs.value.cause, "type", None) == NO_WORKFLOW_RUNS


async def test_a_run_and_its_session_continue_as_new(stack: Stack) -> None:
    echo = stack.hand_tool("echo", text={"type": "string"})
    rounds = [{"tool_uses": [{"name": "echo", "input": {"text": str(n)}}]} for n in range(40)]
    workers = [stack.script([*rounds, {"text": f"{name} did 40"}]) for name in ("one", "two")]
    plan = {"name": "long", "phases": [{"name": "work", "tasks": [task("one", "go"), task("two", "go")]},
                                       {"name": "sum", "tasks": [task("one", "{{work}}")]}]}  # fmt: skip
    lead = stack.script([{"tool_uses": [start_run(plan)]}, {"text": "Started."}, {"text": "Read it."}])
    roster = [roster_agent("one", workers[0], [echo]), roster_agent("two", workers[1], [echo])]
    handle = await stack.start(lead, "go", agent=runs_agent(lead, roster), continue_as_new_after_events=200)

    events = await until_ended(handle)
    await until(lambda: _said(handle, "Read it."), "the coordinator's turn on the run's report", 120)
    events = await read_events(handle)
    assert_log_is_whole(events)
    (ended,) = [e for e in events if isinstance(e, WorkflowRunStatusEnded)]
    assert ended.result.type == "completed" and ended.report is not None and "one did 40" in ended.report
    assert run_trail(events).count("session.thread_created") == 3, "no thread spawned twice across hand-overs"
    (info,) = await runs_of(handle)
    assert info.status == "ended" and info.progress() == "2/2 phases", "the run's state crossed the hand-overs"
    reports = []  # the run's reports reached more than one run of the session: it handed over mid-run
    async for execution in stack.client.list_workflows(f"WorkflowId = '{handle.id}'"):
        history = await stack.client.get_workflow_handle(handle.id, run_id=execution.run_id).fetch_history()
        signals = [e.workflow_execution_signaled_event_attributes.signal_name for e in history.events]
        reports.append(signals.count(SIGNAL_RUN_REPORT))
    assert len([count for count in reports if count]) > 1, reports


async def test_a_run_past_its_deadline_and_a_thread_with_no_reply_fail_with_their_types(stack: Stack) -> None:
    sleeper = stack.script([{"tool_uses": [{"name": "sleep", "input": {"seconds": 120}}]}, {"text": "up"}])
    broken = stack.script([{"fail": [{"status": 401, "type": "authentication_error"}]}])
    slow = {"name": "slow", "timeout_seconds": 1, "phases": [{"name": "nap", "tasks": [task("sleeper", "nap")]}]}
    failing = {"name": "failing", "phases": [{"name": "try", "tasks": [task("broken", "try")]}]}
    lead = stack.script([
        {"tool_uses": [start_run(slow), start_run(failing)]}, {"text": "Started."}, {"text": "Read."}, {"text": "Read."}
    ])  # fmt: skip
    roster = [roster_agent("sleeper", sleeper, [stack.hand_tool("sleep")]), roster_agent("broken", broken, [])]
    handle = await stack.start(lead, "go", agent=runs_agent(lead, roster))

    async def both_ended() -> list[WorkflowRunStatusEnded]:
        ended = [e for e in await read_events(handle) if isinstance(e, WorkflowRunStatusEnded)]
        return ended if len(ended) == 2 else []

    await until(both_ended, "both runs' workflow_run.status_ended", 180)
    events = await read_events(handle)
    runs = {info.name: info for info in await runs_of(handle)}
    for name, error_type in (("slow", "timeout_error"), ("failing", "unknown_error")):
        run_id = runs[name].id
        mine = [e for e in events if getattr(e, "workflow_run_id", None) == run_id]
        assert run_trail(mine)[-3:] == ["workflow_run.phase_ended", "workflow_run.error", "workflow_run.status_ended"]
        (error,) = [e for e in mine if isinstance(e, WorkflowRunError)]
        (ended,) = [e for e in mine if isinstance(e, WorkflowRunStatusEnded)]
        assert error.error.type == error_type and ended.result.error == error.error, (name, error)
        assert ended.result.type == "error" and runs[name].progress() == "1/1 phases"
    # The run past its deadline interrupted its thread, still at work.
    (slow_thread,) = [e for e in events if isinstance(e, SessionThreadCreated) and e.agent_name == "sleeper"]
    await until(lambda: _thread_idle(handle, slow_thread.session_thread_id), "the late run's thread interrupted")
    thread_log = await read_events(stack.client.get_workflow_handle(slow_thread.session_thread_id))
    assert [e.type for e in thread_log if e.type in ("agent.tool_use", "agent.tool_result")] == [
        "agent.tool_use",
        "agent.tool_result",
    ]
    assert "interrupted" in texts(thread_log, "agent.tool_result")[0]


async def _thread_idle(handle: WorkflowHandle, thread_id: str) -> bool:
    threads = await handle.query(QUERY_THREADS, result_type=list[ThreadInfo])
    return any(t.id == thread_id and t.status == "idle" for t in threads)


async def test_the_sessions_end_stops_its_runs(stack: Stack) -> None:
    sleeper = stack.script([{"tool_uses": [{"name": "sleep", "input": {"seconds": 120}}]}, {"text": "up"}])
    plan = {"name": "nap", "phases": [{"name": "sleep", "tasks": [task("sleeper", "nap")]}]}
    lead = stack.script([{"tool_uses": [start_run(plan)]}, {"text": "Started."}])
    roster = [roster_agent("sleeper", sleeper, [stack.hand_tool("sleep")])]
    handle = await stack.start(lead, "go", agent=runs_agent(lead, roster))

    async def sleeping() -> bool:
        return any(e.type == "agent.tool_use" and e.session_thread_id for e in await read_events(handle))

    await until(sleeping, "the run's thread at work")
    (info,) = await runs_of(handle)
    await handle.cancel()
    run = stack.client.get_workflow_handle(info.id, result_type=WorkflowRunResult)
    result = await run.result()
    assert result == WorkflowRunResult(type="stopped"), "the session's end stopped its run"
