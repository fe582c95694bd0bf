"""Which workspace a session belongs to: the one rule every session endpoint applies first."""

from __future__ import annotations

from temporalio.client import Client, WorkflowExecutionDescription, WorkflowHandle
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError, RPCStatusCode

from corral.contract.records import SEARCH_ATTRIBUTE_WORKSPACE
from gateway.errors import not_found

WORKSPACE_KEY = SearchAttributeKey.for_keyword(SEARCH_ATTRIBUTE_WORKSPACE)
"""On every session the gateway starts: the workspace of the key that started it."""


async def own_session(
    client: Client, workspace: str, session_id: str
) -> tuple[WorkflowHandle, WorkflowExecutionDescription]:
    """The session's handle and description, if it is `workspace`'s; else 404, the same as for no session (an id
    never tells one workspace that another's session exists)."""
    if not session_id.startswith("sesn_") or len(session_id) > 64:
        raise not_found("session", session_id)
    handle = client.get_workflow_handle(session_id)
    try:
        description = await handle.describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise not_found("session", session_id) from exc
        raise
    if description.typed_search_attributes.get(WORKSPACE_KEY) != workspace:
        raise not_found("session", session_id)
    return handle, description
