"""Record the histories in `tests/histories/` that the replay test replays: `python -m tests.record_histories`.

Run it (`python -m tests.record_histories NAME ...` for some scenarios) when the workflow's behaviour changes on
purpose. Keep the old files: running sessions still have such histories, so a history recorded with old code must
keep replaying with new code (or the change needs `workflow.patched`).

Session scenarios (`SCENARIOS`) record `SessionWorkflow`s; record scenarios (`RECORD_SCENARIOS`) record
`RecordWorkflow`s, and alone need only a harness worker (no Docker, no model server).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hashlib
import json
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anthropic
from temporalio import activity
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleSpec,
    ScheduleState,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowHistory,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError
from temporalio.worker import Worker

from activities.files import FileActivities
from activities.proxy import ProxyActivities
from activities.sandbox import SandboxActivities
from activities.webhook_delivery import WebhookDeliveryActivities
from corral.blobs import LocalBlobStore, open_blob_store
from corral.client import read_events, send_events, send_text, start_session, update_session, wait_for_idle
from corral.contract.deployments import (
    DeploymentRunResult,
    FireDeploymentInput,
    OpenDeploymentRunInput,
    fire_workflow_id,
    run_session_id,
)
from corral.contract.dreams import TERMINAL_DREAM_STATUSES, DreamInput, DreamModel, DreamState
from corral.contract.events import AgentMessage, AgentToolUse
from corral.contract.knowledge import FileMount, MemoryStoreMount, SessionKnowledge, SkillPin
from corral.contract.plans import WorkflowRunInfo
from corral.contract.search_attributes import WORKSPACE_KEY
from corral.contract.session import (
    AgentConfig,
    SendEventsInput,
    SessionBudget,
    SessionInfo,
    SessionInput,
    UpdateSessionInput,
)
from corral.contract.threads import ThreadInfo
from corral.contract.webhooks import DeliveryPolicy
from corral.contract.work import NO_HEARTBEAT, ClaimWork, HeartbeatWork, SelfHostedEnvironment, StopWork, work_queue_id
from corral.file_expiry import schedule_file_expiry
from corral.files import FileStore
from corral.hands import make_execute_activity
from corral.knowledge_db import KnowledgeDB, open_knowledge_db
from corral.memory_records import user_actor
from corral.memory_stores import MemoryStores
from corral.names import (
    ACTIVITY_OPEN_DEPLOYMENT_RUN,
    DEPLOYMENT_FIRE_WORKFLOW,
    DREAM_WORKFLOW,
    QUERY_DREAM,
    QUERY_THREADS,
    QUERY_WORKFLOW_RUNS,
    SIGNAL_INTERRUPT,
    SIGNAL_WEBHOOKS,
    UPDATE_ARCHIVE_DREAM,
    UPDATE_SEND_EVENTS,
    UPDATE_SESSION,
)
from corral.records import Records
from corral.skill_bundles import bundle_tar, skill_bundle
from corral.temporal import cluster_id, start_local_temporal
from corral.webhooks import WebhookEndpoints, Webhooks, webhook_event
from corral.work_queue import WorkQueues
from modelserver import ModelServerThread
from proxy import VaultStore, new_webhook_secret
from proxy.devvault import start_dev_vault
from sandbox import ensure_docker_engine, ensure_sandbox_image
from tests.hand_tools import TEST_TOOLS
from tests.proxy_servers.webhook_receiver import WebhookReceiver
from tests.waits import until
from workers.proxy import proxy_worker
from workers.roles import harness_worker, model_workers, sandbox_workers

HISTORIES = Path(__file__).parent / "histories"
STATE_DIR = Path(__file__).resolve().parents[1] / ".corral"
HAND_QUEUE = "record-hand"
MODEL_QUEUE = "record-model"
HARNESS_QUEUE = "record-harness"
PROXY_QUEUE = "record-proxy"
GATEWAY_QUEUE = "record-gateway"

SELF_HOSTED = SelfHostedEnvironment(environment_id="env_recorded", workspace="default")
RECORDING: list[Client] = []
"""The client recording (a scenario that records a workflow besides the session, a thread, reads it through it)."""
Scenario = Callable[[WorkflowHandle], Awaitable[list[str] | None]]
"""Plays a session; returns the ids of the workflow runs to record (None: the current run)."""


def _tool(name: str) -> dict[str, Any]:
    return {"type": "hand", "name": name, "task_queue": HAND_QUEUE, "input_schema": {"type": "object"}}


async def conversation_with_tools(handle: WorkflowHandle) -> None:
    events = await wait_for_idle(handle)
    await send_text(handle, "and again", client_id="client-2")
    await wait_for_idle(handle, after=events[-1].position)


async def custom_tool_and_interrupt(handle: WorkflowHandle) -> None:
    events = await wait_for_idle(handle)
    use = next(e for e in events if e.type == "agent.custom_tool_use")
    result = {"type": "user.custom_tool_result", "custom_tool_use_id": use.id, "content": "blue"}
    await handle.execute_update(UPDATE_SEND_EVENTS, SendEventsInput(events=[result]))
    events = await wait_for_idle(handle, after=events[-1].position)
    await send_text(handle, "now something slow")
    while not any(e.type == "span.model_request_start" for e in await read_events(handle, after=events[-1].position)):
        await asyncio.sleep(0.05)
    await handle.signal(SIGNAL_INTERRUPT)
    events = await wait_for_idle(handle, after=events[-1].position)
    await send_text(handle, "after the interrupt")
    await wait_for_idle(handle, after=events[-1].position)


async def custom_tools_answered_one_by_one(handle: WorkflowHandle) -> None:
    """Two custom calls answered one at a time: the first answer makes a new idle listing the call left
    (`workflow.patched("still-waiting-calls")`)."""
    events = await wait_for_idle(handle)
    for use in [e for e in events if e.type == "agent.custom_tool_use"]:
        result = {"type": "user.custom_tool_result", "custom_tool_use_id": use.id, "content": "blue"}
        await handle.execute_update(UPDATE_SEND_EVENTS, SendEventsInput(events=[result]))
        events = await wait_for_idle(handle, after=events[-1].position)


async def system_message(handle: WorkflowHandle) -> None:
    """A `system.message` with a custom tool's result, then with a user message: each joins the conversation."""
    events = await wait_for_idle(handle)
    use = next(e for e in events if e.type == "agent.custom_tool_use")
    result = {"type": "user.custom_tool_result", "custom_tool_use_id": use.id, "content": "blue"}
    system = {"type": "system.message", "content": [{"type": "text", "text": "Be terse."}]}
    await handle.execute_update(UPDATE_SEND_EVENTS, SendEventsInput(events=[result, system]))
    events = await wait_for_idle(handle, after=events[-1].position)
    message = {"type": "user.message", "content": "and now?"}
    again = {"type": "system.message", "content": [{"type": "text", "text": "Answer in French."}]}
    await handle.execute_update(UPDATE_SEND_EVENTS, SendEventsInput(events=[message, again]))
    await wait_for_idle(handle, after=events[-1].position)


async def model_routing(handle: WorkflowHandle) -> None:
    """Turns after the first go to the model worker's own queue (`workflow.patched("model-turn-routing")`)."""
    after = (await wait_for_idle(handle))[-1].position
    for text in ("second", "third"):
        await send_text(handle, text)
        after = (await wait_for_idle(handle, after=after))[-1].position


async def model_errors(handle: WorkflowHandle) -> None:
    events = await wait_for_idle(handle)
    await send_text(handle, "try again")
    await wait_for_idle(handle, after=events[-1].position)


async def context_compaction(handle: WorkflowHandle) -> None:
    """Long messages and large tool results past a small budget: old results elided, older turns summarised."""
    after = (await wait_for_idle(handle))[-1].position
    for n in range(1, 9):
        await send_text(handle, f"note {n}: " + " ".join(f"word{n}x{i}" for i in range(60)))
        after = (await wait_for_idle(handle, after=after))[-1].position


async def continue_as_new(handle: WorkflowHandle) -> list[str]:
    """Turns with tool calls past a low hand-over threshold: the first run (it ends by continuing as new) and the
    second (it starts from the carried state, and ends the same way)."""
    after = (await wait_for_idle(handle))[-1].position
    runs: list[str] = []
    for n in range(40):
        await send_text(handle, f"message {n}", client_id=f"client-{n}")
        after = (await wait_for_idle(handle, after=after))[-1].position
        description = await handle.describe()
        if description.run_id not in runs:
            runs.append(description.run_id)
        if len(runs) == 3:
            return runs[:2]
    raise AssertionError(f"the session did not continue as new twice: runs {runs}")


async def renamed_and_archived(handle: WorkflowHandle) -> None:
    await wait_for_idle(handle)
    renamed = UpdateSessionInput(title_set=True, title="renamed", metadata={"ticket": "T-1"})
    await handle.execute_update(UPDATE_SESSION, renamed, result_type=SessionInfo)
    await handle.execute_update(UPDATE_SESSION, UpdateSessionInput(archive=True), result_type=SessionInfo)


async def budget_changed_then_deleted(handle: WorkflowHandle) -> None:
    """A budget raised, then removed, then the deletion: `session.deleted`, and the cancel that follows it."""
    await wait_for_idle(handle)
    raised = SessionBudget.model_validate({"max_list_cost": {"amount": "200000"}})
    for budget in (raised, None):
        change = UpdateSessionInput(budget_set=True, budget=budget)
        await handle.execute_update(UPDATE_SESSION, change, result_type=SessionInfo)
    await handle.execute_update(UPDATE_SESSION, UpdateSessionInput(delete=True), result_type=SessionInfo)
    await handle.cancel()
    with contextlib.suppress(WorkflowFailureError):
        await handle.result()


async def idle_hand_over(handle: WorkflowHandle) -> list[str]:
    """Renames while idle until the session continues as new (`workflow.patched("idle-hand-over")`): the first
    run, which ends idle, and the second."""
    await wait_for_idle(handle)
    runs: list[str] = []
    for n in range(1000):
        await update_session(handle, UpdateSessionInput(title_set=True, title=f"name {n}"))
        description = await handle.describe()
        if description.run_id not in runs:
            runs.append(description.run_id)
        if len(runs) == 2:
            await update_session(handle, UpdateSessionInput(title_set=True, title="in the second run"))
            return runs
    raise AssertionError("the session did not continue as new while idle")


async def webhooks(handle: WorkflowHandle) -> None:
    """A session of a workspace with no endpoint (it emits nothing), then told it has one (`SIGNAL_WEBHOOKS`): its
    next turn's running and idle go to the model workers' `emit_webhooks`."""
    events = await wait_for_idle(handle)
    await handle.signal(SIGNAL_WEBHOOKS, True)
    await send_text(handle, "and again", client_id="client-2")
    await wait_for_idle(handle, after=events[-1].position)


async def threads(handle: WorkflowHandle) -> None:
    """A coordinator spawns a thread that runs a command on the session's sandbox and replies; the session is then
    cancelled, which archives the thread. Records the session and, beside it, the thread (`threads_thread.json`)."""
    events = await wait_for_idle(handle, within_seconds=120)
    while not any(isinstance(e, AgentMessage) and e.content[0].text == "done" for e in events):
        events = await wait_for_idle(handle, after=events[-1].position, within_seconds=120)
    (_, thread) = await handle.query(QUERY_THREADS, result_type=list[ThreadInfo])
    await handle.cancel()
    with contextlib.suppress(WorkflowFailureError):
        await handle.result()
    thread_handle = RECORDING[0].get_workflow_handle(thread.id)
    await thread_handle.result()  # the thread ends once the session's cancellation archived it
    await _write(HISTORIES / "threads_thread.json", thread_handle)


async def runs(handle: WorkflowHandle) -> None:
    """A coordinator starts a workflow run of two phases (two tasks, then one that takes their replies), waits for
    it and reads its report. Records the session and, beside it, the run (`runs_run.json`)."""
    events = await wait_for_idle(handle, within_seconds=120)
    while not any(isinstance(e, AgentMessage) and e.content[0].text == "done" for e in events):
        events = await wait_for_idle(handle, after=events[-1].position, within_seconds=120)
    (run,) = await handle.query(QUERY_WORKFLOW_RUNS, result_type=list[WorkflowRunInfo])
    run_handle = RECORDING[0].get_workflow_handle(run.id)
    await run_handle.result()
    await _write(HISTORIES / "runs_run.json", run_handle)


async def outcomes(handle: WorkflowHandle) -> None:
    """A turn, then an outcome the grader sends back for revision once, then finds met."""
    events = await wait_for_idle(handle)
    rubric = {"type": "text", "content": "Says 'final'."}
    await send_events(handle, [{"type": "user.define_outcome", "description": "Say final.", "rubric": rubric}])
    await wait_for_idle(handle, after=events[-1].position)


async def self_hosted(handle: WorkflowHandle) -> None:
    """A session in a self-hosted environment: its bash call waits for a worker, which the scenario plays through
    the queue's client (delivery, ack, lease) before posting the result; then the worker stops its item. Records the
    session and, beside it, the environment's queue (`self_hosted_queue.json`)."""
    queues = WorkQueues(RECORDING[0], HARNESS_QUEUE)
    environment_id = SELF_HOSTED.environment_id

    async def asked() -> bool:
        return bool(await queues.items(environment_id)) and any(
            isinstance(e, AgentToolUse) for e in await read_events(handle)
        )

    await until(asked, "the session asking for a self-hosted worker")
    (item,) = await queues.items(environment_id)
    token = hashlib.sha256(b"recorded").hexdigest()
    await queues.claim(environment_id, ClaimWork(worker_id="recorder", token_sha256=token))
    await queues.ack(environment_id, item.id)
    await queues.heartbeat(environment_id, HeartbeatWork(work_id=item.id, expected_last_heartbeat=NO_HEARTBEAT))
    (use,) = [e for e in await read_events(handle) if isinstance(e, AgentToolUse)]
    await send_events(handle, [{"type": "user.tool_result", "tool_use_id": use.id, "content": "hi"}])
    await wait_for_idle(handle)
    await queues.stop(environment_id, StopWork(work_id=item.id, force=True))
    queue = RECORDING[0].get_workflow_handle(work_queue_id(environment_id))

    async def stopped() -> bool:
        return any(e.state == "stopped" for e in await queues.items(environment_id))

    await until(stopped, "the work item stopped")
    await _write(HISTORIES / "self_hosted_queue.json", queue)
    await queue.terminate("recorded")


KNOWLEDGE_WORKSPACE = "recorded"
KNOWLEDGE_STORE: list[str] = []
"""The memory store the `knowledge` scenario made (its session writes to it, its dream reads it)."""


async def knowledge_setup() -> dict[str, Any]:
    """A file, a skill and a memory store in this machine's knowledge database and blob store, for the session."""
    db, blobs = open_knowledge_db(), open_blob_store()
    made = FileStore(db, blobs).create(KNOWLEDGE_WORKSPACE, "brief.txt", b"the launch is on friday\n")
    stores = MemoryStores(db)
    store = stores.create_store(KNOWLEDGE_WORKSPACE, "Notes")
    stores.create_memory(KNOWLEDGE_WORKSPACE, store.id, "/prefs.md", "likes tea\n", user_actor("recorder"))
    KNOWLEDGE_STORE[:] = [store.id]
    skill_md = b"---\nname: brief\ndescription: Writes briefs.\n---\nOne page, no more.\n"
    blobs.put("skills/recorded/bundle.tar", bundle_tar(skill_bundle([("brief/SKILL.md", skill_md)])))
    now = "2026-12-06T00:00:00Z"
    knowledge = SessionKnowledge(
        workspace=KNOWLEDGE_WORKSPACE,
        files=[
            FileMount(
                id="sres_recorded",
                file_id=made.id,
                mount_path="/mnt/data/brief.txt",
                blob_key=made.blob_key,
                size_bytes=made.size_bytes,
                created_at=now,
                updated_at=now,
            )
        ],
        skills=[
            SkillPin(
                skill_id="skill_recorded",
                version="skillver_recorded",
                name="brief",
                description="Writes briefs.",
                blob_key="skills/recorded/bundle.tar",
            )
        ],
        memory_stores=[MemoryStoreMount(memory_store_id=store.id, name="Notes", mount_path="/mnt/memory/notes")],
    )
    return {"knowledge": knowledge}


async def knowledge(handle: WorkflowHandle) -> None:
    """The session reads its file, skill and store, and writes an output and a memory; then a dream over it."""
    await wait_for_idle(handle, within_seconds=120)
    client = RECORDING[0]
    dream_id = f"drm_recorded{uuid.uuid4().hex[:12]}"
    dream = await client.start_workflow(
        DREAM_WORKFLOW,
        DreamInput(
            dream_id=dream_id,
            workspace=KNOWLEDGE_WORKSPACE,
            memory_store_id=KNOWLEDGE_STORE[0],
            memory_store_name="Notes",
            session_ids=[handle.id],
            model=DreamModel(id="script:dreamer"),
            model_task_queue=MODEL_QUEUE,
            created_at=datetime.now(UTC),
        ),
        id=dream_id,
        task_queue=HARNESS_QUEUE,
    )

    async def ended() -> bool:
        return (await dream.query(QUERY_DREAM, result_type=DreamState)).status in TERMINAL_DREAM_STATUSES

    await until(ended, "the recorded dream ended", within=120)
    state = await dream.query(QUERY_DREAM, result_type=DreamState)
    assert state.status == "completed" and state.session_id is not None, state
    await dream.execute_update(UPDATE_ARCHIVE_DREAM, result_type=DreamState)
    await dream.result()
    await _write(HISTORIES / "dream.json", dream)
    await _write(HISTORIES / "dream_session.json", client.get_workflow_handle(state.session_id))
    await handle.cancel()  # releases the sandbox
    with contextlib.suppress(WorkflowFailureError):
        await handle.result()


async def sandbox_tools(handle: WorkflowHandle) -> None:
    await wait_for_idle(handle, within_seconds=120)
    await handle.cancel()  # releases the sandbox: container and volume removed
    with contextlib.suppress(WorkflowFailureError):
        await handle.result()


_VERDICT = {"name": "outcome_verdict", "input": {"result": "needs_revision", "explanation": "Say 'final'."}}
SCRIPT_OPTIONS: dict[str, dict[str, Any]] = {
    "outcomes": {
        "grader": [
            {"tool_uses": [_VERDICT]},
            {"tool_uses": [{**_VERDICT, "input": {"result": "satisfied", "explanation": "It does."}}]},
        ],
    },
    "context_compaction": {"loop": True, "max_input_tokens": 2_500},
    "continue_as_new": {"loop": True},
}
SESSION_OPTIONS: dict[str, dict[str, Any]] = {
    "continue_as_new": {"continue_as_new_after_events": 200},
    "idle_hand_over": {"continue_as_new_after_events": 200},
    "self_hosted": {"environment": SELF_HOSTED},
    "budget_changed_then_deleted": {
        "budget": {
            "max_list_cost": {"amount": "100000"},
            "price": {"input": "3", "output": "15", "cache_read": "0.3", "cache_write": "3.75"},
        }
    },
}
SESSION_SETUP: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {"knowledge": knowledge_setup}
"""Session options made when the scenario is recorded (objects in the knowledge database)."""
AGENT_OPTIONS: dict[str, dict[str, Any]] = {
    "context_compaction": {"context_budget_tokens": 1_500},
    "threads": {
        "multiagent": {
            "agents": [
                {
                    "type": "agent",
                    "id": "agent_worker",
                    "version": 1,
                    "config": {
                        "model": "script:threads_worker",
                        "name": "worker",
                        "tools": [{"type": "agent_toolset_20260401"}],
                    },
                }
            ]
        }
    },
    "runs": {
        "multiagent": {
            "subagents": False,
            "runs": True,
            "run_agents": [
                {
                    "type": "agent",
                    "id": "agent_runner",
                    "version": 1,
                    "config": {"model": "script:runs_worker", "name": "runner"},
                },
            ],
        }
    },
}
RUNS_PLAN = {
    "name": "recorded",
    "phases": [
        {"name": "first", "tasks": [{"agent": "runner", "message": "one"}, {"agent": "runner", "message": "two"}]},
        {"name": "second", "tasks": [{"agent": "runner", "message": "both: {{first}}"}]},
    ],
}
DREAMER_COMMAND = "mkdir -p /mnt/session/outputs/memory && cp /mnt/memory/notes/*.md /mnt/session/outputs/memory/"
EXTRA_SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "threads_worker": [{"tool_uses": [{"name": "bash", "input": {"command": "echo from the thread"}}]}, {"text": "ok"}],
    "runs_worker": [{"echo_last_user": True}],
    "dreamer": [
        {
            "tool_uses": [
                {
                    "name": "bash",
                    "input": {
                        "command": "mkdir -p /mnt/session/outputs/memory && "
                        "cp /mnt/memory/notes/*.md /mnt/session/outputs/memory/"
                    },
                }
            ]
        },
        {"text": "done"},
    ],
}
"""Scripts of models a scenario's agents use besides its own (a multi-agent session's subagents)."""

SCENARIOS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]], Scenario]] = {
    "conversation_with_tools": (
        [
            {"text": "Let me compute.", "tool_uses": [{"name": "calculate", "input": {"expression": "6*7"}}]},
            {"text": "It is 42."},
            {"text": "Again:", "echo_last_user": True},
        ],
        [_tool("calculate")],
        conversation_with_tools,
    ),
    "custom_tool_and_interrupt": (
        [
            {"tool_uses": [{"name": "lookup", "input": {"key": "color"}}]},
            {"text": "The client said blue."},
            {"text": "slow", "first_token_latency": 30, "pace_hits": 1},
        ],
        [{"type": "custom", "name": "lookup"}],
        custom_tool_and_interrupt,
    ),
    "system_message": (
        [{"tool_uses": [{"name": "lookup", "input": {"key": "color"}}]}, {"text": "Blue."}, {"text": "Bleu."}],
        [{"type": "custom", "name": "lookup"}],
        system_message,
    ),
    "custom_tools_answered_one_by_one": (
        [
            {
                "tool_uses": [
                    {"name": "lookup", "input": {"key": "color"}},
                    {"name": "lookup", "input": {"key": "size"}},
                ]
            },
            {"text": "Both are blue."},
        ],
        [{"type": "custom", "name": "lookup"}],
        custom_tools_answered_one_by_one,
    ),
    "sandbox_tools": (
        [
            {"tool_uses": [{"name": "bash", "input": {"command": "cd /workspace && export X=1 && echo hi > f"}}]},
            {"tool_uses": [{"name": "edit", "input": {"file_path": "f", "old_string": "nope", "new_string": "x"}}]},
            {"tool_uses": [{"name": "read", "input": {"file_path": "f"}}]},
            {"text": "done"},
        ],
        [{"type": "agent_toolset_20260401"}],
        sandbox_tools,
    ),
    "context_compaction": (
        [
            {"text": "Looking.", "tool_uses": [{"name": "spew", "input": {"size": 2_000, "tag": "out-"}}]},
            {"text": "Noted."},
        ],
        [_tool("spew")],
        context_compaction,
    ),
    "continue_as_new": (
        [
            {"text": "Let me compute.", "tool_uses": [{"name": "calculate", "input": {"expression": "6*7"}}]},
            {"text": "Again:", "echo_last_user": True},
        ],
        [_tool("calculate")],
        continue_as_new,
    ),
    "model_routing": (
        [{"text": "First."}, {"text": "Second."}, {"text": "Third."}],
        [],
        model_routing,
    ),
    "threads": (
        [
            {"tool_uses": [{"name": "spawn_thread", "input": {"agent": "worker", "message": "say hi"}}]},
            {"tool_uses": [{"name": "wait_for_threads", "input": {}}]},
            {"text": "done"},
        ],
        [],
        threads,
    ),
    "runs": (
        [
            {"tool_uses": [{"name": "start_workflow_run", "input": RUNS_PLAN}]},
            {"tool_uses": [{"name": "wait_for_threads", "input": {}}]},
            {"text": "done"},
        ],
        [],
        runs,
    ),
    "outcomes": ([{"text": "hello"}, {"text": "draft"}, {"text": "final"}], [], outcomes),
    "knowledge": (
        [
            {
                "tool_uses": [
                    {
                        "name": "bash",
                        "input": {
                            "command": "cat /mnt/data/brief.txt /mnt/skills/brief/SKILL.md /mnt/memory/notes/prefs.md"
                        },
                    }
                ]
            },
            {
                "tool_uses": [
                    {
                        "name": "bash",
                        "input": {
                            "command": "echo friday > /mnt/session/outputs/day.txt && "
                            "echo ships friday > /mnt/memory/notes/launch.md"
                        },
                    }
                ]
            },
            {"text": "done"},
        ],
        [{"type": "agent_toolset_20260401"}],
        knowledge,
    ),
    "self_hosted": (
        [{"tool_uses": [{"name": "bash", "input": {"command": "echo hi"}}]}, {"text": "done"}],
        [{"type": "agent_toolset_20260401"}],
        self_hosted,
    ),
    "renamed_and_archived": ([{"text": "hello"}], [], renamed_and_archived),
    "webhooks": ([{"text": "hello"}, {"text": "again"}], [], webhooks),
    "budget_changed_then_deleted": ([{"text": "hello"}], [], budget_changed_then_deleted),
    "idle_hand_over": ([{"text": "hello"}], [], idle_hand_over),
    "refusal": (
        [{"text": "I can't help with that.", "stop_reason": "refusal", "refusal_category": "cyber"}, {"text": "Sure."}],
        [],
        model_errors,  # a turn, then "try again": the refused turn, then one that ends as usual
    ),
    "model_errors": (
        [
            {"text": "after a retry", "fail": [{"status": 529, "retry_after": 0.2}]},
            {"text": "after a 401", "fail": [{"status": 401, "type": "authentication_error"}]},
        ],
        [],
        model_errors,
    ),
}


async def agent_versions(records: Records) -> str:
    """An agent created, updated twice (a version each) and archived: every write `RecordWorkflow` takes but delete."""
    workspace = "recorded"
    agent = {"name": "helper", "model": {"id": "claude-sonnet-4-6"}, "tools": []}
    created = await records.create("agent", workspace, agent, "agent")
    await records.put(created.id, workspace, {**agent, "system": "Be brief."}, expected_version=1)
    await records.put(created.id, workspace, {**agent, "system": "Be very brief."}, expected_version=2)
    await records.archive(created.id, workspace)
    return created.id


@functools.cache
def _file_store() -> FileStore:
    """A file store of the recording's own, in a scratch directory, which the expiry activity serves too."""
    scratch = Path(tempfile.mkdtemp(prefix="corral-record-files-"))
    return FileStore(KnowledgeDB(scratch / "knowledge.db"), LocalBlobStore(scratch / "blobs"))


async def file_expiry(records: Records) -> str:
    """A file's expiry timer: started with a short delay, then its one activity removes the file."""
    files = _file_store()
    record = await files.db.run(lambda: files.create("recorded", "soon.txt", b"soon",
                                                     expires_at=datetime.now(UTC) + timedelta(seconds=2)))  # fmt: skip
    workflow_id = await schedule_file_expiry(records.client, record, HARNESS_QUEUE, MODEL_QUEUE)
    assert await records.client.get_workflow_handle(workflow_id).result() is True
    return workflow_id


async def _webhook_delivery(records: Records, answers: list[int], give_up_after: timedelta) -> str:
    """One webhook delivery sent by a proxy worker of the recording's own (a dev Vault holds the secret) to a
    receiver that answers `answers` in turn (the last one from then on)."""
    db = _file_store().db
    workspace = f"recorded-{uuid.uuid4().hex[:6]}"  # one endpoint per scenario in the shared scratch database
    receiver = WebhookReceiver()
    with start_dev_vault(Path(tempfile.mkdtemp(prefix="corral-record-vault-"))) as vault:
        store = VaultStore(vault.client(), vault.mount)
        endpoint = WebhookEndpoints(db).create(workspace, receiver.url("/in"), ["all"])
        secret = new_webhook_secret()
        store.store_webhook_secret(endpoint.id, secret)
        receiver.keys["/in"] = secret.get_secret_value()
        receiver.answer = answers[0]
        policy = DeliveryPolicy(first_retry=timedelta(milliseconds=200), longest_wait=timedelta(seconds=1),
                                give_up_after=give_up_after)  # fmt: skip
        webhooks = Webhooks(records.client, db, HARNESS_QUEUE, policy, PROXY_QUEUE)
        event = webhook_event("session.status_idled", "sesn_recorded0000000000000000", workspace)
        async with proxy_worker(records.client, ProxyActivities(store), PROXY_QUEUE,
                                webhooks=WebhookDeliveryActivities(store, db)):  # fmt: skip
            [workflow_id] = await webhooks.emit([event])
            for answer in answers[1:]:
                await until(lambda: bool(receiver.received), "the receiver got the first attempt")
                receiver.answer = answer
            await records.client.get_workflow_handle(workflow_id).result()
    receiver.close()
    return workflow_id


async def webhook_delivery(records: Records) -> str:
    """A webhook delivery whose first attempt got a 503 and whose retry was delivered."""
    return await _webhook_delivery(records, [503, 200], timedelta(hours=26))


async def webhook_given_up(records: Records) -> str:
    """A webhook delivery that kept failing until its policy gave up (its endpoint disabled)."""
    return await _webhook_delivery(records, [503], timedelta(seconds=3))


@activity.defn(name=ACTIVITY_OPEN_DEPLOYMENT_RUN)
async def _open_run(input: OpenDeploymentRunInput) -> DeploymentRunResult:
    """Stands in for the gateway's activity (gateway/deployment_runs.py), which the history records only as its
    input and result: the run the gateway would answer with."""
    trigger = {"type": input.trigger, "scheduled_at": input.scheduled_at.isoformat() if input.scheduled_at else None}
    return DeploymentRunResult(run={"type": "deployment_run", "id": input.run_id, "deployment_id": input.deployment_id,
                                    "trigger_context": trigger, "session_id": run_session_id(input.run_id),
                                    "error": None})  # fmt: skip


async def deployment_fire(records: Records) -> str:
    """A deployment's Schedule fired by hand (`trigger`), as a cron fire is: the fire workflow reads its scheduled
    time and opens the run on the gateway's queue."""
    client, deployment_id = records.client, f"depl_recorded{uuid.uuid4().hex[:8]}"
    fire = FireDeploymentInput(deployment_id=deployment_id, workspace="recorded", gateway_task_queue=GATEWAY_QUEUE)
    schedule = Schedule(
        action=ScheduleActionStartWorkflow(DEPLOYMENT_FIRE_WORKFLOW, fire, id=fire_workflow_id(deployment_id),
                                           task_queue=HARNESS_QUEUE),
        spec=ScheduleSpec(cron_expressions=["0 3 * * *"]),
        state=ScheduleState(paused=True),
    )  # fmt: skip
    handle = await client.create_schedule(deployment_id, schedule)
    try:
        async with Worker(client, task_queue=GATEWAY_QUEUE, activities=[_open_run]):
            await handle.trigger()
            actions: list[Any] = []

            async def fired() -> bool:
                actions[:] = (await handle.describe()).info.recent_actions
                return bool(actions)

            await until(fired, "the schedule's fire")
            workflow_id = actions[0].action.workflow_id
            await client.get_workflow_handle(workflow_id).result()
    finally:
        await handle.delete()
    return workflow_id


RECORD_SCENARIOS: dict[str, Callable[[Records], Awaitable[str]]] = {
    "record_agent_versions": agent_versions,
    "file_expiry": file_expiry,
    "webhook_delivery": webhook_delivery,
    "webhook_given_up": webhook_given_up,
    "deployment_fire": deployment_fire,
}
"""Record scenarios: each plays one record's life and returns its id (its workflow's)."""


def _without_stack_traces(node: Any) -> Any:
    """Stack traces name this machine's paths and play no part in replay: drop them before committing."""
    if isinstance(node, dict):
        return {key: "" if key == "stackTrace" else _without_stack_traces(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_without_stack_traces(value) for value in node]
    return node


async def _write(path: Path, handle: WorkflowHandle) -> WorkflowHistory:
    history = await handle.fetch_history()
    recorded = _without_stack_traces(json.loads(history.to_json()))
    path.write_text(json.dumps(recorded, indent=1) + "\n")
    return history


async def record(client: Client, server: ModelServerThread, names: list[str]) -> None:
    HISTORIES.mkdir(exist_ok=True)
    RECORDING[:] = [client]
    for script, steps in EXTRA_SCRIPTS.items():
        server.register(script, {"steps": steps})
    for name in names:
        steps, tools, scenario = SCENARIOS[name]
        server.register(name, {"steps": steps, **SCRIPT_OPTIONS.get(name, {})})
        agent = AgentConfig.model_validate(
            {"model": f"script:{name}", "tools": tools, "system": "Be brief.", **AGENT_OPTIONS.get(name, {})}
        )
        options = SESSION_OPTIONS.get(name, {}) | (await SESSION_SETUP[name]() if name in SESSION_SETUP else {})
        input = SessionInput(agent=agent, message="hello", model_task_queue=MODEL_QUEUE, title=name, **options)
        handle = await start_session(
            client, input, session_id=f"sesn_{name}_{uuid.uuid4().hex[:6]}", task_queue=HARNESS_QUEUE,
            search_attributes=TypedSearchAttributes([SearchAttributePair(WORKSPACE_KEY, "recorded")]),
        )  # fmt: skip
        runs = await scenario(handle)
        files = (
            {f"{name}.json": handle}
            if runs is None
            else {
                f"{name}_run{i}.json": client.get_workflow_handle(handle.id, run_id=run)
                for i, run in enumerate(runs, 1)
            }
        )
        for file, run_handle in files.items():
            history = await _write(HISTORIES / file, run_handle)
        with contextlib.suppress(RPCError):  # a scenario may have ended the session itself
            await handle.terminate("recorded")
        print(f"recorded {name}: {len(history.events)} history events")


async def record_records(client: Client, names: list[str]) -> None:
    HISTORIES.mkdir(exist_ok=True)
    files = _file_store()
    expiring = Worker(client, task_queue=MODEL_QUEUE, activities=[FileActivities(files.blobs, files.db).expire_file])
    async with harness_worker(client, HARNESS_QUEUE), expiring:
        for name in names:
            handle = client.get_workflow_handle(await RECORD_SCENARIOS[name](Records(client, HARNESS_QUEUE)))
            history = await handle.fetch_history()
            recorded = _without_stack_traces(json.loads(history.to_json()))
            (HISTORIES / f"{name}.json").write_text(json.dumps(recorded, indent=1) + "\n")
            with contextlib.suppress(RPCError):  # a scenario's workflow may have completed
                await handle.terminate("recorded")
            print(f"recorded {name}: {len(history.events)} history events")


async def main(names: list[str]) -> None:
    env = await start_local_temporal()
    record_names = [name for name in names if name in RECORD_SCENARIOS]
    names = [name for name in names if name not in RECORD_SCENARIOS]
    if not names:  # records only: no Docker, no model server
        try:
            await record_records(env.client, record_names)
        finally:
            await env.shutdown()
        return
    engine = ensure_docker_engine(STATE_DIR)
    sandbox = SandboxActivities(engine, ensure_sandbox_image(engine, STATE_DIR), await cluster_id(env.client))
    server = ModelServerThread()
    server.start()
    model = anthropic.AsyncAnthropic(base_url=server.base_url, api_key="test-key", max_retries=0)
    try:
        async with contextlib.AsyncExitStack() as workers:
            for worker in [
                harness_worker(env.client, HARNESS_QUEUE),
                *model_workers(env.client, model, MODEL_QUEUE),
                Worker(env.client, task_queue=HAND_QUEUE, activities=[make_execute_activity(TEST_TOOLS)]),
                *sandbox_workers(env.client, sandbox),
            ]:
                await workers.enter_async_context(worker)
            await record(env.client, server, names)
        await record_records(env.client, record_names)
    finally:
        server.stop()
        await env.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    # argparse checks an empty `nargs="*"` against the choices too, hence the [] among them.
    parser.add_argument(
        "names", nargs="*", choices=[*SCENARIOS, *RECORD_SCENARIOS, []], help="scenarios to record (default: all)"
    )
    chosen = parser.parse_args().names or [*SCENARIOS, *RECORD_SCENARIOS]
    asyncio.run(main(chosen))
    sys.exit(0)
