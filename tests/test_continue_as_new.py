"""A session outlives its workflow runs and its payloads outgrow Temporal's: neither shows.

It continues as new as its history grows, without a seam, and anything too large for history lives in the blob
store.

Each test gives the session a low `continue_as_new_after_events` so that it hands over many times. What must hold
across every hand-over: no message lost or taken twice (including the ones sent while it happens), one log with
positions 1..N whose slices equal the same slices of the whole, and whatever was in flight (a custom tool call
waiting for its result, the sandbox with its workspace) carries on in the next run.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import docker
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from cli.session_ops import list_sessions, sessions_query
from corral.client import fork_session, read_events, send_events, send_text, session_info, update_session
from corral.contract.events import RequiresAction, SessionEvent, UserMessage
from corral.contract.session import DEFAULT_RUN_HISTORY_EVENTS, SessionInput, UpdateSessionInput
from corral.names import SIGNAL_USER_MESSAGE
from tests.conftest import Stack, assert_log_is_whole, stop_reason, texts, wait_for_idle

RUN_EVENTS = 200
"""The smallest hand-over threshold a session accepts: a few turns per run."""
ROUNDS = 200
"""Bursts of six messages, answered with a tool call each time: over 3,000 events."""


async def runs_of(client: Client, handle: WorkflowHandle) -> list[tuple[WorkflowExecutionStatus | None, str]]:
    """Each workflow run of the session, oldest first: its status, and where the run before it handed over."""
    executions = [e async for e in client.list_workflows(f"WorkflowId = '{handle.id}'")]
    runs = []
    for execution in sorted(executions, key=lambda e: e.start_time):
        history = client.get_workflow_handle(handle.id, run_id=execution.run_id).fetch_history_events()
        started = (await anext(history)).workflow_execution_started_event_attributes
        (input,) = await client.data_converter.decode(started.input.payloads, [SessionInput])
        runs.append((execution.status, input.carry.phase if input.carry else "start"))
    return runs


def assert_slices_equal(whole: list[SessionEvent], read: dict[tuple[int, int], list[SessionEvent]]) -> None:
    for (after, before), events in read.items():
        expected = [e.model_dump() for e in whole if after < e.position < before]
        assert [e.model_dump() for e in events] == expected, f"slice ({after}, {before})"


async def test_messages_sent_during_hand_overs_are_each_answered_once(stack: Stack) -> None:
    use_tool = {"text": "Using the tool.", "tool_uses": [{"name": "echo", "input": {"text": "x"}}]}
    model = stack.script([use_tool, {"text": "Reply.", "echo_last_user": True}], loop=True)
    tools = [stack.hand_tool("echo", text={"type": "string"})]
    handle = await stack.start(model, agent={"model": model, "tools": tools}, continue_as_new_after_events=RUN_EVENTS)
    sent: list[str] = []
    for round_ in range(ROUNDS):
        # A burst: updates (with client ids, one of them sent twice) and fire-and-forget signals, all at once.
        batch = [f"round {round_} message {i}" for i in range(6)]
        sends: list[Any] = [send_text(handle, text, client_id=text) for text in batch[:4]]
        sends.append(send_text(handle, batch[0], client_id=batch[0]))  # a resend: the same event, not a new one
        sends += [handle.signal(SIGNAL_USER_MESSAGE, {"content": text, "id": text}) for text in batch[4:]]
        random.shuffle(sends)
        await asyncio.gather(*sends)
        sent += batch
        # The next burst right as this one is answered: when the session hands over, it is at that moment.
        await _until_all_answered(handle, sent)

    events = await _until_all_answered(handle, sent)
    info = await session_info(handle)
    assert info.run > 5, f"the session should have continued as new many times, it is in run {info.run}"
    assert_log_is_whole(events)
    assert len(events) > 3_000
    messages = [e for e in events if isinstance(e, UserMessage)]
    assert sorted(m.client_id or "" for m in messages) == sorted(sent), "each message once, none lost"
    assert all(m.processed_at is not None for m in messages), "every message was processed"
    seen = str([r["body"]["messages"] for r in stack.requests(model)])
    assert all(text in seen for text in sent), "the model saw every message"

    # One log, sliced anywhere, the same as the whole (the early slices come from the archive).
    last = events[-1].position
    bounds = [(0, 40), (35, 160), (info.archived_through - 20, info.archived_through + 20), (last - 50, last + 1)]
    read = {(a, b): await read_events(handle, after=a, before=b) for a, b in bounds}
    assert_slices_equal(events, read)
    through = info.archived_through  # the session may hand over once more while idle: the log is the same
    across = await read_events(handle, after=through - 5, limit=20)
    expected = [position for position in range(through - 4, through + 16) if position <= last]
    assert [e.position for e in across] == expected, "a limit across the boundary"
    typed = await read_events(handle, types=["user.message"], limit=30)
    assert [e.model_dump() for e in typed] == [m.model_dump() for m in messages[:30]]
    # The CLI reads the same one log: `corral events` and `corral export`, across every run.
    address = stack.client.service_client.config.target_host
    cli = [sys.executable, "-m", "cli.main", "--address", address]
    shown = await asyncio.to_thread(
        subprocess.run, [*cli, "events", handle.id, "--json"], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    exported = await asyncio.to_thread(subprocess.run, [*cli, "export", handle.id], capture_output=True, text=True)
    assert exported.returncode == 0 and exported.stdout == shown.stdout, exported.stderr
    logged = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [e["position"] for e in logged[:last]] == list(range(1, last + 1))
    assert [e["id"] for e in logged[:last]] == [e.id for e in events]
    runs = await runs_of(stack.client, handle)
    statuses = [status for status, _ in runs]
    assert statuses[:-1] == [WorkflowExecutionStatus.CONTINUED_AS_NEW] * (len(runs) - 1)
    assert statuses[-1] == WorkflowExecutionStatus.RUNNING and len(runs) == info.run
    phases = {phase for _, phase in runs[1:]}
    assert phases == {"idle", "turn"}, f"hand-overs both between turns and inside one: {phases}"
    details = await (await handle.describe()).static_details()
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    current = metadata.current_details  # what the Web UI shows
    assert details is None and "**tools** echo" in current and f"run {info.run} (positions" in current
    listed = await list_sessions(stack.client, sessions_query(None), limit=1000)
    assert [row[0] for row in listed].count(handle.id) == 1, "`corral ls` lists the session once"

    # A fork at a position of an earlier run copies it from the archive.
    at = info.archived_through - 10
    fork = await fork_session(stack.client, handle.id, at)
    stack.started.append(fork)
    forked = await read_events(fork, before=at + 1)
    assert [e.model_dump() for e in forked] == [e.model_dump() for e in events[:at]]


async def _until_all_answered(handle: WorkflowHandle, sent: list[str]) -> list[SessionEvent]:
    async with asyncio.timeout(180):
        while True:
            events = await read_events(handle)
            info = await session_info(handle)
            processed = [e for e in events if isinstance(e, UserMessage) and e.processed_at is not None]
            if info.status == "idle" and info.queued_user_events == 0 and len(processed) >= len(sent):
                return events
            await asyncio.sleep(0.05)


async def test_a_custom_tool_wait_and_the_sandbox_carry_over(
    sandbox_stack: Stack, docker_client: docker.DockerClient
) -> None:
    stack = sandbox_stack
    write = {"tool_uses": [{"name": "bash", "input": {"command": "echo kept-across-runs > /workspace/a.txt"}}]}
    ask = {"tool_uses": [{"name": "ask_client", "input": {"question": "go on?"}}]}
    read = {"tool_uses": [{"name": "bash", "input": {"command": "cat /workspace/a.txt"}}]}
    model = stack.script([write, ask, read, {"text": "done"}])
    tools = [{"type": "agent_toolset_20260401"}, {"type": "custom", "name": "ask_client"}]
    handle = await stack.start(
        model, "start", agent={"model": model, "tools": tools}, continue_as_new_after_events=RUN_EVENTS
    )
    waiting = await wait_for_idle(handle, within_seconds=120)
    requires = stop_reason(waiting[-1])
    assert isinstance(requires, RequiresAction)
    (use_id,) = requires.event_ids

    # While the session waits, its history grows (signals it drops: empty messages) until it hands over.
    async with asyncio.timeout(90):
        while (await session_info(handle)).run == 1:
            await handle.signal(SIGNAL_USER_MESSAGE, {"content": " "})
            await asyncio.sleep(0.02)
    info = await session_info(handle)
    assert info.run > 1 and info.status == "idle" and info.stop_reason == "requires_action", info

    await send_events(handle, [{"type": "user.custom_tool_result", "custom_tool_use_id": use_id, "content": "yes"}])
    done = await wait_for_idle(handle, after=waiting[-1].position, within_seconds=120)
    assert stop_reason(done[-1]).type == "end_turn" and texts(done)[-1] == "done"
    outputs = texts(done, "agent.tool_result")
    assert outputs and "kept-across-runs" in outputs[-1], "the same workspace, read in the new run"
    history = (await handle.fetch_history()).to_json()
    assert "provision_sandbox" not in history, "the new run uses the sandbox the old one made"
    events = await read_events(handle)
    assert_log_is_whole(events)
    assert [e.type for e in events].count("agent.custom_tool_use") == 1
    assert sum(1 for e in events if e.type == "user.custom_tool_result") == 1


SENDS = 2_500
"""Past Temporal's limit of 2,000 updates per workflow run."""


async def test_more_sends_than_a_run_takes_are_all_accepted(stack: Stack) -> None:
    model = stack.script([{"text": "Reply.", "echo_last_user": True}], loop=True)
    handle = await stack.start(model)
    first_run = len((await handle.fetch_history()).events)
    texts_sent = [f"send {i}" for i in range(SENDS)]
    ids: list[str] = []
    for start in range(0, SENDS, 5):  # 5 clients at a time, like `corral send` from scripts
        batch = texts_sent[start : start + 5]
        ids += await asyncio.gather(*(send_text(handle, text, client_id=text) for text in batch))
    assert len(set(ids)) == SENDS and all(ids), "every send accepted, each its own event"

    events = await _until_all_answered(handle, texts_sent)
    messages = [e for e in events if isinstance(e, UserMessage)]
    assert sorted(m.client_id or "" for m in messages) == sorted(texts_sent), "each send once"
    assert {m.client_id: m.id for m in messages} == dict(zip(texts_sent, ids, strict=True)), "under the ids returned"
    seen = str([r["body"]["messages"] for r in stack.requests(model)])
    assert all(f"'{text}'" in seen for text in texts_sent[-50:]), "the model saw the last messages"
    info = await session_info(handle)
    assert info.run >= 3, info
    # What a harness restart replays is the current run's history: as short at the end as in the first run's
    # terms (bench/long.py times the replays themselves).
    current = len((await handle.fetch_history()).events)
    assert current <= DEFAULT_RUN_HISTORY_EVENTS + 200 and first_run < 50, (first_run, current)


DOCUMENT_BYTES = 10 * 1024 * 1024
TEMPORAL_PAYLOAD_LIMIT = 2 * 1024 * 1024


async def test_a_10_mb_document_and_a_50_mb_tool_output_stay_out_of_history(
    sandbox_stack: Stack, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    stack = sandbox_stack
    spew = {"tool_uses": [{"name": "bash", "input": {"command": "yes | head -c 50000000"}}]}
    model = stack.script([{"text": "Got the document."}, spew, {"text": "Printed."}])
    handle = await stack.start(model, agent={"model": model, "tools": [{"type": "agent_toolset_20260401"}]})
    document = base64.b64encode(random.randbytes(DOCUMENT_BYTES * 3 // 4)).decode()
    block = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": document}}
    await send_events(handle, [{"type": "user.message", "content": [{"type": "text", "text": "read"}, block]}])
    first = await wait_for_idle(handle, within_seconds=120)
    assert stop_reason(first[-1]).type == "end_turn" and texts(first)[-1] == "Got the document."
    await send_text(handle, "now print a lot")
    second = await wait_for_idle(handle, after=first[-1].position, within_seconds=180)
    assert stop_reason(second[-1]).type == "end_turn" and texts(second)[-1] == "Printed."

    events = await read_events(handle)
    (message,) = [e for e in events if isinstance(e, UserMessage) and len(e.content) == 2]
    assert message.content[1].model_dump()["source"]["data"] == document, "the log returns the whole document"
    (output,) = texts(events, "agent.tool_result")
    assert output.startswith("y\ny\n") and len(output) < 101_000, "the model got the hand's head and tail of 50 MB"
    assert "of 50000000 bytes cut; the whole output is kept: `corral output" in output, "and where the rest is"
    (use,) = [e for e in events if e.type == "agent.tool_use"]
    address = stack.client.service_client.config.target_host
    cli = [sys.executable, "-m", "cli.main", "--address", address, "output", handle.id]
    kept = await asyncio.to_thread(subprocess.run, [*cli, use.id, "-o", str(tmp_path / "o")], capture_output=True)
    assert kept.returncode == 0, kept.stderr
    assert (tmp_path / "o").read_bytes() == b"y\n" * 25_000_000, "the whole 50 MB, kept out of history"
    missing = await asyncio.to_thread(subprocess.run, [*cli, "sevt_nothing"], capture_output=True, text=True)
    assert missing.returncode == 1 and "no whole output is kept for sevt_nothing" in missing.stderr
    asked = str(stack.requests(model)[0]["body"]["messages"])
    assert document[:1000] not in asked and "too large for the model's context" in asked
    history = await handle.fetch_history()
    largest = max(event.ByteSize() for event in history.events)
    assert largest < TEMPORAL_PAYLOAD_LIMIT // 4, f"a history event of {largest} bytes"


async def test_an_idle_session_hands_over_when_renames_and_signals_grow_its_history(stack: Stack) -> None:
    """Idle, a session still continues as new when what it takes without a turn (renames, dropped signals) has
    grown its run's history; a rename that meets the hand-over is sent again and lands in the next run."""
    model = stack.script([{"text": "hi"}, {"text": "yes"}])
    handle = await stack.start(model, "hello", continue_as_new_after_events=RUN_EVENTS)
    events = await wait_for_idle(handle)
    renames = 0
    async with asyncio.timeout(120):
        while (await session_info(handle)).run < 3:
            renames += 1
            await asyncio.gather(
                update_session(handle, UpdateSessionInput(title_set=True, title=f"name {renames}")),
                handle.signal(SIGNAL_USER_MESSAGE, {"content": " "}),  # dropped (empty), yet in history
            )
    info = await session_info(handle)
    assert (info.run, info.status, info.title) == (3, "idle", f"name {renames}"), info
    assert await read_events(handle) == events, "nothing was written to the log, in any run"
    await send_text(handle, "still there?")
    after = await wait_for_idle(handle, after=events[-1].position)
    assert stop_reason(after[-1]).type == "end_turn"
