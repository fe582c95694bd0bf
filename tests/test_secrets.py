"""The model API key lives only in the model worker: never in history, events, or log lines (canary scan)."""

from __future__ import annotations

import logging
import uuid

import anthropic
import pytest
from temporalio.testing import WorkflowEnvironment

from corral.client import read_events, send_text, start_session, wait_for_idle
from corral.contract.session import AgentConfig, SessionInput
from modelserver import ModelServerThread
from tests.conftest import history_text, unique
from workers.roles import harness_worker, model_worker


async def test_model_api_key_never_reaches_history_events_or_logs(
    temporal_env: WorkflowEnvironment, model_server: ModelServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    canary = f"sk-ant-canary-{uuid.uuid4().hex}"
    name = unique("canary")
    model_server.register(
        name, {"steps": [{"text": "fine", "fail": [{"status": 401, "type": "authentication_error"}]}]}
    )
    client = temporal_env.client
    harness_queue, model_queue = unique("harness"), unique("model")
    model = anthropic.AsyncAnthropic(base_url=model_server.base_url, api_key=canary, max_retries=0)
    caplog.set_level(logging.DEBUG)
    async with harness_worker(client, harness_queue), model_worker(client, model, model_queue):
        input = SessionInput(agent=AgentConfig(model=f"script:{name}"), message="one", model_task_queue=model_queue)
        handle = await start_session(client, input, task_queue=harness_queue)
        events = await wait_for_idle(handle)
        await send_text(handle, "two")
        await wait_for_idle(handle, after=events[-1].position)
        history = await history_text(handle)
        assert "fine" in history, "the history scan must see decoded payloads"
        all_events = "\n".join(e.model_dump_json() for e in await read_events(handle))
        await handle.terminate("done")
    assert "session.error" in all_events and "fine" in all_events, "the scenario did not run"
    requests = model_server.book.requests_for(name) or []
    assert [r["auth"] for r in requests] == ["bearer", "bearer"], "the key did reach the model server"
    assert canary not in history
    assert canary not in all_events
    assert canary not in caplog.text
