"""How much a corral turn adds to the model's own latency, measured side by side in one run.

Arms, on the same offline model server (configurable first-token latency and token rate):
  direct   the `anthropic` SDK streams straight from the model server (the floor)
  session  a message sent to a running session with the `send_events` update, until the
           `agent.message` is in the log (update, workflow task, activity dispatch, streaming, event append)

Prints p50/p95 per arm and the ratio session / direct. Usage: `python -m bench.turn_latency --turns 30`.
The figures are ratios against a baseline measured in the same run: absolute times on shared machines move.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import anthropic
from temporalio.testing import WorkflowEnvironment

from bench._report import add_run_options, begin_run, write_results
from corral.client import read_events, send_text, start_session, wait_for_idle
from corral.contract.session import AgentConfig, SessionInput
from corral.temporal import start_local_temporal
from modelserver import ModelServerThread
from workers.roles import harness_worker, model_worker


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def direct_arm(base_url: str, model: str, turns: int) -> list[float]:
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key="bench", max_retries=0)
    times = []
    for turn in range(turns):
        started = time.perf_counter()
        messages = [{"role": "user", "content": f"turn {turn}"}]
        async with client.messages.stream(model=model, max_tokens=256, messages=messages) as stream:  # type: ignore[arg-type]
            await stream.get_final_message()
        times.append(time.perf_counter() - started)
    return times


async def session_arm(env: WorkflowEnvironment, base_url: str, model: str, turns: int) -> list[float]:
    suffix = uuid.uuid4().hex[:8]
    harness_queue, model_queue = f"bench-harness-{suffix}", f"bench-model-{suffix}"
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key="bench", max_retries=0)
    times = []
    async with harness_worker(env.client, harness_queue), model_worker(env.client, client, model_queue):
        input = SessionInput(agent=AgentConfig(model=model), model_task_queue=model_queue)
        handle = await start_session(env.client, input, task_queue=harness_queue)
        after = 0
        for turn in range(turns):
            started = time.perf_counter()
            await send_text(handle, f"turn {turn}")
            while True:
                events = await read_events(handle, after=after, types=["agent.message"])
                if events:
                    break
                await asyncio.sleep(0.005)
            times.append(time.perf_counter() - started)
            after = (await wait_for_idle(handle, after=after))[-1].position
        await handle.terminate("benchmark done")
    return times


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--first-token-latency", type=float, default=0.3, help="seconds (default 0.3)")
    parser.add_argument("--tokens-per-second", type=float, default=200.0, help="default 200")
    parser.add_argument("--output", default="turn_latency", help="results file name in bench/results/")
    add_run_options(parser)
    args = parser.parse_args()
    begin_run(args.allow_dirty)
    server = ModelServerThread(first_token_latency=args.first_token_latency, tokens_per_second=args.tokens_per_second)
    base_url = server.start()
    server.register("bench", {"steps": [{"text": "a short answer of about twelve words to stream back"}], "loop": True})
    env = await start_local_temporal()
    try:
        direct = await direct_arm(base_url, "script:bench", args.turns)
        session = await session_arm(env, base_url, "script:bench", args.turns)
    finally:
        await env.shutdown()
        server.stop()
    lines = [
        f"Model server: first token {args.first_token_latency} s, {args.tokens_per_second:g} tokens/s; "
        f"{args.turns} turns per arm.",
        "",
        "| arm | p50 s | p95 s | mean s |",
        "| :--- | ---: | ---: | ---: |",
    ]
    for name, values in (("direct", direct), ("session", session)):
        p50, p95, mean = percentile(values, 0.5), percentile(values, 0.95), statistics.mean(values)
        lines.append(f"| {name} | {p50:.3f} | {p95:.3f} | {mean:.3f} |")
    ratio_p50 = percentile(session, 0.5) / percentile(direct, 0.5)
    ratio_p95 = percentile(session, 0.95) / percentile(direct, 0.95)
    lines += ["", f"session / direct: p50 {ratio_p50:.2f}, p95 {ratio_p95:.2f}"]
    body = "\n".join(lines)
    print(body)
    summary = {
        "turns": args.turns,
        "direct_p50": percentile(direct, 0.5),
        "session_p50": percentile(session, 0.5),
        "ratio_p50": ratio_p50,
        "ratio_p95": ratio_p95,
    }
    title = "Turn latency: a session vs the direct model call"
    print(f"written to {write_results(args.output, title, body, summary=summary)}")


if __name__ == "__main__":
    asyncio.run(main())
