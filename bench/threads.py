"""What parallel brains on shared hands buy: three threads doing tool work at once against one agent doing the same
work alone, on the stack `corral up` starts, measured in the same run.

The work: K `bash sleep S` calls (default 3 calls of 2 s) per worker, three workers' worth. The parallel arm is a
multi-agent session: its coordinator spawns three threads of a `worker` agent, each makes its K calls on the
session's one sandbox and replies, and the coordinator waits for the three replies and answers. The serial arm is
a session of one agent that makes the same 3K calls in turn. Every role is a script of the offline model server
(`modelserver/gates.py` lets the coordinator wait as often as the replies need). Both arms start through
`corral start --input` (a SessionInput file: the coordinator's roster is given as full snapshots, as a Temporal
client gives it) and end with `corral tail`; a session's wall time is read from its log, from its first
`user.message` to its last `session.status_idle` (`created_at`). Runs alternate between the arms, after one
warm-up of each (not counted); the figure is the ratio of the medians, serial over parallel (3 would be perfect
overlap with no overhead).

Usage: `python -m bench.threads [--runs N] [--calls K] [--seconds S]`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench import _stack
from bench._arms import time_arms
from bench._report import add_run_options, begin_run, markdown_table, median, write_results
from corral.contract.agent import AgentConfig, Multiagent, ThreadAgent
from corral.contract.sandbox import AgentToolset20260401, ToolConfig, ToolsetDefaultConfig
from corral.contract.session import SessionInput
from modelserver import Script, ScriptStep
from modelserver.gates import RepeatUntil
from modelserver.scripts import ToolUseSpec

THREADS = 3
REPLY = r"Message from thread sthr_\w+ \(worker\):"
BASH_ONLY = AgentToolset20260401(
    default_config=ToolsetDefaultConfig(enabled=False), configs=[ToolConfig(name="bash", enabled=True)]
)


def scripts(calls: int, seconds: float) -> dict[str, Script]:
    """The worker (K sleeps, then a reply), the coordinator (spawn three, wait for three replies, answer) and the
    lone agent (3K sleeps, then an answer)."""
    sleep = ScriptStep(tool_uses=[ToolUseSpec(name="bash", input={"command": f"sleep {seconds:g}"})])
    spawn = ToolUseSpec(name="spawn_thread", input={"agent": "worker", "message": f"Run {calls} sleeps."})
    return {
        "bench-threads-worker": Script(steps=[sleep] * calls + [ScriptStep(text="done")]),
        "bench-threads-coordinator": Script(
            steps=[
                ScriptStep(tool_uses=[spawn] * THREADS),
                ScriptStep(
                    tool_uses=[ToolUseSpec(name="wait_for_threads")],
                    repeat_until=RepeatUntil(pattern=REPLY, count=THREADS),
                ),
                ScriptStep(text="all threads replied"),
            ]
        ),
        "bench-threads-serial": Script(steps=[sleep] * (THREADS * calls) + [ScriptStep(text="done")]),
    }


def session_inputs(calls: int) -> dict[str, SessionInput]:
    worker = AgentConfig(name="worker", model="script:bench-threads-worker", tools=[BASH_ONLY])
    coordinator = AgentConfig(
        name="coordinator",
        model="script:bench-threads-coordinator",
        multiagent=Multiagent(type="coordinator", agents=[ThreadAgent(config=worker)]),
    )
    serial = AgentConfig(name="serial", model="script:bench-threads-serial", tools=[BASH_ONLY])
    message = f"{THREADS} x {calls} sleeps"
    return {
        "parallel": SessionInput(agent=coordinator, message=message, title="bench threads: parallel"),
        "serial": SessionInput(agent=serial, message=message, title="bench threads: serial"),
    }


def check(arm: str, events: list[dict[str, Any]], calls: int) -> None:
    """A run that did not do all its work measures nothing: every bash call made, every thread replied."""
    if arm == "parallel":
        made = [e for e in events if e["type"] == "agent.tool_use" and e.get("session_thread_id")]
        replies = [e for e in events if e["type"] == "agent.thread_message_received"]
        if len(made) != THREADS * calls or len(replies) != THREADS:
            raise RuntimeError(f"parallel: {len(made)} thread bash calls and {len(replies)} replies, not "
                               f"{THREADS * calls} and {THREADS}")  # fmt: skip
    else:
        results = [e for e in events if e["type"] == "agent.tool_result"]
        errors = [e["content"] for e in results if e.get("is_error")]
        if len(results) != THREADS * calls or errors:
            raise RuntimeError(f"serial: {len(results)} bash results, not {THREADS * calls}, or errors: {errors}")


def run_arm(stack: _stack.Stack, input_file: Path, _arm: str) -> tuple[str, list[dict[str, Any]]]:
    session_id = stack.corral("start", "--input", str(input_file)).stdout.split()[0]
    stack.corral("tail", session_id)
    return session_id, stack.events(session_id)


def measure(runs: int, calls: int, seconds: float) -> dict[str, list[float]]:
    return time_arms(scripts(calls, seconds), session_inputs(calls), runs, run_arm,
                     lambda arm, events: check(arm, events, calls), "bench-threads-")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="counted runs per arm (default 5), after one warm-up")
    parser.add_argument("--calls", type=int, default=3, help="bash calls per worker (default 3)")
    parser.add_argument("--seconds", type=float, default=2.0, help="what each call sleeps (default 2 s)")
    parser.add_argument("--output", default="threads", help="results file name in bench/results/")
    add_run_options(parser)
    args = parser.parse_args()
    begin_run(args.allow_dirty)
    walls = measure(args.runs, args.calls, args.seconds)
    parallel, serial = median(walls["parallel"]), median(walls["serial"])
    work = THREADS * args.calls * args.seconds
    rows = [
        [f"parallel: a coordinator and {THREADS} threads, {args.calls} calls each", len(walls["parallel"]),
         f"{parallel:.2f}", f"{min(walls['parallel']):.2f}", f"{max(walls['parallel']):.2f}"],
        [f"serial: one agent, {THREADS * args.calls} calls", len(walls["serial"]),
         f"{serial:.2f}", f"{min(walls['serial']):.2f}", f"{max(walls['serial']):.2f}"],
    ]  # fmt: skip
    ratio = serial / parallel
    body = "\n".join(
        [
            f"The work: {THREADS} x {args.calls} `bash sleep {args.seconds:g}` calls ({work:g} s of sleeping) on a "
            "session's one sandbox, on the stack `corral up` starts, every model turn scripted by the offline model "
            "server. A session's wall time runs from its first `user.message` to its last `session.status_idle` "
            f"(its log's `created_at`); {args.runs} runs per arm, alternating, after one warm-up of each.",
            "",
            markdown_table(["arm", "runs", "wall p50 s", "min s", "max s"], rows),
            "",
            f"**Serial / parallel: {ratio:.2f}x** (p50 wall times; {THREADS} would be perfect overlap with no "
            f"overhead). The parallel arm spends {parallel - work / THREADS:.2f} s beyond its threads' "
            f"{work / THREADS:g} s of sleeping each (spawning, the coordinator's turns, the replies); the serial arm "
            f"{serial - work:.2f} s beyond its {work:g} s.",
        ]
    )
    print(body)
    summary = {"threads": THREADS, "calls": args.calls, "seconds": args.seconds, "runs": args.runs,
               "parallel_p50": parallel, "serial_p50": serial, "ratio": ratio}  # fmt: skip
    title = "Threads: three threads on shared hands vs one agent doing the same work"
    print(f"written to {write_results(args.output, title, body, summary=summary)}")


if __name__ == "__main__":
    main()
