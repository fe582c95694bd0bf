"""Deployment fires: what a deployment's Temporal Schedule (or a manual run) hands `DeploymentFireWorkflow`, and
what its one activity, `open_deployment_run`, takes and answers.

A fire opens one deployment run: the run's session made through the gateway's own `Sessions.create` (the same
checks and errors as `POST /v1/sessions`), or the typed error that refused it. A scheduled fire's run id is made
from its scheduled time and its deployment (`corral.record_ids.record_id_at`), and its session id from the run id,
so a fire retried after any crash finds what it made before: one run per (deployment, scheduled_at), never two.

Persisted schemas (they are workflow inputs and results): add optional fields, never repurpose one.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, Final, Literal

from pydantic import BaseModel

from corral.names import DEPLOYMENT_RUN_ID_PREFIX, SESSION_ID_PREFIX
from corral.record_ids import record_id_at

SCHEDULED_START_TIME: Final = "TemporalScheduledStartTime"
"""The search attribute a Schedule sets on each workflow it starts: the time the spec matched, before jitter."""

TRIGGER_SCHEDULE: Final = "schedule"
TRIGGER_MANUAL: Final = "manual"
TRIGGER_TYPES: Final = (TRIGGER_SCHEDULE, TRIGGER_MANUAL)

RUN_ERROR_TYPES: Final = (
    "environment_archived_error",
    "environment_not_found_error",
    "agent_archived_error",
    "vault_not_found_error",
    "vault_archived_error",
    "file_not_found_error",
    "memory_store_archived_error",
    "skill_not_found_error",
    "session_resource_not_found_error",
    "mcp_egress_blocked_error",
    "organization_disabled_error",
    "workspace_archived_error",
    "self_hosted_resources_unsupported_error",
    "session_creation_rejected_error",
    "session_rate_limited_error",
    "unknown_error",
)
"""The `error.type`s a deployment run records (the SDK's `BetaManagedAgentsDeploymentRun.error`)."""


class FireDeploymentInput(BaseModel):
    """Start input of `DeploymentFireWorkflow`: the Schedule's action holds one (trigger `schedule`, no run id: the
    fire's scheduled time names its run), and a manual run starts one with the run id it answers with."""

    deployment_id: str
    workspace: str
    gateway_task_queue: str
    """Where `open_deployment_run` runs: the gateway's own worker (`corral-gateway`; a test's own queue)."""
    trigger: Literal["schedule", "manual"] = TRIGGER_SCHEDULE
    run_id: str | None = None
    """A manual run's (fresh) id; None for a scheduled fire."""


class OpenDeploymentRunInput(BaseModel):
    """Input of `open_deployment_run`."""

    deployment_id: str
    workspace: str
    run_id: str
    trigger: Literal["schedule", "manual"]
    scheduled_at: datetime | None = None
    """A scheduled fire's time (the Schedule's, before jitter); None for a manual run."""


class DeploymentRunResult(BaseModel):
    """What `open_deployment_run` answers (and the fire workflow returns): the run as the API shows it."""

    run: dict[str, Any]


def fire_workflow_id(deployment_id: str, run_id: str | None = None) -> str:
    """The fire workflow's id: `fire-<deployment>` in the Schedule's action (Temporal appends the scheduled time, so
    there is one fire per scheduled time), `fire-<deployment>-<run>` for a manual run."""
    return f"fire-{deployment_id}" if run_id is None else f"fire-{deployment_id}-{run_id}"


def scheduled_run_id(deployment_id: str, scheduled_at: datetime) -> str:
    """The one run id of a deployment's fire at `scheduled_at`: a `drun_` id of that time (it sorts as the others)."""
    key = f"{deployment_id}@{scheduled_at.isoformat()}"
    return record_id_at(DEPLOYMENT_RUN_ID_PREFIX.rstrip("_"), scheduled_at, key)


def run_session_id(run_id: str) -> str:
    """The session a run makes: named by the run, so a retried fire finds the session it started before."""
    return SESSION_ID_PREFIX + hashlib.sha256(run_id.encode()).hexdigest()[:26]
