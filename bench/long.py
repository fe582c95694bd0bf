"""A long session against a small context budget: does the history stay linear, does every request stay within
the budget, and how much of the input does the prompt cache serve?

One session on the offline model server: every turn the user sends a message, the model calls a tool that prints
3 KB, then answers. The agent's `context_budget_tokens` is small, so the harness elides old tool results and
summarises older turns all along. Figures, each against a baseline from the same run:
- history bytes per turn, the last turns against the first (goal: at most 1.1x);
- the largest request's input tokens against the budget (goal: never over) and the model's window;
- the cache-read share of all input tokens once the prefix is stable (goal: at least 80%);
- how many summaries and elided results it took.

Not measured yet (issue 10 has not built them): slices across continue-as-new runs, hand-over time.

    python -m bench.long [--turns 200] [--budget 20000] [--output long]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import subprocess
import uuid
from datetime import UTC, datetime
from pathlib import Path

import anthropic
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.worker import Worker

from corral.client import read_events, send_text, start_session, wait_for_idle
from corral.contract.events import SpanModelRequestEnd
from corral.contract.session import AgentConfig, SessionInput
from corral.hands import make_execute_activity
from corral.modelserver import ModelServerThread
from corral.modelserver.scripts import estimate_input_tokens
from corral.temporal import start_local_temporal
from workers.roles import harness_worker, model_worker

RESULTS = Path(__file__).parent / "results"
OUTPUT_CHARS = 3_000


def spew(input: dict[str, object]) -> str:
    return f"turn {input.get('turn', '?')}: " + "x" * OUTPUT_CHARS


async def history_bytes(handle: WorkflowHandle) -> int:
    history = await handle.fetch_history()
    return sum(event.ByteSize() for event in history.events if event.event_type != EventType.EVENT_TYPE_UNSPECIFIED)


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
            after, sizes = 0, [await history_bytes(handle)]
            for turn in range(1, turns + 1):
                await send_text(handle, f"turn {turn}: please look again, " + "and note this " * 20)
                after = (await wait_for_idle(handle, after=after, within_seconds=120))[-1].position
                sizes.append(await history_bytes(handle))
                if turn % 50 == 0:
                    print(f"  {turn} turns, history {sizes[-1] / 1e6:.2f} MB", flush=True)
            events = await read_events(handle)
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
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        f"# Long session: {int(figures['turns'])} turns, budget {int(figures['budget'])} tokens",
        "",
        f"{datetime.now(UTC):%Y-%m-%d}, commit {commit}, Python {platform.python_version()}, "
        f"{platform.machine()}; `python -m bench.long --turns {int(figures['turns'])}`.",
        "",
        "| figure | measured | baseline (same run) | ratio | goal |",
        "| --- | ---: | ---: | ---: | --- |",
        f"| history bytes per turn, last 10% of turns vs first 10% | {figures['late_bytes_per_turn']:.0f} "
        f"| {figures['early_bytes_per_turn']:.0f} "
        f"| {figures['late_bytes_per_turn'] / figures['early_bytes_per_turn']:.2f}x | ≤ 1.1x |",
        f"| largest request, input tokens vs the budget | {int(figures['largest_request_tokens'])} "
        f"| {int(figures['budget'])} | {figures['largest_request_tokens'] / figures['budget']:.2f}x | ≤ 1.0x |",
        f"| cache-read share of input tokens (after the first 10% of requests) | "
        f"{figures['cache_read_share']:.0%} | — | — | ≥ 80% |",
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
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--budget", type=int, default=20_000)
    parser.add_argument("--output", default="long", help="results file name under bench/results/ (without .md)")
    args = parser.parse_args()
    figures = asyncio.run(run(args.turns, args.budget))
    text = report(figures)
    print(text)
    (RESULTS / f"{args.output}.md").write_text(text)


if __name__ == "__main__":
    main()
