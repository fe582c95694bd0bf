"""Many sessions at once on this machine, with a zero-latency model: what parked sessions cost, how many turns a
second the workers sustain, and whether history per turn stays flat as a session grows.

The harness worker and the model worker (with the utility hand) run in two separate processes, built by
`workers.roles` as shipped, so their memory (RSS) and CPU time can be read; the model server (no
first-token latency, no pacing) and the clients run in this process. Phases, in order:

  1. active, none parked: `--active` sessions (default 20) each do turns back to back for `--active-seconds`
     (default 20): send a message with the `send_events` update, then poll the log (every 0.1 s, for the
     `session.status_idle` that ends the turn). Turns per second, and turn latency as the client sees it.
  2. park: `--parked` sessions (default 1000) are started with a first message, answer it, and go idle:
     a parked session waits in `workflow.wait_condition` and costs no compute. The workers' RSS is sampled as
     they accumulate (the harness keeps up to 1,000 workflows in its cache, the SDK default).
  3. active, with the sessions parked: phase 1 again, to compare turns per second.
  4. history: one session does `--history-turns` turns (default 100), each a `calculate` tool call on the
     utility hand and an answer; history bytes per turn over turns 1-10 against the last ten.

    python -m bench.scale                 # 1,000 parked (about 4 minutes on 2 cores)
    python -m bench.scale --quick         # 200 parked, shorter phases

Goals (issue 5; printed, never asserted): 1,000 parked sessions cost no worker memory growth beyond the workflow
cache, and history bytes per turn stay flat as sessions grow longer.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from bench._report import ROOT, add_run_options, begin_run, cpu_seconds, write_results
from bench._scale_report import figure, report, summary
from bench._workers import WorkerConfig, WorkerProcess, spawn_worker, wait_until_polling
from corral.client import read_events, send_text, start_session, wait_for_idle
from corral.contract.session import AgentConfig, SessionInput
from corral.names import ACTIVITY_MODEL_TURN, SEARCH_ATTRIBUTE_STATUS
from corral.temporal import start_local_temporal
from modelserver import ModelServerThread

MB = 1024 * 1024


@dataclass
class Workers:
    harness: WorkerProcess
    model: WorkerProcess

    def rss(self) -> tuple[float, float]:
        return self.harness.rss() / MB, self.model.rss() / MB

    def cpu(self) -> tuple[float, float]:
        return cpu_seconds(self.harness.pid), cpu_seconds(self.model.pid)


@dataclass
class ActivePhase:
    parked: int
    seconds: float
    turn_ends: list[float] = field(default_factory=list)
    """Monotonic times at which a turn was seen to end, for turns per second over time."""
    latencies: list[float] = field(default_factory=list)
    cpu: tuple[float, float] = (0.0, 0.0)
    """CPU seconds used by the harness and the model worker during the phase."""

    @property
    def turns_per_second(self) -> float:
        return len(self.latencies) / self.seconds


@dataclass
class Scale:
    args: argparse.Namespace
    client: Client
    workers: Workers
    harness_queue: str
    model_queue: str
    model: str
    started: int = 0
    park_samples: list[tuple[int, float, float]] = field(default_factory=list)
    """(sessions idle, harness RSS MB, model RSS MB) while parking."""
    park_seconds: float = 0.0
    rss: dict[str, tuple[float, float]] = field(default_factory=dict)
    history: list[tuple[int, int, int]] = field(default_factory=list)
    """(turns done, history bytes, largest model_turn input bytes)."""

    def session_input(self, message: str | None = None, tools: list[dict[str, Any]] | None = None) -> SessionInput:
        agent = AgentConfig.model_validate({"model": self.model, "tools": tools or []})
        return SessionInput(agent=agent, model_task_queue=self.model_queue, message=message)

    async def start(self, message: str | None = None, tools: list[dict[str, Any]] | None = None) -> WorkflowHandle:
        self.started += 1
        return await start_session(self.client, self.session_input(message, tools), task_queue=self.harness_queue)

    async def idle_sessions(self) -> int:
        query = f"TaskQueue = '{self.harness_queue}' AND {SEARCH_ATTRIBUTE_STATUS} = 'idle'"
        return (await self.client.count_workflows(query)).count


async def until_turn_ends(handle: WorkflowHandle, after: int, poll: float = 0.1) -> int:
    """Position of the `session.status_idle` that ends the turn begun after position `after`."""
    while True:
        idle = await read_events(handle, after=after, types=["session.status_idle"])
        if idle:
            return idle[-1].position
        await asyncio.sleep(poll)


async def active_phase(scale: Scale, parked: int) -> ActivePhase:
    """`--active` sessions doing turns back to back for `--active-seconds`."""
    handles = [await scale.start() for _ in range(scale.args.active)]
    phase = ActivePhase(parked, scale.args.active_seconds)
    begin_cpu = scale.workers.cpu()
    begin = time.monotonic()
    deadline = begin + scale.args.active_seconds

    async def converse(handle: WorkflowHandle) -> None:
        position = 0
        number = 0
        while time.monotonic() < deadline:
            number += 1
            sent = time.monotonic()
            await send_text(handle, f"message {number}")
            position = await until_turn_ends(handle, position)
            ended = time.monotonic()
            if ended <= deadline:
                phase.turn_ends.append(ended - begin)
                phase.latencies.append(ended - sent)

    await asyncio.gather(*(converse(handle) for handle in handles))
    end_cpu = scale.workers.cpu()
    phase.cpu = (end_cpu[0] - begin_cpu[0], end_cpu[1] - begin_cpu[1])
    return phase


async def park(scale: Scale, count: int) -> None:
    """Start `count` sessions with a first message and wait until every one is idle, sampling RSS."""
    already = scale.started
    gate = asyncio.Semaphore(16)

    async def one(number: int) -> None:
        async with gate:
            await scale.start(message=f"parked session {number}: hello")

    begin = time.monotonic()
    starting = asyncio.gather(*(one(number) for number in range(count)))
    while True:
        idle = await scale.idle_sessions()
        scale.park_samples.append((max(0, idle - already), *scale.workers.rss()))
        if starting.done() and idle >= scale.started:
            break
        await asyncio.sleep(1.0)
    await starting
    scale.park_seconds = time.monotonic() - begin


async def history_bytes(handle: WorkflowHandle) -> tuple[int, int]:
    """Total bytes of the history, and the largest `model_turn` activity input in it."""
    history = await handle.fetch_history()
    largest = 0
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attributes = event.activity_task_scheduled_event_attributes
            if attributes.activity_type.name == ACTIVITY_MODEL_TURN:
                largest = max(largest, attributes.input.ByteSize())
    return sum(event.ByteSize() for event in history.events), largest


async def history_phase(scale: Scale, turns: int, history_model: str) -> None:
    agent_tools = [{"type": "corral_utility"}]
    input = SessionInput(
        agent=AgentConfig.model_validate({"model": history_model, "tools": agent_tools}),
        model_task_queue=scale.model_queue,
    )
    handle = await start_session(scale.client, input, task_queue=scale.harness_queue)
    scale.history.append((0, *await history_bytes(handle)))
    position = 0
    for turn in range(1, turns + 1):
        await send_text(handle, f"turn {turn}: what is 6*7?")
        position = (await wait_for_idle(handle, after=position, within_seconds=60))[-1].position
        if turn % 10 == 0 or turn == turns:
            scale.history.append((turn, *await history_bytes(handle)))


# ---- main ---------------------------------------------------------------------------------------------------


async def measure(args: argparse.Namespace) -> tuple[Scale, ActivePhase, ActivePhase]:
    server = ModelServerThread()
    model_url = server.start()
    suffix = uuid.uuid4().hex[:8]
    server.register(f"scale-{suffix}", {"steps": [{"text": "A short answer."}], "loop": True})
    server.register(
        f"history-{suffix}",
        {
            "steps": [
                {"text": "Computing.", "tool_uses": [{"name": "calculate", "input": {"expression": "6*7"}}]},
                {"text": "The answer is 42, as the tool said."},
            ],
            "loop": True,
        },
    )
    env = await start_local_temporal(dev_server_log_level="error")
    config = WorkerConfig(
        address=env.client.service_client.config.target_host,
        harness_queue=f"bench-harness-{suffix}",
        model_queue=f"bench-model-{suffix}",
        model_url=model_url,
        log_dir=Path(tempfile.mkdtemp(prefix="corral-bench-scale-")),
    )
    harness = spawn_worker(config, ("harness",), "harness")
    model = spawn_worker(config, ("model", "utility"), "model")
    workers = Workers(harness, model)
    scale = Scale(args, env.client, workers, config.harness_queue, config.model_queue, f"script:scale-{suffix}")
    try:
        for worker in (harness, model):
            await wait_until_polling(env.client, config, worker)
        warm = [await scale.start(message="warm-up") for _ in range(5)]
        for handle in warm:
            await wait_for_idle(handle, within_seconds=60)
        scale.rss["start"] = workers.rss()
        print(f"workers ready (logs in {config.log_dir}); RSS harness/model {scale.rss['start']} MB", flush=True)
        before = await active_phase(scale, 0)
        print(f"active, 0 parked: {before.turns_per_second:.1f} turns/s", flush=True)
        await park(scale, args.parked)
        await asyncio.sleep(2)
        scale.rss["parked"] = workers.rss()
        print(f"parked {args.parked} in {scale.park_seconds:.1f}s; RSS {scale.rss['parked']} MB", flush=True)
        after = await active_phase(scale, args.parked)
        print(f"active, {args.parked} parked: {after.turns_per_second:.1f} turns/s", flush=True)
        await history_phase(scale, args.history_turns, f"script:history-{suffix}")
        scale.rss["end"] = workers.rss()
        print(f"history: {scale.history[-1]}", flush=True)
    finally:
        harness.stop()
        model.stop()
        await env.shutdown()
        server.stop()
    return scale, before, after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parked", type=int, default=1000, help="sessions to park (default 1000)")
    parser.add_argument("--active", type=int, default=20, help="sessions doing turns at once (default 20)")
    parser.add_argument("--active-seconds", type=float, default=20.0, help="length of an active phase (default 20)")
    parser.add_argument("--history-turns", type=int, default=100, help="turns of the history session (default 100)")
    parser.add_argument("--output", default="scale", help="results file name in bench/results/ (default scale)")
    parser.add_argument("--quick", action="store_true", help="200 parked, 8 s active phases, 30 history turns")
    add_run_options(parser)
    args = parser.parse_args()
    begin_run(args.allow_dirty)
    if args.quick:
        args.parked, args.active_seconds, args.history_turns = 200, 8.0, 30
        args.output = "scale-quick" if args.output == "scale" else args.output  # keep the full run's results
    scale, before, after = asyncio.run(measure(args))
    body = report(scale, before, after)
    print()
    print(body)
    title = "Many sessions on one machine"
    path = write_results(args.output, title, body, figure(scale, before, after), summary(scale, before, after))
    print(f"\nwritten to {path.relative_to(ROOT)} and {path.with_suffix('.png').relative_to(ROOT)}")


if __name__ == "__main__":
    main()
