"""A long session against a small context budget: does the history stay linear, does every request stay within
the budget, how much of the input does the prompt cache serve, and does a long session cost the same to read
and to restart at its end as at its start?

One session on the offline model server: every turn the user sends a message, the model calls a tool that prints
3 KB, then answers. The agent's `context_budget_tokens` is small, so the harness elides old tool results and
summarises older turns all along. Figures, each against a baseline from the same run:
- history bytes per turn, the last turns against the first (goal: at most 1.1x);
- the largest request's input tokens against the budget (goal: never over) and the model's window;
- the cache-read share of all input tokens once the prefix is stable (goal: at least 80%);
- how many summaries and elided results it took;
- the latency of a 100-event slice of the log at its start, middle and end (goal: end/start at most 1.5x); the
  early ones come from the archive of earlier runs, the last from the current run;
- the continue-as-new hand-over time against a turn's p50 (goal: under it);
- what a harness restart costs: replaying the last complete run's history against replaying the first's (goal:
  about 1x, and under 2 s).

    python -m bench.long [--turns 1800] [--budget 20000] [--output long]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
import uuid

import anthropic
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.worker import Replayer, Worker

from bench._report import add_run_options, begin_run, write_results
from corral.client import read_events, send_text, start_session, wait_for_idle
from corral.contract.events import SpanModelRequestEnd
from corral.contract.session import AgentConfig, SessionInput
from corral.hands import make_execute_activity
from corral.names import ACTIVITY_ARCHIVE_LOG
from corral.temporal import data_converter, start_local_temporal
from modelserver import ModelServerThread
from modelserver.scripts import estimate_input_tokens
from workers.roles import harness_worker, model_worker
from workflows.session import SessionWorkflow

OUTPUT_CHARS = 3_000


def spew(input: dict[str, object]) -> str:
    return f"turn {input.get('turn', '?')}: " + "x" * OUTPUT_CHARS


async def history_bytes(handle: WorkflowHandle) -> tuple[str, int]:
    """The current run's id and its history's size."""
    history = await handle.fetch_history()
    size = sum(event.ByteSize() for event in history.events if event.event_type != EventType.EVENT_TYPE_UNSPECIFIED)
    return history.run_id, size


async def runs(client: Client, session_id: str) -> list[WorkflowHistory]:
    """Every run's history, oldest first."""
    executions = [e async for e in client.list_workflows(f"WorkflowId = '{session_id}'")]
    executions.sort(key=lambda execution: execution.start_time)
    return [await client.get_workflow_handle(session_id, run_id=e.run_id).fetch_history() for e in executions]


def hand_over_seconds(previous: WorkflowHistory, following: WorkflowHistory) -> float:
    """From the archive activity's scheduling in `previous` to the first completed workflow task of `following`:
    the time in which the session was between runs."""
    archived = next(
        e
        for e in previous.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == ACTIVITY_ARCHIVE_LOG
    )
    ready = next(e for e in following.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
    return (ready.event_time.ToDatetime() - archived.event_time.ToDatetime()).total_seconds()


async def replay_seconds(history: WorkflowHistory) -> float:
    replayer = Replayer(workflows=[SessionWorkflow], data_converter=data_converter())
    started = time.perf_counter()
    await replayer.replay_workflow(history)
    return time.perf_counter() - started


async def slice_seconds(handle: WorkflowHandle, after: int, repeat: int = 15) -> float:
    """The median latency of reading 100 events after `after`."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        events = await read_events(handle, after=after, limit=100)
        times.append(time.perf_counter() - started)
        assert len(events) == 100 and events[0].position == after + 1
    return statistics.median(times)


async def run(turns: int, budget: int) -> dict[str, float]:
    env = await start_local_temporal(dev_server_log_level="error")
    server = ModelServerThread()
    server.start()
    suffix = uuid.uuid4().hex[:8]
    harness, model_queue, hand = f"long-harness-{suffix}", f"long-model-{suffix}", f"long-hand-{suffix}"
    window = int(budget * 1.25)
    steps = [
        {"text": "Looking.", "tool_uses": [{"name": "spew", "input": {"turn": 0}}]},
        {"text": "Noted."},
    ]
    server.register("long", {"steps": steps, "loop": True, "max_input_tokens": window})
    model = anthropic.AsyncAnthropic(base_url=server.base_url, api_key="bench", max_retries=0)
    tool = {"type": "hand", "name": "spew", "task_queue": hand, "input_schema": {"type": "object"}}
    try:
        async with (
            harness_worker(env.client, harness),
            model_worker(env.client, model, model_queue),
            Worker(env.client, task_queue=hand, activities=[make_execute_activity({"spew": spew})]),
        ):
            agent = AgentConfig.model_validate(
                {"model": "script:long", "tools": [tool], "context_budget_tokens": budget}
            )
            input = SessionInput(agent=agent, model_task_queue=model_queue, title="bench long")
            handle = await start_session(env.client, input, task_queue=harness)
            run_sizes = dict([await history_bytes(handle)])
            after, sizes, turn_times = 0, [sum(run_sizes.values())], []
            for turn in range(1, turns + 1):
                started = time.perf_counter()
                await send_text(handle, f"turn {turn}: please look again, " + "and note this " * 20)
                after = (await wait_for_idle(handle, after=after, within_seconds=120))[-1].position
                turn_times.append(time.perf_counter() - started)
                run_id, size = await history_bytes(handle)
                run_sizes[run_id] = size
                sizes.append(sum(run_sizes.values()))
                if turn % 100 == 0:
                    print(f"  {turn} turns, {after} events, {len(run_sizes)} runs, history {sizes[-1] / 1e6:.1f} MB")
            events = await read_events(handle)
            last = events[-1].position
            slices = {
                "slice_start": await slice_seconds(handle, 0),
                "slice_middle": await slice_seconds(handle, last // 2),
                "slice_end": await slice_seconds(handle, last - 100),
            }
            histories = await runs(env.client, handle.id)
            hand_overs = [hand_over_seconds(a, b) for a, b in itertools.pairwise(histories)]
            replays = {  # the last complete run: the current one has only begun
                "replay_first": await replay_seconds(histories[0]),
                "replay_last": await replay_seconds(histories[-2] if len(histories) > 1 else histories[0]),
            }
    finally:
        server.stop()
        await env.shutdown()
    window_turns = max(5, turns // 10)
    early = (sizes[window_turns] - sizes[0]) / window_turns
    late = (sizes[-1] - sizes[-1 - window_turns]) / window_turns
    requests = server.book.requests_for("long") or []
    largest = max(estimate_input_tokens(request["body"]) for request in requests)
    usage = [e.model_usage for e in events if isinstance(e, SpanModelRequestEnd)]
    stable = usage[len(usage) // 10 :]
    read = sum(u.cache_read_input_tokens for u in stable)
    total = sum(u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens for u in stable)
    errors = [e for e in events if e.type == "session.error"]
    return {
        **slices,
        **replays,
        "runs": len(histories),
        "first_run_history_events": len(histories[0].events),
        "last_run_history_events": len(histories[-1].events),
        "hand_over_p50": statistics.median(hand_overs) if hand_overs else 0.0,
        "hand_over_max": max(hand_overs, default=0.0),
        "turn_p50": statistics.median(turn_times),
        "turns": turns,
        "events": len(events),
        "budget": budget,
        "window": window,
        "early_bytes_per_turn": early,
        "late_bytes_per_turn": late,
        "largest_request_tokens": largest,
        "requests": len(requests),
        "cache_read_share": read / total if total else 0.0,
        "summaries": sum(e.type == "agent.thread_context_compacted" for e in events),
        "session_errors": len(errors),
    }


def report(figures: dict[str, float]) -> str:
    lines = [
        "| figure | measured | baseline (same run) | ratio | goal |",
        "| --- | ---: | ---: | ---: | --- |",
        f"| history bytes per turn, last 10% of turns vs first 10% | {figures['late_bytes_per_turn']:.0f} "
        f"| {figures['early_bytes_per_turn']:.0f} "
        f"| {figures['late_bytes_per_turn'] / figures['early_bytes_per_turn']:.2f}x | ≤ 1.1x |",
        f"| largest request, input tokens vs the budget | {int(figures['largest_request_tokens'])} "
        f"| {int(figures['budget'])} | {figures['largest_request_tokens'] / figures['budget']:.2f}x | ≤ 1.0x |",
        f"| cache-read share of input tokens (after the first 10% of requests) | "
        f"{figures['cache_read_share']:.0%} | — | — | ≥ 80% |",
        f"| 100-event slice at the end vs at the start (median) | {figures['slice_end'] * 1e3:.1f} ms "
        f"| {figures['slice_start'] * 1e3:.1f} ms | {figures['slice_end'] / figures['slice_start']:.2f}x | ≤ 1.5x |",
        f"| 100-event slice in the middle vs at the start (median) | {figures['slice_middle'] * 1e3:.1f} ms "
        f"| {figures['slice_start'] * 1e3:.1f} ms | {figures['slice_middle'] / figures['slice_start']:.2f}x | ≤ 1.5x |",
        f"| continue-as-new hand-over (p50) vs a turn's p50 | {figures['hand_over_p50'] * 1e3:.0f} ms "
        f"| {figures['turn_p50'] * 1e3:.0f} ms | {figures['hand_over_p50'] / figures['turn_p50']:.2f}x | < 1x |",
        f"| harness restart: replaying the last complete run vs the first | {figures['replay_last']:.2f} s "
        f"| {figures['replay_first']:.2f} s | {figures['replay_last'] / figures['replay_first']:.2f}x | ≈ 1x, < 2 s |",
        "",
        f"{int(figures['runs'])} workflow runs; the first run's history {int(figures['first_run_history_events'])} "
        f"events, the last's {int(figures['last_run_history_events'])}; longest hand-over "
        f"{figures['hand_over_max'] * 1e3:.0f} ms.",
        "",
        f"{int(figures['events'])} events, {int(figures['requests'])} model requests (window "
        f"{int(figures['window'])} tokens), {int(figures['summaries'])} summaries, "
        f"{int(figures['session_errors'])} session errors (a prompt the model refused, then shrunk and retried).",
        "",
        "Token counts are the offline model server's (four characters a token, like the harness's estimate).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=1800, help="about 11 events a turn: 1800 make 20,000 events")
    parser.add_argument("--budget", type=int, default=20_000)
    parser.add_argument("--output", default="long", help="results file name under bench/results/ (without .md)")
    add_run_options(parser)
    args = parser.parse_args()
    begin_run(args.allow_dirty)
    figures = asyncio.run(run(args.turns, args.budget))
    text = report(figures)
    print(text)
    title = f"Long session: {int(figures['turns'])} turns, budget {int(figures['budget'])} tokens"
    print(f"written to {write_results(args.output, title, text, summary=figures)}")


if __name__ == "__main__":
    main()
