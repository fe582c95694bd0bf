"""What a sandbox costs through corral, beside raw Docker measured in the same run.

Measures, for N sessions (default 10, after one warm-up), each as the harness sees it (from the workflow task
that schedules the activity to the one that sees its result, as `agent.tool_use` to `agent.tool_result`):
  first call   provision + `bash true` with the warm pool on (a member ready) vs raw `docker run --rm IMAGE true`
  cold start   provision with the pool off (volume prepared, container created and started)
  execute      `bash true` on a running sandbox (3 per session) vs raw `docker exec CONTAINER true`
and where an execute's time goes: the runner round trip measured from this process on the same container
(stream write, command, output read: the runner reports the last two), the rest being Temporal's (update,
workflow task, activity dispatch and completion). Usage: `python -m bench.sandbox [--runs N] [--networking
limited|unrestricted]` (the recipe's networking: none by default; the warm-up run teaches the pool the recipe).
Ratios, not absolute times, are what carries across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
import uuid
from contextlib import AsyncExitStack
from typing import Any

import docker
from temporalio.client import Client
from temporalio.worker import Worker

from activities.sandbox import SandboxActivities
from bench._report import ROOT
from bench._sandbox_workflow import SandboxBenchWorkflow
from corral.contract.sandbox import Environment
from corral.sandbox import ensure_docker_engine, ensure_sandbox_image
from corral.sandbox.containers import remove_session
from corral.sandbox.pool import PoolSettings, WarmPool, pool_key
from corral.sandbox.runner import Runners
from corral.temporal import cluster_id, start_local_temporal
from workers.roles import HARNESS_WORKFLOW_RUNNER, sandbox_workers
from workers.sandbox import keeping_filled


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


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
                session_id = f"sesn_bench{uuid.uuid4().hex[:20]}"
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
                session_id = f"sesn_bench{uuid.uuid4().hex[:20]}"
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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--networking", choices=["none", "limited", "unrestricted"], default="none")
    args = parser.parse_args()
    engine = ensure_docker_engine(ROOT / ".corral")
    image = ensure_sandbox_image(engine, ROOT / ".corral")
    env = await start_local_temporal()
    samples = Samples()
    try:
        queue = f"bench-sandbox-{uuid.uuid4().hex[:6]}"
        pool = await measure(env.client, queue, engine, image, args.runs, samples, recipe(args.networking))
    finally:
        await env.shutdown()
    p50 = {name: statistics.median(values) for name, values in samples.items()}
    print(f"sandbox image {image}; networking {args.networking}; {args.runs} sessions, "
          f"{len(samples['execute'])} bash calls (after one warm-up run)")  # fmt: skip
    print(f"{'measure':<58}{'p50 ms':>9}{'p95 ms':>9}")
    rows = [
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
    for label, name in rows:
        values = samples[name]
        print(f"{label:<58}{percentile(values, 0.5) * 1000:>9.1f}{percentile(values, 0.95) * 1000:>9.1f}")
    temporal = p50["execute"] - p50["runner"]
    hit_rate = pool.stats.hit_rate
    print(
        f"Temporal's share of an execute, p50: {temporal * 1000:.1f} ms (the harness view minus the direct round trip)"
    )
    print(f"warm pool: {pool.stats.hits} hits, {pool.stats.misses} misses (hit rate "
          f"{'n/a' if hit_rate is None else f'{hit_rate:.0%}'}), {pool.stats.made} members made")  # fmt: skip
    print(
        f"ratios (p50): execute / docker exec {p50['execute'] / p50['docker exec']:.2f} (goal <= 1.0); "
        f"first call / docker run {p50['first'] / p50['docker run']:.2f} (goal <= 0.5, and <= 100 ms: "
        f"{'met' if p50['first'] <= 0.1 else 'not met'}); cold start / docker run {p50['cold'] / p50['docker run']:.2f}"
    )


if __name__ == "__main__":
    asyncio.run(main())
