"""The real `temporal` binary drives a session with plain JSON: start, signal, update, query."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType

from corral.client import send_text
from corral.temporal import temporal_binary
from tests.conftest import Stack, texts, unique, wait_for_idle


def _temporal(stack: Stack, *args: str) -> Any:
    address = stack.client.service_client.config.target_host
    command = [temporal_binary(), *args, "--address", address, "-o", "json"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout) if completed.stdout.strip() else None


async def _events(stack: Stack, session_id: str, after: int = 0) -> list[dict[str, Any]]:
    answer = await asyncio.to_thread(
        _temporal, stack, "workflow", "query", "--workflow-id", session_id, "--name", "events",
        "--input", json.dumps({"after": after}),
    )  # fmt: skip
    events: list[dict[str, Any]] = answer["queryResult"][0]["events"]
    return events


async def _until_idle(stack: Stack, session_id: str, count: int) -> list[dict[str, Any]]:
    for _ in range(200):
        events = await _events(stack, session_id)
        if [e["type"] for e in events].count("session.status_idle") >= count:
            return events
        await asyncio.sleep(0.1)
    raise AssertionError("session did not become idle")


async def test_temporal_cli_starts_signals_and_queries_a_session(stack: Stack) -> None:
    model = stack.script([{"text": "hello from the CLI"}, {"text": "echo:", "echo_last_user": True}])
    session_id = unique("sesn_cli")
    start_input = {"agent": {"model": model}, "message": "hi", "model_task_queue": stack.model_queue}
    await asyncio.to_thread(
        _temporal, stack, "workflow", "start", "--type", "SessionWorkflow", "--task-queue", stack.harness_queue,
        "--workflow-id", session_id, "--input", json.dumps(start_input),
    )  # fmt: skip
    stack.started.append(stack.client.get_workflow_handle(session_id))
    events = await _until_idle(stack, session_id, 1)
    assert [e["type"] for e in events][-2:] == ["agent.message", "session.status_idle"]
    assert events[-2]["content"][0]["text"] == "hello from the CLI"

    await asyncio.to_thread(
        _temporal, stack, "workflow", "signal", "--workflow-id", session_id, "--name", "user_message",
        "--input", json.dumps({"content": "signalled"}),
    )  # fmt: skip
    events = await _until_idle(stack, session_id, 2)
    assert events[-2]["content"][0]["text"] == "echo:\nsignalled"

    answer = await asyncio.to_thread(
        _temporal, stack, "workflow", "update", "execute", "--workflow-id", session_id, "--name", "send_events",
        "--input", json.dumps({"events": [{"type": "user.interrupt"}]}),
    )  # fmt: skip
    assert answer["result"]["event_ids"][0].startswith("sevt_")

    info = await asyncio.to_thread(
        _temporal, stack, "workflow", "query", "--workflow-id", session_id, "--name", "session"
    )
    assert info["queryResult"][0]["status"] == "idle"
    assert info["queryResult"][0]["turns"] == 2

    query = f"WorkflowId='{session_id}' AND CorralStatus='idle' AND CorralModel='{model}'"
    for _ in range(50):  # visibility is eventually consistent
        listed = await asyncio.to_thread(_temporal, stack, "workflow", "list", "--query", query)
        if listed:
            break
        await asyncio.sleep(0.1)
    assert [w["execution"]["workflowId"] for w in listed] == [session_id]


async def test_an_update_too_large_for_history_is_refused_and_the_session_goes_on(stack: Stack, tmp_path: Path) -> None:
    """The `temporal` CLI sends a payload inline, whatever its size (corral's clients send anything over 256 KiB by
    reference). Temporal keeps at most 2 MiB per payload in history, and both an update's acceptance and its
    rejection carry the request back, so no validator can answer a 2.5 MiB update: the SDK refuses to send the
    answer and fails that one workflow task (`PayloadsTooLarge`). The update is not applied, the CLI says it
    failed, and the session takes the next message at once: nothing is written, nothing is wedged."""
    model = stack.script([{"text": "echo:", "echo_last_user": True}], loop=True)
    handle = await stack.start(model)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"events": [{"type": "user.message", "content": "x" * (5 * 1024 * 1024 // 2)}]}))
    address = stack.client.service_client.config.target_host
    command = [temporal_binary(), "workflow", "update", "execute", "--workflow-id", handle.id, "--name",
               "send_events", "--input-file", str(big), "--address", address]  # fmt: skip
    completed = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 1 and "Workflow Task in failed state" in completed.stderr, completed.stderr

    assert (await send_text(handle, "small")).startswith("sevt_")
    events = await wait_for_idle(handle, within_seconds=60)
    assert texts(events)[-1] == "echo:\nsmall"
    assert texts(events, "user.message") == ["small"], "the refused update wrote nothing"
    history = await handle.fetch_history()
    failed = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
    causes = {e.workflow_task_failed_event_attributes.failure.application_failure_info.type for e in failed}
    assert failed and causes == {"PayloadsTooLarge"}, "the one kind of task failure, and only for this update"
