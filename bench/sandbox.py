"""What a sandbox costs through corral, on the stack `corral up` starts, beside raw Docker measured in the same run.

The figures: `corral up` runs in a temporary state dir on free ports (`bench/_stack.py`), and N sessions (default
10, after one warm-up) each make K `bash true` calls (default 3) through the default toolset, driven by the
offline model. Each call is timed from its `agent.tool_use` event to its `agent.tool_result` event, as the session
log stores them (`created_at`), the first call of a session apart (it claims the sandbox from the warm pool):
  first call   claim + `bash true`, as the stack does it    vs raw `docker run --rm IMAGE true`
  execute      `bash true` on the session's running sandbox vs raw `docker exec CONTAINER true`
The raw commands run in the same run, on the same image and on the session's own container. `corral down
--sandboxes` ends the stack.

A breakdown, labelled as such, follows from a bench-only workflow (`bench/_sandbox_workflow.py`) on corral's real
sandbox activities: the provision with the pool off (cold), and where an execute's time goes (the runner round
trip measured from this process on the same container: stream write, command, output read; the rest is
Temporal's). Usage: `python -m bench.sandbox [--runs N] [--calls K] [--networking limited|unrestricted]` (the
breakdown recipe's networking). Ratios, not absolute times, are what carries across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import time
import uuid
from contextlib import AsyncExitStack
from datetime import datetime
from typing import Any

import docker
import httpx
from temporalio.client import Client
from temporalio.worker import Worker

from activities.sandbox import SandboxActivities
from bench import _stack
from bench._report import ROOT, add_run_options, begin_run, markdown_table, percentile, write_results
from bench._sandbox_workflow import SandboxBenchWorkflow
from corral.contract.sandbox import Environment
from corral.names import SESSION_ID_PREFIX
from corral.temporal import cluster_id, start_local_temporal
from sandbox import ensure_docker_engine, ensure_sandbox_image
from sandbox.pool import PoolSettings, WarmPool, pool_key
from sandbox.runner import Runners
from sandbox.sessions import remove_session
from workers.roles import HARNESS_WORKFLOW_RUNNER, sandbox_workers
from workers.sandbox import keeping_filled


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - started


async def until_ready(pool: WarmPool, image: str, environment: Environment) -> None:
    key = pool_key(environment, image)
    assert key is not None
    for _ in range(600):
        if await asyncio.to_thread(pool._members, key):
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("the warm pool made no member within 30 s")


class Samples(dict[str, list[float]]):
    def add(self, name: str, value: float) -> None:
        self.setdefault(name, []).append(value)


def bench_workers(client: Client, queue: str, activities: SandboxActivities) -> list[Worker]:
    harness = Worker(
        client, task_queue=queue, workflows=[SandboxBenchWorkflow], workflow_runner=HARNESS_WORKFLOW_RUNNER
    )
    return [harness, *sandbox_workers(client, activities)]


async def probe_true(probe: Runners, container_id: str, call: str) -> tuple[float, dict[str, Any]]:
    """`bash true` straight to the container's runner from this process: (seconds, the runner's answer)."""
    started = time.perf_counter()
    answer = await probe.request(
        container_id, "bash", 30, call=call, command="true", workdir="/workspace", timeout=10, head=100, tail=100
    )
    return time.perf_counter() - started, answer


def recipe(networking: str) -> Environment:
    if networking == "limited":
        return Environment.model_validate({"networking": {"type": "limited", "allowed_hosts": ["example.invalid"]}})
    return Environment.model_validate({"networking": {"type": networking}})


async def measure(
    client: Client,
    queue: str,
    engine: docker.DockerClient,
    image: str,
    runs: int,
    samples: Samples,
    environment: Environment,
) -> WarmPool:
    activities = SandboxActivities(engine, image, await cluster_id(client), pool=PoolSettings(size=2))
    cold = SandboxActivities(engine, image, await cluster_id(client))
    cold_queue = f"{queue}-cold"
    pool = activities.pool
    assert pool is not None
    probe = Runners(engine)
    sessions: list[str] = []
    try:
        async with AsyncExitStack() as workers:
            for worker in bench_workers(client, queue, activities):
                await workers.enter_async_context(worker)
            await workers.enter_async_context(keeping_filled(pool))
            for run in range(runs + 1):  # the first run warms up and is not counted
                session_id = f"{SESSION_ID_PREFIX}bench{uuid.uuid4().hex[:20]}"
                sessions.append(session_id)
                if run:  # the warm-up run taught the pool a recipe it did not know yet
                    await until_ready(pool, image, environment)
                handle = await client.start_workflow(SandboxBenchWorkflow.run, id=session_id, task_queue=queue)
                first, claim = await handle.execute_update(
                    SandboxBenchWorkflow.first_call, args=[session_id, environment]
                )
                run_took = timed(["docker", "run", "--rm", image, "true"])
                sandbox = await handle.query(SandboxBenchWorkflow.sandbox)
                assert sandbox is not None
                if run:
                    samples.add("first", first)
                    samples.add("claim", claim)
                    samples.add("docker run", run_took)
                for call in range(3):
                    started = time.perf_counter()
                    harness = await handle.execute_update(SandboxBenchWorkflow.bash, "true")
                    client_took = time.perf_counter() - started
                    exec_took = timed(["docker", "exec", sandbox.container_id, "true"])
                    direct, answer = await probe_true(probe, sandbox.container_id, f"probe-{run}-{call}")
                    if run:
                        samples.add("execute", harness)
                        samples.add("execute (client)", client_took)
                        samples.add("docker exec", exec_took)
                        samples.add("runner", direct)
                        samples.add("command", answer["took"]["command_ms"] / 1000)
                        samples.add("output", answer["took"]["output_ms"] / 1000)
                await handle.signal(SandboxBenchWorkflow.finish)
        # Cold starts: the same provision with no pool, on a worker of its own.
        async with AsyncExitStack() as workers:
            for worker in bench_workers(client, cold_queue, cold):
                await workers.enter_async_context(worker)
            for run in range(runs + 1):
                session_id = f"{SESSION_ID_PREFIX}bench{uuid.uuid4().hex[:20]}"
                sessions.append(session_id)
                handle = await client.start_workflow(SandboxBenchWorkflow.run, id=session_id, task_queue=cold_queue)
                took = await handle.execute_update(SandboxBenchWorkflow.provision, args=[session_id, environment])
                if run:
                    samples.add("cold", took)
                await handle.signal(SandboxBenchWorkflow.finish)
    finally:
        probe.close()
        for session_id in sessions:
            remove_session(engine, session_id, remove_volume=True)
        await pool.remove_unclaimed()
    return pool


STACK_SCRIPT = "bench-sandbox"


def tool_spans(events: list[dict[str, Any]]) -> list[float]:
    """Seconds from each `agent.tool_use` to its `agent.tool_result`, in log order, from the events' `created_at`;
    a result that is an error fails the run (a figure of a failed call would mean nothing)."""
    used = {
        event["id"]: datetime.fromisoformat(event["created_at"])
        for event in events
        if event["type"] == "agent.tool_use"
    }
    spans = []
    for event in events:
        if event["type"] != "agent.tool_result":
            continue
        if event.get("is_error"):
            raise RuntimeError(f"a bash call failed: {event}")
        spans.append((datetime.fromisoformat(event["created_at"]) - used[event["tool_use_id"]]).total_seconds())
    return spans


def on_stack(runs: int, calls: int, samples: Samples) -> str:
    """Sessions on `corral up`'s stack: their tool events, with raw `docker run` / `docker exec` beside each;
    returns the sandbox image the stack used."""
    engine = docker.from_env()
    stack = _stack.up()
    image = ""
    try:
        steps = [{"text": "Running it.", "tool_uses": [{"name": "bash", "input": {"command": "true"}}]}] * calls
        steps.append({"text": "Done."})
        put = httpx.put(f"{stack.model_url}/_corral/scripts/{STACK_SCRIPT}", json={"steps": steps}, timeout=30)
        put.raise_for_status()
        for run in range(runs + 1):  # the first run warms up and is not counted
            session_id = stack.corral("start", "--model", f"script:{STACK_SCRIPT}", "run true").stdout.split()[0]
            stack.corral("tail", session_id)
            spans = tool_spans(stack.events(session_id))
            if len(spans) != calls:
                raise RuntimeError(f"session {session_id} made {len(spans)} bash calls, not {calls}")
            # A warm-pool member keeps the labels it was made with; its name is the session's once claimed.
            (container,) = engine.containers.list(filters={"name": f"corral-{session_id}-g"})
            image = container.attrs["Config"]["Image"]
            run_took = timed(["docker", "run", "--rm", image, "true"])
            exec_took = [timed(["docker", "exec", container.id, "true"]) for _ in range(calls - 1)]
            if run:
                samples.add("stack first", spans[0])
                samples.add("stack docker run", run_took)
                for took in spans[1:]:
                    samples.add("stack execute", took)
                for took in exec_took:
                    samples.add("stack docker exec", took)
            print(f"session {run}/{runs}: bash true {', '.join(f'{1000 * s:.0f}' for s in spans)} ms", flush=True)
    finally:
        _stack.down(stack)
    return image


def ms(values: list[float], fraction: float) -> str:
    return f"{1000 * percentile(values, fraction):.1f}"


def report(args: argparse.Namespace, samples: Samples, image: str, pool: WarmPool) -> tuple[str, dict[str, Any]]:
    p50 = {name: percentile(values, 0.5) for name, values in samples.items()}
    figures = {
        "sessions": args.runs,
        "calls_per_session": args.calls,
        "first_ms": 1000 * p50["stack first"],
        "docker_run_ms": 1000 * p50["stack docker run"],
        "first_ratio": p50["stack first"] / p50["stack docker run"],
        "execute_ms": 1000 * p50["stack execute"],
        "docker_exec_ms": 1000 * p50["stack docker exec"],
        "execute_ratio": p50["stack execute"] / p50["stack docker exec"],
        "breakdown": {
            "networking": args.networking,
            "cold_ms": 1000 * p50["cold"],
            "docker_run_ms": 1000 * p50["docker run"],
            "cold_ratio": p50["cold"] / p50["docker run"],
            "execute_ms": 1000 * p50["execute"],
            "runner_ms": 1000 * p50["runner"],
            "temporal_ms": 1000 * (p50["execute"] - p50["runner"]),
            "docker_exec_ms": 1000 * p50["docker exec"],
        },
    }
    headline = [
        ("first `bash true` of a session: warm-pool claim + command", "stack first", "stack docker run",
         "`docker run --rm IMAGE true`"),
        ("`bash true` on the session's running sandbox", "stack execute", "stack docker exec",
         "`docker exec CONTAINER true`"),
    ]  # fmt: skip
    rows = [
        [label, len(samples[ours]), ms(samples[ours], 0.5), ms(samples[ours], 0.95), raw, ms(samples[theirs], 0.5),
         f"{p50[ours] / p50[theirs]:.2f}x"]
        for label, ours, theirs, raw in headline
    ]  # fmt: skip
    breakdown = [
        ("first call: provision + bash true, warm pool (harness)", "first"),
        ("  of which the provision (a claim from the pool)", "claim"),
        ("cold start: provision with the pool off (harness)", "cold"),
        ("raw `docker run --rm IMAGE true`", "docker run"),
        ('execute("bash", "true") (harness: tool_use -> tool_result)', "execute"),
        ('execute("bash", "true") (client: update round trip)', "execute (client)"),
        ("raw `docker exec CONTAINER true`", "docker exec"),
        ("  runner round trip from the worker's side (direct)", "runner"),
        ("    of which the command (bash start, state, exit)", "command"),
        ("    of which the output read and cut", "output"),
    ]
    hit_rate = pool.stats.hit_rate
    lines = [
        f"Sandbox image `{image}`. {args.runs} sessions (after one warm-up) on the stack `corral up` starts, each "
        f"making {args.calls} `bash true` calls through the default toolset; a call is timed from its "
        "`agent.tool_use` to its `agent.tool_result` as the session log stores them (`created_at`). The raw Docker "
        "commands run in the same run, on the same image and on the session's own container.",
        "",
        markdown_table(["call", "calls", "corral p50 ms", "p95 ms", "raw Docker", "p50 ms", "ratio p50"], rows),
        "",
        f"## Breakdown: a bench-only workflow on corral's sandbox activities (networking `{args.networking}`)",
        "",
        "Not the product's path: a workflow of the benchmark's own (`bench/_sandbox_workflow.py`) calls the real "
        "sandbox activities, so the provision with the pool off and the runner's share can be timed apart.",
        "",
        markdown_table(
            ["measure", "p50 ms", "p95 ms"],
            [[label, ms(samples[name], 0.5), ms(samples[name], 0.95)] for label, name in breakdown],
        ),
        "",
        f"Temporal's share of an execute, p50: {figures['breakdown']['temporal_ms']:.1f} ms (the harness view minus "
        f"the direct runner round trip). Warm pool: {pool.stats.hits} hits, {pool.stats.misses} misses (hit rate "
        f"{'n/a' if hit_rate is None else f'{hit_rate:.0%}'}), {pool.stats.made} members made.",
    ]
    return "\n".join(lines), figures


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="sessions measured, after one warm-up (default 10)")
    parser.add_argument("--calls", type=int, default=3, help="bash calls per session (default 3, at least 2)")
    parser.add_argument("--networking", choices=["none", "limited", "unrestricted"], default="none")
    parser.add_argument("--output", default="sandbox", help="results file name in bench/results/ (default sandbox)")
    add_run_options(parser)
    args = parser.parse_args()
    if args.calls < 2:
        parser.error("--calls must be at least 2: the first call of a session claims its sandbox")
    begin_run(args.allow_dirty)
    samples = Samples()
    stack_image = await asyncio.to_thread(on_stack, args.runs, args.calls, samples)
    engine = ensure_docker_engine(ROOT / ".corral")
    image = ensure_sandbox_image(engine, ROOT / ".corral")
    env = await start_local_temporal()
    try:
        queue = f"bench-sandbox-{uuid.uuid4().hex[:6]}"
        pool = await measure(env.client, queue, engine, image, args.runs, samples, recipe(args.networking))
    finally:
        await env.shutdown()
    body, figures = report(args, samples, stack_image, pool)
    print(body)
    path = write_results(args.output, "Sandbox cost through corral vs raw Docker", body, summary=figures)
    print(f"written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    asyncio.run(main())
