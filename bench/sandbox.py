"""What a sandbox costs through corral, beside raw Docker measured in the same run.

Prints, for N runs (default 10):
  provision  `provision_sandbox` through the full Temporal path (client update -> workflow -> activity ->
             volume prepared, container created and started) vs raw `docker run --rm IMAGE true`
  execute    `execute("bash", "true")` through the full Temporal path (update -> workflow -> activity ->
             `docker exec` of the recorded-call runner -> output read back) vs raw `docker exec CONTAINER true`
Usage: `python -m bench.sandbox [--runs N]`. Ratios, not absolute times, are what carries across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
import uuid
from contextlib import AsyncExitStack

from temporalio.worker import Worker

from activities.sandbox import SandboxActivities
from bench._report import ROOT
from bench._sandbox_workflow import SandboxBenchWorkflow
from corral.sandbox import ensure_docker_engine, ensure_sandbox_image
from corral.sandbox.containers import remove_session
from corral.temporal import cluster_id, start_local_temporal
from workers.roles import HARNESS_WORKFLOW_RUNNER, sandbox_workers


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    engine = ensure_docker_engine(ROOT / ".corral")
    image = ensure_sandbox_image(engine, ROOT / ".corral")
    env = await start_local_temporal()
    queue = f"bench-sandbox-{uuid.uuid4().hex[:6]}"
    provision, execute, docker_run, docker_exec = [], [], [], []
    sessions: list[str] = []
    try:
        activities = SandboxActivities(engine, image, await cluster_id(env.client))
        async with AsyncExitStack() as workers:
            for worker in [
                Worker(env.client, task_queue=queue, workflows=[SandboxBenchWorkflow],
                       workflow_runner=HARNESS_WORKFLOW_RUNNER),
                *sandbox_workers(env.client, activities),
            ]:  # fmt: skip
                await workers.enter_async_context(worker)
            for run in range(args.runs + 1):  # the first run warms up and is not counted
                session_id = f"sesn_bench{uuid.uuid4().hex[:20]}"
                sessions.append(session_id)
                handle = await env.client.start_workflow(SandboxBenchWorkflow.run, id=session_id, task_queue=queue)
                started = time.perf_counter()
                made = await handle.execute_update(SandboxBenchWorkflow.provision, session_id)
                took = time.perf_counter() - started
                run_took = timed(["docker", "run", "--rm", image, "true"])
                if run:
                    provision.append(took)
                    docker_run.append(run_took)
                for _ in range(3):
                    started = time.perf_counter()
                    await handle.execute_update(SandboxBenchWorkflow.bash, "true")
                    took = time.perf_counter() - started
                    exec_took = timed(["docker", "exec", made.container_id, "true"])
                    if run:
                        execute.append(took)
                        docker_exec.append(exec_took)
                await handle.signal(SandboxBenchWorkflow.finish)
    finally:
        for session_id in sessions:
            remove_session(engine, session_id, remove_volume=True)
        await env.shutdown()
    print(f"sandbox image {image}; {args.runs} provisions, {len(execute)} bash calls (after one warm-up run)")
    print(f"{'measure':<44}{'p50 s':>9}{'p95 s':>9}")
    rows = [
        ("provision_sandbox via Temporal", provision),
        ("raw `docker run --rm IMAGE true`", docker_run),
        ('execute("bash", "true") via Temporal', execute),
        ("raw `docker exec CONTAINER true`", docker_exec),
    ]
    for name, values in rows:
        print(f"{name:<44}{percentile(values, 0.5):>9.3f}{percentile(values, 0.95):>9.3f}")
    print(
        f"ratios: provision / docker run p50 {statistics.median(provision) / statistics.median(docker_run):.2f}; "
        f"execute / docker exec p50 {statistics.median(execute) / statistics.median(docker_exec):.2f}"
    )


if __name__ == "__main__":
    asyncio.run(main())
