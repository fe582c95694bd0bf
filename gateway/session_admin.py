"""Changing a session (title, metadata, budget), archiving it (it keeps its log and takes no more events), and
deleting it: its workflow, its log and its sandbox go; a running one cannot be deleted (interrupt it first).

Upstream deletes "the record, its events and its container". Here the session first takes the deletion (the
`update_session` update refuses it while the session runs, else writes `session.deleted`, which ends every open
stream, and takes nothing more); then it is cancelled, so the harness releases its sandbox and MCP bindings
itself; then Temporal's execution, the log with it, is deleted, and the session is gone from every read and
listing (404). A multi-agent session's threads go with it: cancelling the session archives them, and their
executions and logs are deleted after its own.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.client import (
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from corral.archive import forget_session
from corral.blobs import BlobStoreError, open_blob_store
from corral.client import update_session
from corral.contract.plans import WorkflowRunInfo
from corral.contract.session import UpdateSessionInput
from corral.contract.threads import ThreadInfo
from corral.names import BUDGET_CREATE_ONLY, BUDGET_NOT_RAISED, BUSY, QUERY_THREADS, QUERY_WORKFLOW_RUNS, refusal_type
from gateway.errors import ApiError, invalid
from gateway.http import Authed, body
from gateway.owned import own_session
from gateway.session_status import refuse_if_ended
from gateway.shapes import budget_limit, patch_metadata

GONE_SECONDS = 60.0
"""How long a delete waits for Temporal to remove the execution (it does so in the background: about 30 s on the
dev server, less on a cluster), so that the client's next read is a 404."""
logger = logging.getLogger("gateway")

BUDGET_ERROR_CODES = {BUDGET_CREATE_ONLY: "budget_create_only", BUDGET_NOT_RAISED: "budget_not_raised"}
"""The API's `error.details.error_code` for a refused budget: the wire keeps its snake_case codes."""

CANCEL_SECONDS = 60.0
"""How long the harness gets to release the sandbox before the execution is deleted regardless."""


def session_admin_routes(gateway: Any, authed: Authed) -> list[Route]:
    sessions = gateway.sessions

    async def delete(request: Request, workspace: str) -> Response:
        session_id = request.path_params["id"]
        handle, description = await own_session(gateway.client, workspace, session_id)
        threads = await _child_ids(handle)  # its threads' logs and its workflow runs go with the session's
        if description.status is not None and description.status.name == "RUNNING":
            try:  # refused while the session runs; else its log ends with session.deleted, and it takes no more
                await update_session(handle, UpdateSessionInput(delete=True))
            except WorkflowUpdateFailedError as exc:
                cause = exc.cause
                if isinstance(cause, ApplicationError) and refusal_type(cause.type) == BUSY:
                    raise ApiError(409, f"session {session_id!r}: {cause.message}") from exc
                raise
            await handle.cancel()
            try:
                await asyncio.wait_for(handle.result(), CANCEL_SECONDS)
            except (WorkflowFailureError, TimeoutError):
                pass  # cancelled (the expected end), or slow to release: deleted all the same
        for workflow_id in [session_id, *threads]:
            try:
                await gateway.records.client.workflow_service.delete_workflow_execution(
                    _delete_request(gateway.records.client.namespace, workflow_id), retry=True
                )
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
            await _until_gone(gateway.client.get_workflow_handle(workflow_id))
            if workflow_id == session_id:
                await gateway.tell("session.deleted", session_id, workspace)
            try:  # what the blob store keeps of it (earlier runs, whole tool outputs) goes too
                await asyncio.to_thread(forget_session, open_blob_store(), workflow_id)
            except (BlobStoreError, OSError) as exc:
                logger.warning("%s is deleted, but its blobs could not be: %s", workflow_id, exc)
        return JSONResponse({"id": session_id, "type": "session_deleted"})

    async def update(request: Request, workspace: str) -> Response:
        changes = await body(request)
        if "vault_ids" in changes:
            raise invalid("vault_ids: a session's vaults are set when it is created (as upstream, not yet changeable)")
        unsupported = sorted(set(changes) - {"title", "metadata", "budget"})
        if unsupported:
            raise invalid(f"{', '.join(unsupported)}: a session's title, metadata and budget can change, not this yet")
        title = changes.get("title")
        if title is not None and not isinstance(title, str):
            raise invalid("title must be a string or null")
        patch = changes.get("metadata") or {}
        if not isinstance(patch, dict) or not all(isinstance(v, str | None) for v in patch.values()):
            raise invalid("metadata must be an object of strings (null removes a key)")
        budget = budget_limit(changes.get("budget"))
        change = UpdateSessionInput(title_set="title" in changes, title=title, metadata=patch,
                                    budget_set="budget" in changes, budget=budget)  # fmt: skip
        answer = await _apply(request, workspace, change)
        await gateway.tell("session.updated", request.path_params["id"], workspace)
        return answer

    async def archive(request: Request, workspace: str) -> Response:
        answer = await _apply(request, workspace, UpdateSessionInput(archive=True))
        await gateway.tell("session.archived", request.path_params["id"], workspace)
        return answer

    async def _apply(request: Request, workspace: str, change: UpdateSessionInput) -> Response:
        session_id = request.path_params["id"]
        handle, description = await own_session(gateway.client, workspace, session_id)
        await refuse_if_ended(handle, description)  # 410, saying how and when it ended
        memo = await description.memo()
        patch_metadata(dict(memo.get("metadata") or {}), change.metadata)  # refuses what a create would refuse
        try:
            await update_session(handle, change)
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            if not isinstance(cause, ApplicationError):
                raise invalid(str(exc)) from exc
            code = BUDGET_ERROR_CODES.get(refusal_type(cause.type) or "")
            raise ApiError(400, cause.message, error_code=code) from exc
        return JSONResponse(await sessions.retrieve(workspace, session_id))

    return [
        Route("/v1/sessions/{id}", authed(delete), methods=["DELETE"]),
        Route("/v1/sessions/{id}", authed(update), methods=["POST"]),
        Route("/v1/sessions/{id}/archive", authed(archive), methods=["POST"]),
    ]


async def _until_gone(handle: WorkflowHandle) -> None:
    """Answer once the execution is gone (bounded by GONE_SECONDS: past it, the delete is answered all the same,
    and the session is gone a little later)."""
    for _ in range(round(GONE_SECONDS / 0.05)):
        try:
            await handle.describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return
            raise
        await asyncio.sleep(0.05)


async def _child_ids(handle: WorkflowHandle) -> list[str]:
    """The ids of a session's child workflows: its threads (but its primary, the session itself) and its runs."""
    threads = await _listed(handle, QUERY_THREADS, list[ThreadInfo])
    runs = await _listed(handle, QUERY_WORKFLOW_RUNS, list[WorkflowRunInfo])
    return [thread.id for thread in threads if thread.parent_thread_id is not None] + [run.id for run in runs]


async def _listed(handle: WorkflowHandle, query: str, kind: Any) -> list[Any]:
    try:
        listed: list[Any] = await handle.query(query, result_type=kind)
    except (RPCError, WorkflowQueryFailedError) as exc:  # a harness older than the query, or none to replay it
        logger.warning("the %s of %s could not be listed, so they stay when it is deleted: %s", query, handle.id, exc)
        return []
    return listed


def _delete_request(namespace: str, session_id: str) -> DeleteWorkflowExecutionRequest:
    return DeleteWorkflowExecutionRequest(
        namespace=namespace, workflow_execution=WorkflowExecution(workflow_id=session_id)
    )
