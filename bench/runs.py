"""What a workflow run buys: a plan of N independent tasks run as one phase (N threads at once) against the same N
tasks done one after another by one agent, on the stack `corral up` starts, measured in the same run.

The work: N tasks, each one `bash sleep S` call (default 5 tasks of 3 s). The parallel arm is a multi-agent session
whose coordinator calls `start_workflow_run` with a plan of one phase of N tasks, each naming the predefined agent
`worker`; each task's thread makes its call on the session's one sandbox and replies, the run ends, and its report
starts the coordinator's last turn, which answers. The serial arm is a session of one agent that makes the same N
calls in turn and answers. Every model turn is a script of the offline model server. Both arms start through
`corral start --input` (a SessionInput file: the run's agents are given as full snapshots, as a Temporal client
gives them); a session's wall time is read from its log, from its first `user.message` to its last
`session.status_idle` (`created_at`), once its work is done (the parallel arm: after its
`workflow_run.status_ended`). Runs alternate between the arms, after one warm-up of each (not counted); the figure
is the ratio of the medians, serial over parallel (N would be perfect overlap with no overhead).

Usage: `python -m bench.runs [--runs R] [--tasks N] [--seconds S]`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from bench import _stack
from bench._arms import time_arms
from bench._report import add_run_options, begin_run, markdown_table, median, write_results
from cli.stack import StatePaths, read_stack
from corral.client import read_events
from corral.contract.agent import AgentConfig, Multiagent, ThreadAgent
from corral.contract.coordinator import START_WORKFLOW_RUN
from corral.contract.plans import Plan, PlanPhase, PlanTask
from corral.contract.sandbox import AgentToolset20260401, ToolConfig, ToolsetDefaultConfig
from corral.contract.session import SessionInput
from corral.temporal import connect
from modelserver import Script, ScriptStep
from modelserver.scripts import ToolUseSpec

BASH_ONLY = AgentToolset20260401(
    default_config=ToolsetDefaultConfig(enabled=False), configs=[ToolConfig(name="bash", enabled=True)]
)
DONE_TYPES = ["workflow_run.status_ended", "session.status_idle"]


def plan(tasks: int) -> Plan:
    """One phase of `tasks` tasks, each a thread of the predefined agent `worker`."""
    work = [PlanTask(name=f"t{index}", agent="worker", message="Run your sleep.") for index in range(1, tasks + 1)]
    return Plan(name="bench", phases=[PlanPhase(name="work", tasks=work)])


def scripts(tasks: int, seconds: float) -> dict[str, Script]:
    """The worker (one sleep, then a reply), the coordinator (start the run, end its turn, then answer the run's
    report) and the lone agent (N sleeps, then an answer)."""
    sleep = ScriptStep(tool_uses=[ToolUseSpec(name="bash", input={"command": f"sleep {seconds:g}"})])
    start = ToolUseSpec(name=START_WORKFLOW_RUN, input=plan(tasks).model_dump(mode="json", exclude_none=True))
    return {
        "bench-runs-worker": Script(steps=[sleep, ScriptStep(text="done")]),
        "bench-runs-coordinator": Script(
            steps=[ScriptStep(tool_uses=[start]), ScriptStep(text="run started"), ScriptStep(text="run finished")]
        ),
        "bench-runs-serial": Script(steps=[sleep] * tasks + [ScriptStep(text="done")]),
    }


def session_inputs(tasks: int) -> dict[str, SessionInput]:
    worker = AgentConfig(name="worker", model="script:bench-runs-worker", tools=[BASH_ONLY])
    coordinator = AgentConfig(
        name="coordinator",
        model="script:bench-runs-coordinator",
        multiagent=Multiagent(
            type="multiagent_20261001",
            runs=True,
            run_agents=[ThreadAgent(config=worker)],
            max_threads=max(16, tasks),
            max_threads_per_run=max(10, tasks),
        ),
    )
    serial = AgentConfig(name="serial", model="script:bench-runs-serial", tools=[BASH_ONLY])
    message = f"{tasks} sleeps"
    return {
        "parallel": SessionInput(agent=coordinator, message=message, title="bench runs: parallel"),
        "serial": SessionInput(agent=serial, message=message, title="bench runs: serial"),
    }


def check(arm: str, events: list[dict[str, Any]], tasks: int) -> None:
    """A run that did not do all its work measures nothing: every bash call made (the serial arm's without error; a
    thread's result stays on its own log), the run completed."""
    if arm == "parallel":
        made = [e for e in events if e["type"] == "agent.tool_use" and e.get("session_thread_id")]
        ended = [e for e in events if e["type"] == "workflow_run.status_ended"]
        if len(made) != tasks or len(ended) != 1 or ended[0]["result"]["type"] != "completed":
            raise RuntimeError(f"parallel: {len(made)} thread bash calls, not {tasks}, or the run did not complete: "
                               f"{ended}")  # fmt: skip
    else:
        results = [e for e in events if e["type"] == "agent.tool_result"]
        errors = [e["content"] for e in results if e.get("is_error")]
        if len(results) != tasks or errors:
            raise RuntimeError(f"serial: {len(results)} bash results, not {tasks}, or errors: {errors}")


async def until_done(stack: _stack.Stack, session_id: str, arm: str, timeout: float = 600) -> None:
    """Until the session is idle with its work done: its last event a `session.status_idle`, after the run's end
    in the parallel arm. Read through the `events` query (the figure itself comes from the log's timestamps)."""
    config = read_stack(StatePaths(stack.state_dir))
    if config is None:
        raise RuntimeError(f"no stack recorded in {stack.state_dir}")
    client = await connect(config.temporal_address, config.namespace)
    handle = client.get_workflow_handle(session_id)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        types = [e.type for e in await read_events(handle, types=DONE_TYPES)]
        ended = arm == "serial" or "workflow_run.status_ended" in types
        if ended and types and types[-1] == "session.status_idle":
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{arm}: session {session_id} not done within {timeout:g} s")


def run_arm(stack: _stack.Stack, input_file: Path, arm: str) -> tuple[str, list[dict[str, Any]]]:
    session_id = stack.corral("start", "--input", str(input_file)).stdout.split()[0]
    asyncio.run(until_done(stack, session_id, arm))
    return session_id, stack.events(session_id)


def measure(runs: int, tasks: int, seconds: float) -> dict[str, list[float]]:
    return time_arms(scripts(tasks, seconds), session_inputs(tasks), runs, run_arm,
                     lambda arm, events: check(arm, events, tasks), "bench-runs-")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="counted runs per arm (default 5), after one warm-up")
    parser.add_argument("--tasks", type=int, default=5, help="tasks in the plan's one phase (default 5)")
    parser.add_argument("--seconds", type=float, default=3.0, help="what each task's call sleeps (default 3 s)")
    parser.add_argument("--output", default="runs", help="results file name in bench/results/")
    add_run_options(parser)
    args = parser.parse_args()
    begin_run(args.allow_dirty)
    walls = measure(args.runs, args.tasks, args.seconds)
    parallel, serial = median(walls["parallel"]), median(walls["serial"])
    work = args.tasks * args.seconds
    rows = [
        [f"parallel: a workflow run of one phase of {args.tasks} tasks", len(walls["parallel"]),
         f"{parallel:.2f}", f"{min(walls['parallel']):.2f}", f"{max(walls['parallel']):.2f}"],
        [f"serial: one agent, {args.tasks} calls in turn", len(walls["serial"]),
         f"{serial:.2f}", f"{min(walls['serial']):.2f}", f"{max(walls['serial']):.2f}"],
    ]  # fmt: skip
    ratio = serial / parallel
    body = "\n".join(
        [
            f"The work: {args.tasks} tasks of one `bash sleep {args.seconds:g}` call each ({work:g} s of sleeping) on "
            "a session's one sandbox, on the stack `corral up` starts, every model turn scripted by the offline "
            "model server. A session's wall time runs from its first `user.message` to its last "
            f"`session.status_idle` (its log's `created_at`); {args.runs} runs per arm, alternating, after one "
            "warm-up of each.",
            "",
            markdown_table(["arm", "runs", "wall p50 s", "min s", "max s"], rows),
            "",
            f"**Serial / parallel: {ratio:.2f}x** (p50 wall times; {args.tasks} would be perfect overlap with no "
            f"overhead). The parallel arm spends {parallel - args.seconds:.2f} s beyond one task's "
            f"{args.seconds:g} s of sleeping (the coordinator's turns, the run's start, the threads' spawns and "
            f"replies, the report); the serial arm {serial - work:.2f} s beyond its {work:g} s.",
        ]
    )
    print(body)
    summary = {"tasks": args.tasks, "seconds": args.seconds, "runs": args.runs,
               "parallel_p50": parallel, "serial_p50": serial, "ratio": ratio}  # fmt: skip
    title = "Workflow runs: one phase of N tasks as a run vs the same tasks in one thread"
    print(f"written to {write_results(args.output, title, body, summary=summary)}")


if __name__ == "__main__":
    main()
