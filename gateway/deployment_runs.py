"""Deployment runs: `POST /v1/deployments/{id}/run`, `/v1/deployment_runs` (retrieve, list), and the activity every
fire runs, `open_deployment_run`, served by the gateway's own small Temporal worker (`gateway_worker`).

The activity makes the run's session through `Sessions.create`, the code behind `POST /v1/sessions`, so a run is
refused exactly as a request would be, and the refusal becomes the run's typed error (`RUN_ERRORS`). It is safe to
run again at any point (a gateway killed mid-fire): the run id is the fire's (corral.contract.deployments), the
session id is the run's, the initial events carry ids the session takes once each, and the run's row is recorded
once (corral.deployment_runs). A failed scheduled fire pauses its deployment, as upstream.

Errors beyond a request's (Temporal or the database not answering) fail the attempt, which Temporal retries; past
`MAX_ATTEMPTS` the run records `unknown_error` rather than retrying for ever.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from corral.contract.deployments import (
    TRIGGER_MANUAL,
    TRIGGER_SCHEDULE,
    TRIGGER_TYPES,
    DeploymentRunResult,
    FireDeploymentInput,
    OpenDeploymentRunInput,
    fire_workflow_id,
    run_session_id,
)
from corral.deployment_runs import RunFilter, RunNotFound
from corral.names import ACTIVITY_OPEN_DEPLOYMENT_RUN, DEPLOYMENT_FIRE_WORKFLOW, DEPLOYMENT_RUN_ID_PREFIX
from corral.record_ids import new_record_id
from corral.records import RecordNotFound
from corral.webhooks import webhook_event
from gateway.deployments import KIND, pause_deployment
from gateway.errors import ApiError, invalid, not_found
from gateway.file_rubrics import resolve_file_rubrics
from gateway.http import Authed
from gateway.owned import id_of, own_record
from gateway.pages import instant, page_limit

if TYPE_CHECKING:
    from gateway.app import Gateway

log = logging.getLogger("gateway.deployments")

MAX_ATTEMPTS = 20
"""Attempts of one fire's activity before its run records `unknown_error` (about 15 minutes of back-off)."""
RUN_ERRORS = {
    "agent_archived": "agent_archived_error",
    "environment_archived": "environment_archived_error",
    "environment_not_found": "environment_not_found_error",
    "vault_not_found": "vault_not_found_error",
    "vault_archived": "vault_archived_error",
    "file_not_found": "file_not_found_error",
    "file_expired": "file_not_found_error",
    "skill_not_found": "skill_not_found_error",
    "memory_store_archived": "memory_store_archived_error",
    "session_resource_not_found": "session_resource_not_found_error",
}
"""A refused session's `error_code` -> the run's error type; any other refusal is `session_creation_rejected_error`."""


def run_error(exc: ApiError) -> dict[str, Any]:
    if exc.status == 429:
        kind = "session_rate_limited_error"
    else:
        kind = RUN_ERRORS.get(exc.error_code or "", "session_creation_rejected_error")
    return {"type": kind, "message": exc.message}


class DeploymentFires:
    """The activity of a fire, over the gateway's own state (its records, sessions and runs)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    @activity.defn(name=ACTIVITY_OPEN_DEPLOYMENT_RUN)
    async def open_deployment_run(self, input: OpenDeploymentRunInput) -> DeploymentRunResult:
        gateway, run_id, workspace = self.gateway, input.run_id, input.workspace
        done = await gateway.knowledge.run(gateway.runs.find, run_id)
        if done is not None:  # recorded by an attempt that died before it answered: finish what it did after
            return await self._finish(input, done)
        try:
            deployment = await gateway.records.get(input.deployment_id, workspace, kind=KIND)
        except RecordNotFound:
            agent: dict[str, Any] = {"type": "agent", "id": "", "version": 0}
            gone = {"type": "unknown_error", "message": "the deployment was deleted"}
            return await self._finish(input, await self._record(input, agent, None, gone))
        body, agent = deployment.body, deployment.body["agent"]
        await gateway.webhooks.emit([webhook_event("deployment_run.started", run_id, workspace,
                                                   key=f"{run_id}/started")])  # fmt: skip
        request = {
            "agent": agent,
            "environment_id": body["environment_id"],
            "title": body["name"],
            "metadata": body.get("metadata") or {},
            "vault_ids": body.get("vault_ids") or [],
            "resources": body.get("resources") or [],
            "budget": body.get("budget"),
            # Ids the session takes once each: a retried fire's events are not sent twice.
            "initial_events": [{**event, "id": f"{run_id}/{i}"} for i, event in enumerate(body["initial_events"])],
        }
        session_id, error = run_session_id(run_id), None
        try:
            request["initial_events"] = await resolve_file_rubrics(gateway.files, workspace, request["initial_events"],
                                                                   "initial_events")  # fmt: skip
            await gateway.sessions.create(workspace, request, session_id=session_id,
                                          deployment_id=deployment.id)  # fmt: skip
            log.info("deployment run %s: session %s started", run_id, session_id)
        except ApiError as exc:
            if exc.status >= 500 and activity.info().attempt < MAX_ATTEMPTS:
                raise
            error = run_error(exc)
        except Exception as exc:
            if activity.info().attempt < MAX_ATTEMPTS:
                raise
            error = {"type": "unknown_error", "message": f"the session could not be made ({type(exc).__name__})"}
        return await self._finish(input, await self._record(input, agent, None if error else session_id, error))

    async def _record(self, input: OpenDeploymentRunInput, agent: dict[str, Any], session_id: str | None,
                      error: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
        gateway = self.gateway
        return await gateway.knowledge.run(gateway.runs.record, input.workspace, input.run_id, input.deployment_id,
                                           input.trigger, input.scheduled_at, agent, session_id, error)  # fmt: skip

    async def _finish(self, input: OpenDeploymentRunInput, run: dict[str, Any]) -> DeploymentRunResult:
        """What follows a recorded run, safe to do again (an attempt that died after recording it): its event (the
        same id every time) and, for a failed scheduled fire, its deployment paused (already paused: unchanged)."""
        gateway, error = self.gateway, run["error"]
        outcome = "failed" if error is not None else "succeeded"
        await gateway.webhooks.emit([webhook_event(f"deployment_run.{outcome}", run["id"], input.workspace,
                                                   key=f"{run['id']}/{outcome}")])  # fmt: skip
        if error is not None and input.trigger == TRIGGER_SCHEDULE:
            try:
                current = await gateway.records.get(input.deployment_id, input.workspace, kind=KIND)
            except RecordNotFound:
                return DeploymentRunResult(run=run)
            if current.archived_at is None:
                await pause_deployment(gateway, current, {"type": "error", "error": error})
        return DeploymentRunResult(run=run)


def gateway_worker(gateway: Gateway, client: Client, task_queue: str) -> Worker:
    """The gateway's own worker: the activities that need the gateway's state (today, a deployment fire's)."""
    return Worker(client, task_queue=task_queue, activities=[DeploymentFires(gateway).open_deployment_run])


def deployment_run_routes(gateway: Gateway, authed: Authed) -> list[Route]:
    runs = gateway.runs

    async def run(request: Request, workspace: str) -> Response:
        """A manual run: a fire of its own, waited for (a paused deployment runs too; an archived one does not)."""
        deployment = await own_record(gateway.records, workspace, request.path_params["id"], KIND, "deployment_id")
        if deployment.archived_at is not None:
            raise invalid(f"deployment {deployment.id!r} is archived")
        run_id = new_record_id(DEPLOYMENT_RUN_ID_PREFIX.rstrip("_"))
        fire = FireDeploymentInput(deployment_id=deployment.id, workspace=workspace, trigger=TRIGGER_MANUAL,
                                   run_id=run_id, gateway_task_queue=gateway.gateway_queue)  # fmt: skip
        result = await gateway.client.execute_workflow(
            DEPLOYMENT_FIRE_WORKFLOW, fire, id=fire_workflow_id(deployment.id, run_id),
            task_queue=gateway.harness_queue, result_type=DeploymentRunResult,
            static_summary=f"manual run of deployment {deployment.body['name']} ({deployment.id})",
        )  # fmt: skip
        return JSONResponse(result.run)

    async def retrieve(request: Request, workspace: str) -> Response:
        run_id = id_of(request.path_params["id"], "deployment_run_id", "deployment run")
        try:
            return JSONResponse(await gateway.knowledge.run(runs.get, workspace, run_id))
        except RunNotFound as exc:
            raise not_found("deployment run", run_id) from exc

    async def listing(request: Request, workspace: str) -> Response:
        params = request.query_params
        limit = page_limit(params.get("limit"))
        deployment_id = params.get("deployment_id")
        if deployment_id is not None:  # another workspace's is as one that does not exist: no runs
            id_of(deployment_id, "deployment_id", "deployment")
        has_error = params.get("has_error")
        if has_error is not None and has_error.lower() not in ("true", "false"):
            raise invalid("has_error must be true or false")
        trigger = params.get("trigger_type")
        if trigger is not None and trigger not in TRIGGER_TYPES:
            raise invalid("trigger_type must be schedule or manual")
        before = params.get("page")
        if before is not None and not (before.startswith(DEPLOYMENT_RUN_ID_PREFIX) and len(before) <= 64):
            raise invalid("page: not a cursor this gateway gave (pass next_page as it was given)")
        where = RunFilter(
            deployment_id=deployment_id, has_error=None if has_error is None else has_error.lower() == "true",
            trigger_type=trigger, **{f"created_{key}": instant(params.get(f"created_at[{key}]"), f"created_at[{key}]")
                                     for key in ("gt", "gte", "lt", "lte")},
        )  # fmt: skip
        found = await gateway.knowledge.run(runs.list, workspace, where, limit + 1, before)
        next_page = found[limit - 1]["id"] if len(found) > limit else None
        return JSONResponse({"data": found[:limit], "next_page": next_page})

    return [
        Route("/v1/deployments/{id}/run", authed(run), methods=["POST"]),
        Route("/v1/deployment_runs", authed(listing), methods=["GET"]),
        Route("/v1/deployment_runs/{id}", authed(retrieve), methods=["GET"]),
    ]
