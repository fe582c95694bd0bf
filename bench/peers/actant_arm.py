"""The actant arm of `bench.capacity`: run by the peer's own virtualenv (`bench/peers/actant.txt`), never imported
by corral, so it imports nothing of corral's.

    python bench/peers/actant_arm.py --address HOST:PORT --model-url URL --model script:NAME

One process, as actant's own quickstart runs it: an `AgentRuntime` worker on the Temporal server at `--address`, with
actant's in-memory stores and in-memory event publisher (a single process is the only way its in-memory event
source reaches a client), and the clients. The model is actant's `AnthropicProvider` on the Anthropic SDK pointed
at corral's offline model server, which plays the same script as corral's arm: a preamble, a `calculate` tool call,
an answer (each tool call's id made unique, as a real model's are: `UniqueToolIds`).

It reads one step per line on stdin, `{"sessions": N, "seconds": S, "min_turns": K}`, and answers with one JSON
line on stdout: per session, the turns done as `[ttft, latency]` (seconds; ttft is the message sent -> the first
`text_delta` event at the client, latency the message sent -> the run's `complete` event), and what the thread's
persisted messages say was lost or duplicated (one user message per message sent, one tool result and one
final answer per turn done). Each session is a new thread; its turns go back to back until
`seconds` have passed and at least `min_turns` are done.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import json
import logging
import operator
import sys
import time
import uuid
from typing import Any

import anthropic
from actant import AgentDefinition, tool
from actant.llm.messages import Message
from actant.llm.providers.anthropic import AnthropicProvider
from actant.runtime import AgentRuntime, TemporalRuntimeConfig
from actant.runtime.stores import InMemoryRuntimeStores
from actant.tools import ToolRegistry
from temporalio.client import Client

AGENT = "capacity"
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _arithmetic(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](_arithmetic(node.left), _arithmetic(node.right))
    raise ValueError("only + - * / on numbers")


class UniqueToolIds(AnthropicProvider):
    """actant's Anthropic provider, with each tool call's id made unique. The offline model server gives a looping
    script's tool call the same id on every turn, and actant keeps a tool call by its id: from the second turn on it
    would find the call already done and not run it. A real model's ids are unique, so this keeps the work real."""

    async def complete(self, *args: Any, **kwargs: Any) -> Message:
        message = await super().complete(*args, **kwargs)
        for call in message.tool_calls or []:
            call.id = f"{call.id}_{uuid.uuid4().hex[:12]}"
        return message


@tool
async def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression (the same tool call as corral's utility hand answers)."""
    return str(_arithmetic(ast.parse(expression, mode="eval").body))


async def turn(runtime: AgentRuntime, thread_id: str, number: int) -> tuple[float, float | None]:
    """One message, timed at the client from the live events (subscribed before sending). A thread's run ends with
    its `complete` event (published twice, the second one may reach the next turn's subscription), so the turn
    follows only the run whose `user_message` event carries this message."""
    thread = runtime.thread(AGENT, thread_id)
    text = f"turn {number} ({uuid.uuid4().hex[:8]}): please run the tool"
    first: float | None = None
    events = thread.events()
    pending = asyncio.ensure_future(events.__anext__())
    await asyncio.sleep(0)  # the subscription's queue is registered once its first __anext__ has run
    sent = time.monotonic()
    await thread.send(text)
    run = None
    try:
        while True:
            event = await pending
            if event.type == "user_message" and event.data.get("content") == text:
                run = event.data.get("run_id")
            elif run is not None and event.data.get("run_id") == run:
                if event.type == "text_delta" and first is None:
                    first = time.monotonic()
                elif event.type == "error":
                    raise RuntimeError(f"actant error event: {event.data}")
                elif event.type == "complete":
                    return time.monotonic() - sent, None if first is None else first - sent
            pending = asyncio.ensure_future(events.__anext__())
    finally:
        pending.cancel()
        await events.aclose()


async def session(runtime: AgentRuntime, seconds: float, min_turns: int) -> dict[str, Any]:
    thread_id = str(uuid.uuid4())
    deadline = time.monotonic() + seconds
    turns: list[list[float | None]] = []
    problem = None
    try:
        while time.monotonic() < deadline or len(turns) < min_turns:
            latency, ttft = await turn(runtime, thread_id, len(turns) + 1)
            turns.append([ttft, latency])
    except Exception as exc:  # reported with the results, never hidden
        problem = f"turn {len(turns) + 1}: {type(exc).__name__}: {exc}"
    messages = await runtime.stores.messages.list_for_thread(AGENT, thread_id)
    users = sum(1 for m in messages if m.role == "user")
    answers = sum(1 for m in messages if m.role == "assistant" and not m.tool_calls)
    results = sum(1 for m in messages if m.role == "tool")
    sent, done = len(turns) + (1 if problem else 0), len(turns)
    return {
        "turns": turns,
        "problem": problem,
        "lost": max(0, sent - users) + max(0, done - results) + max(0, done - answers),
        "duplicated": max(0, users - sent) + max(0, results - done) + max(0, answers - done),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", required=True)
    parser.add_argument("--model-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--task-queue", default=f"actant-capacity-{uuid.uuid4().hex[:8]}")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    llm = UniqueToolIds(args.model, client=anthropic.AsyncAnthropic(base_url=args.model_url, api_key="offline"))
    agent = AgentDefinition(
        id=AGENT, name="Capacity", persona="You answer with a tool.", llm=llm, tools=ToolRegistry([calculate])
    )

    async def resolve_agent(agent_id: str, thread_id: str) -> AgentDefinition:
        if agent_id != AGENT:
            raise KeyError(agent_id)
        return agent

    stores = InMemoryRuntimeStores()
    client = await Client.connect(args.address)
    runtime = AgentRuntime(
        client=client,
        stores=stores,
        config=TemporalRuntimeConfig(address=args.address, task_queue=args.task_queue),
        resolve_agent=resolve_agent,
        event_source=stores.publisher,
        event_sink=stores.publisher,
    )
    worker = asyncio.create_task(runtime.run_worker())
    loop = asyncio.get_running_loop()
    try:
        print(json.dumps({"ready": True}), flush=True)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            step = json.loads(line)
            began = time.monotonic()
            sessions = await asyncio.gather(
                *(session(runtime, step["seconds"], step["min_turns"]) for _ in range(step["sessions"]))
            )
            print(json.dumps({"sessions": sessions, "wall": time.monotonic() - began}), flush=True)
    finally:
        await runtime.shutdown()
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker


if __name__ == "__main__":
    asyncio.run(main())
