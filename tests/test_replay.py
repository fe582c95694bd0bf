"""Recorded histories replay with today's workflow code, with no nondeterminism (docs/invariants.md, invariant 7)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from corral.contract.records import RECORD_WORKFLOW
from corral.contract.work import WORK_QUEUE_WORKFLOW
from corral.names import (
    DEPLOYMENT_FIRE_WORKFLOW,
    DREAM_WORKFLOW,
    FILE_EXPIRY_WORKFLOW,
    SESSION_WORKFLOW,
    WEBHOOK_DELIVERY_WORKFLOW,
    WORKFLOW_RUN_WORKFLOW,
)
from corral.temporal import data_converter
from workflows import SessionWorkflow, WorkflowRun
from workflows.deployments import DeploymentFireWorkflow
from workflows.dreams import DreamWorkflow
from workflows.file_expiry import FileExpiryWorkflow
from workflows.records import RecordWorkflow
from workflows.webhooks import WebhookDeliveryWorkflow
from workflows.work_queue import EnvironmentWorkQueue

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))
WORKFLOWS: dict[str, type] = {
    SESSION_WORKFLOW: SessionWorkflow,
    WORKFLOW_RUN_WORKFLOW: WorkflowRun,
    RECORD_WORKFLOW: RecordWorkflow,
    WORK_QUEUE_WORKFLOW: EnvironmentWorkQueue,
    DREAM_WORKFLOW: DreamWorkflow,
    FILE_EXPIRY_WORKFLOW: FileExpiryWorkflow,
    WEBHOOK_DELIVERY_WORKFLOW: WebhookDeliveryWorkflow,
    DEPLOYMENT_FIRE_WORKFLOW: DeploymentFireWorkflow,
}
"""The class that replays a history, by the workflow type its first event names."""


def workflow_type(history: WorkflowHistory) -> str:
    return history.events[0].workflow_execution_started_event_attributes.workflow_type.name


def test_histories_are_recorded() -> None:
    assert len(HISTORIES) >= 3, "tests/histories/ is missing its recorded histories"
    # Sessions that waited for a `user.tool_confirmation` (workflow.patched("tool-confirmations")).
    assert "tool_confirmation" in {path.stem for path in HISTORIES}
    # A record created, updated twice and archived (tests/record_histories.py, RECORD_SCENARIOS).
    assert "record_agent_versions" in {path.stem for path in HISTORIES}
    # A file's expiry timer that removed its file (tests/record_histories.py, RECORD_SCENARIOS).
    assert "file_expiry" in {path.stem for path in HISTORIES}
    # A webhook delivery retried then delivered, and one given up (RECORD_SCENARIOS).
    assert {"webhook_delivery", "webhook_given_up"} <= {path.stem for path in HISTORIES}
    # A deployment's scheduled fire, which opened its run (tests/record_histories.py, RECORD_SCENARIOS).
    assert "deployment_fire" in {path.stem for path in HISTORIES}
    # A coordinator's workflow run, and the run itself (tests/record_histories.py, scenario `runs`).
    assert {"runs", "runs_run"} <= {path.stem for path in HISTORIES}
    # A session with a file, a skill and a memory store, and a dream over it (scenario `knowledge`).
    assert {"knowledge", "dream", "dream_session"} <= {path.stem for path in HISTORIES}
    # A session told mid-life that its workspace has a webhook endpoint, which then emits (scenario `webhooks`).
    assert '"emit_webhooks"' in (Path(__file__).parent / "histories" / "webhooks.json").read_text()


@pytest.mark.parametrize("path", HISTORIES, ids=[path.stem for path in HISTORIES])
async def test_recorded_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    kind = workflow_type(history)
    assert kind in WORKFLOWS, f"{path.name} is a history of {kind!r}, which no replay here knows"
    # Only that class: a history must replay with its own workflow's code, not merely with some registered one.
    replayer = Replayer(workflows=[WORKFLOWS[kind]], data_converter=data_converter())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
