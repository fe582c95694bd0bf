"""The actant arm of `bench.capacity` and `bench.ttft`: run by the peer's own virtualenv (`bench/peers/actant.txt`),
never imported by corral, so it imports nothing of corral's.

    python bench/peers/actant_arm.py --address HOST:PORT --model-url URL [--model script:NAME]

One process, as actant's own quickstart runs it: an `AgentRuntime` worker on the Temporal server at `--address`, with
actant's in-memory stores and in-memory event publisher (a single process is the only way its in-memory event
source reaches a client), and the clients. The model is actant's `AnthropicProvider` on the Anthropic SDK pointed
at corral's offline model server, which plays the script the benchmark registered (each tool call's id made unique,
as a real model's are: `UniqueToolIds`).

It reads one request per line on stdin, `{"id": N, "command": ..., ...}`, and answers each with one JSON line on
stdout carrying the same `id`; requests run concurrently, so answers come in the order they finish.

- `step` (`bench.capacity`), `{"sessions": N, "seconds": S, "min_turns": K}`: per session, the turns done as
  `[ttft, latency]` (seconds; ttft is the message sent -> the first `text_delta` event at the client, latency the
  message sent -> the run's `complete` event), and what the thread's persisted messages say was lost or
  duplicated (one user message per message sent, one tool result and one final answer per turn done). Each
  session is a new thread (the `--model` script, a `calculate` tool); its turns go back to back until `seconds`
  have passed and at least `min_turns` are done.
- `ttft` (`bench.ttft`), `{"model": "script:NAME", "first": TEXT, "next": TEXT, "think": S}`: a new thread's first
  message, then, `think` seconds after its run completed, its next one; each timed at the client like a step's
  turn, with wall-clock stamps (`sent`, `client`: the first `text_delta`) so the benchmark can place the model
  server's arrival time between them. The thread's agent answers with the thread's own script; its `bash` tool
  runs the command (split into words, no shell) in a fresh directory of its own: actant has no sandbox here.
  The answer also counts the thread's stored messages by kind, for the benchmark's check.
- `close`, `{"threads": [...]}`: cancel those threads' workflows (after the timed work, as corral's are ended).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import json
import logging
import operator
import shlex
import sys
import tempfile
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
"""The `step` threads' agent: the `--model` script, the `calculate` tool."""
TTFT_AGENT = "ttft"
"""The `ttft` threads' agent: each thread's own script, the `bash` tool."""
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


@tool
async def bash(command: str) -> str:
    """Run a command (split into words, no shell) in a fresh directory; its exit status and output."""
    with tempfile.TemporaryDirectory(prefix="actant-ttft-") as workspace:
        process = await asyncio.create_subprocess_exec(
            *shlex.split(command), cwd=workspace, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        output, _ = await process.communicate()
    return f"exit {process.returncode}\n{output.decode(errors='replace')}"


async def turn(runtime: AgentRuntime, agent: str, thread_id: str, text: str) -> dict[str, float | None]:
    """One message, timed at the client from the live events (subscribed before sending): `latency` (sent ->
    the run's `complete`), `ttft` (sent -> the first `text_delta`, None if none) and the wall-clock `sent` and
    `client` (that first delta). A thread's run ends with its `complete` event (published twice, the second one
    may reach the next turn's subscription), so the turn follows only the run whose `user_message` event carries
    this message."""
    thread = runtime.thread(agent, thread_id)
    first: float | None = None
    first_wall: float | None = None
    events = thread.events()
    pending = asyncio.ensure_future(events.__anext__())
    await asyncio.sleep(0)  # the subscription's queue is registered once its first __anext__ has run
    sent_wall, sent = time.time(), time.monotonic()
    await thread.send(text)
    run = None
    try:
        while True:
            event = await pending
            if event.type == "user_message" and event.data.get("content") == text:
                run = event.data.get("run_id")
            elif run is not None and event.data.get("run_id") == run:
                if event.type == "text_delta" and first is None:
                    first, first_wall = time.monotonic(), time.time()
                elif event.type == "error":
                    raise RuntimeError(f"actant error event: {event.data}")
                elif event.type == "complete":
                    return {
                        "latency": time.monotonic() - sent,
                        "ttft": None if first is None else first - sent,
                        "sent": sent_wall,
                        "client": first_wall,
                    }
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
            text = f"turn {len(turns) + 1} ({uuid.uuid4().hex[:8]}): please run the tool"
            timed = await turn(runtime, AGENT, thread_id, text)
            turns.append([timed["ttft"], timed["latency"]])
    except Exception as exc:  # reported with the results, never hidden
        problem = f"turn {len(turns) + 1}: {type(exc).__name__}: {exc}"
    counts = await message_counts(runtime, AGENT, thread_id)
    sent, done = len(turns) + (1 if problem else 0), len(turns)
    users, answers, results = counts["user"], counts["answer"], counts["tool"]
    return {
        "turns": turns,
        "problem": problem,
        "lost": max(0, sent - users) + max(0, done - results) + max(0, done - answers),
        "duplicated": max(0, users - sent) + max(0, results - done) + max(0, answers - done),
    }


async def message_counts(runtime: AgentRuntime, agent: str, thread_id: str) -> dict[str, int]:
    """The thread's stored messages: user messages, final answers (assistant, no tool call) and tool results."""
    messages = await runtime.stores.messages.list_for_thread(agent, thread_id)
    return {
        "user": sum(1 for m in messages if m.role == "user"),
        "answer": sum(1 for m in messages if m.role == "assistant" and not m.tool_calls),
        "tool": sum(1 for m in messages if m.role == "tool"),
    }


async def ttft_session(runtime: AgentRuntime, models: dict[str, str], request: dict[str, Any]) -> dict[str, Any]:
    """A new thread's first message and, `think` seconds after its run completed, the next one."""
    thread_id = str(uuid.uuid4())
    models[thread_id] = request["model"]
    answer: dict[str, Any] = {"thread": thread_id, "problem": None}
    try:
        answer["first"] = await turn(runtime, TTFT_AGENT, thread_id, request["first"])
        await asyncio.sleep(request["think"])
        answer["next"] = await turn(runtime, TTFT_AGENT, thread_id, request["next"])
    except Exception as exc:  # reported with the results, never hidden
        answer["problem"] = f"{type(exc).__name__}: {exc}"
    answer["messages"] = await message_counts(runtime, TTFT_AGENT, thread_id)
    return answer


async def close(runtime: AgentRuntime, threads: list[str]) -> dict[str, Any]:
    for thread_id in threads:
        with contextlib.suppress(Exception):  # already over
            await runtime.thread(TTFT_AGENT, thread_id).cancel()
    return {"closed": len(threads)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", required=True)
    parser.add_argument("--model-url", required=True)
    parser.add_argument("--model", help="the `step` threads' model, script:NAME")
    parser.add_argument("--task-queue", default=f"actant-bench-{uuid.uuid4().hex[:8]}")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sdk = anthropic.AsyncAnthropic(base_url=args.model_url, api_key="offline")
    models: dict[str, str] = {}
    """The `ttft` threads' scripts, by thread id."""
    capacity = AgentDefinition(
        id=AGENT,
        name="Capacity",
        persona="You answer with a tool.",
        llm=UniqueToolIds(args.model or "script:none", client=sdk),
        tools=ToolRegistry([calculate]),
    )
    agents: dict[str, AgentDefinition] = {}
    """The `ttft` threads' agents, made once per thread (as the `step` threads share one)."""

    async def resolve_agent(agent_id: str, thread_id: str) -> AgentDefinition:
        if agent_id == AGENT and args.model:
            return capacity
        if agent_id == TTFT_AGENT and thread_id in models:
            if thread_id not in agents:
                llm = UniqueToolIds(models[thread_id], client=sdk)
                persona = "You look before you answer."
                tools = ToolRegistry([bash])
                agents[thread_id] = AgentDefinition(id=TTFT_AGENT, name="TTFT", persona=persona, llm=llm, tools=tools)
            return agents[thread_id]
        raise KeyError(agent_id)

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
    running: set[asyncio.Task[None]] = set()

    async def answer(request: dict[str, Any]) -> None:
        command = request.get("command")
        try:
            if command == "step":
                began = time.monotonic()
                sessions = await asyncio.gather(
                    *(session(runtime, request["seconds"], request["min_turns"]) for _ in range(request["sessions"]))
                )
                result: dict[str, Any] = {"sessions": sessions, "wall": time.monotonic() - began}
            elif command == "ttft":
                result = await ttft_session(runtime, models, request)
            elif command == "close":
                result = await close(runtime, request["threads"])
            else:
                result = {"error": f"unknown command {command!r}"}
        except Exception as exc:  # the benchmark reports it
            result = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps({"id": request.get("id"), **result}), flush=True)

    try:
        print(json.dumps({"ready": True}), flush=True)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            task = asyncio.create_task(answer(json.loads(line)))
            running.add(task)
            task.add_done_callback(running.discard)
        await asyncio.gather(*running)
    finally:
        await runtime.shutdown()
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker


if __name__ == "__main__":
    asyncio.run(main())
