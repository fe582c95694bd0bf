"""A workflow run from a Temporal client: a session whose agent may run plans, the plan in
examples/workflow_run_plan.json started with the `start_workflow_run` update, its phases followed with the
`workflow_runs` query, and its report read from the session's log. Run

    corral up                              # Temporal, the workers, the offline model without ANTHROPIC_API_KEY
    python examples/workflow_run.py        # options: --address HOST:PORT, --model NAME, --plan FILE

A coordinator's model starts the same run with its `start_workflow_run` tool (docs/workflow_runs.md). The session
stays open: `corral runs SESSION_ID` lists its runs, `corral events SESSION_ID` shows its log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from temporalio.client import Client, WorkflowUpdateRPCTimeoutOrCancelledError

from corral.client import read_events, start_session
from corral.contract.agent import Multiagent, ThreadAgent
from corral.contract.events import WorkflowRunStatusEnded
from corral.contract.plans import Plan, WorkflowRunInfo, parse_plan
from corral.contract.session import AgentConfig, SessionInput, UtilityToolset
from corral.names import QUERY_WORKFLOW_RUNS, UPDATE_START_WORKFLOW_RUN
from corral.temporal import connect, temporal_address

OFFLINE_MODEL = "corral-offline-stand-in"
PLAN = Path(__file__).with_name("workflow_run_plan.json")


async def run_plan(client: Client, model: str, plan: Plan) -> WorkflowRunStatusEnded:
    # `self`: a task may run this agent itself (as a thread, with its tools: here `calculate` and `get_time`).
    runs = Multiagent(runs=True, run_agents=[ThreadAgent(type="self")])
    handle = await start_session(client, SessionInput(agent=AgentConfig(model=model, tools=[UtilityToolset()],
                                                                        multiagent=runs)))  # fmt: skip
    print(f"session {handle.id}")
    run = await handle.execute_update(UPDATE_START_WORKFLOW_RUN, plan, result_type=WorkflowRunInfo)
    print(f"run {run.id}")
    shown = ""
    while run.status != "ended":
        await asyncio.sleep(0.5)
        runs_now = await handle.query(QUERY_WORKFLOW_RUNS, result_type=list[WorkflowRunInfo])
        run = next(info for info in runs_now if info.id == run.id)
        progress = f"{run.status}: {run.progress()}"
        if progress != shown:
            print(progress, flush=True)
            shown = progress
    ended = await read_events(handle, types=["workflow_run.status_ended"])
    return next(e for e in ended if isinstance(e, WorkflowRunStatusEnded) and e.workflow_run_id == run.id)


async def main() -> int:
    parser = argparse.ArgumentParser(description="Run a plan as a workflow run of a corral session.")
    parser.add_argument("--address", default=temporal_address(), help="default: CORRAL_TEMPORAL_ADDRESS or local")
    parser.add_argument("--model", default=OFFLINE_MODEL, help=f"default: {OFFLINE_MODEL} (offline `corral up`)")
    parser.add_argument("--plan", type=Path, default=PLAN, help="the plan, a JSON file (default: the example's)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the run (default: 120)")
    args = parser.parse_args()
    try:
        plan = parse_plan(json.loads(args.plan.read_text()))
    except (OSError, ValueError) as exc:  # a missing file, bad JSON, or a plan that breaks the grammar
        print(f"{args.plan}: {exc}", file=sys.stderr)
        return 2
    try:
        client = await connect(args.address)  # the pydantic data converter, like every corral process
    except RuntimeError:  # what temporalio raises when nothing answers at the address
        print(f"cannot reach Temporal at {args.address} — run `corral up` first", file=sys.stderr)
        return 1
    try:
        ended = await asyncio.wait_for(run_plan(client, args.model, plan), args.timeout)
    except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):  # the update's RPC turns a cancel into this
        print(f"the run did not end within {args.timeout:g} s — are corral's workers running?", file=sys.stderr)
        return 1
    print(f"result: {ended.result.type}")
    print(ended.report or "")
    return 0 if ended.result.type == "completed" else 1


if __name__ == "__main__":
    code = asyncio.run(main())
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: the client's Rust threads can abort it, exit code 134 (temporalio/sdk-python#300).
    os._exit(code)
