"""Which ids a request may use: every id a route takes, in its path, query or body, is checked here for its kind
(its prefix, `corral.names.ID_KINDS`) and for its workspace, before anything is read or written.

The wrong kind of id (an agent id where an environment id belongs, a vault id where a session id belongs) is the
caller's mistake, and the answer says so: 400 naming the field. An id of the right kind that is not the caller's
workspace's is a 404, exactly as for one that never existed: an id never tells one workspace that another's exists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from temporalio.client import Client, WorkflowExecutionDescription, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from corral.contract.search_attributes import WORKSPACE_KEY
from corral.names import ID_KINDS, SESSION_WORKFLOW
from corral.records import RecordNotFound, Records, RecordView
from gateway.errors import invalid, not_found
from gateway.http import whole

MAX_ID_LENGTH = 128
"""Longer than any id corral makes: a longer value of the right prefix is an id that does not exist (404)."""

PREFIXES = {kind: prefix for prefix, kind in ID_KINDS.items()}
"""The prefix of each kind of id (`session` -> `sesn_`)."""


def id_of(value: Any, field: str, kind: str) -> str:
    """`value` as an id of `kind`, or a 400 that names `field` and says which kind it was given. Whether such an id
    exists, and in whose workspace, is the lookup's to say (404 alike for both)."""
    prefix = PREFIXES[kind]
    if isinstance(value, str) and value.startswith(prefix):
        return value
    expected = f"{_a(kind)} id ({prefix}…)"
    if not isinstance(value, str):
        raise invalid(f"{field} must be {expected}")
    shown = repr(value[:64] + ("…" if len(value) > 64 else ""))
    given = next((other for other_prefix, other in ID_KINDS.items() if value.startswith(other_prefix)), None)
    if given is not None:
        raise invalid(f"{field}: {shown} is {_a(given)} id, not {expected}")
    raise invalid(f"{field} must be {expected}, not {shown}")


def record_prefix(kind: str) -> str:
    """The id prefix `corral.records.Records.create` takes for `kind` (it adds the `_` itself)."""
    return PREFIXES[kind].removesuffix("_")


async def own_record(
    records: Records, workspace: str, value: Any, kind: str, field: str, version: int | None = None
) -> RecordView:
    """The record `value` names, if it is an id of `kind` (else 400) of `workspace`'s (else 404)."""
    record_id = id_of(value, field, kind)
    try:
        return await records.get(record_id, workspace, version, kind=kind)
    except RecordNotFound as exc:
        raise not_found(kind, record_id if version is None else f"{record_id} version {version}") from exc


async def own_session(
    client: Client, workspace: str, session_id: Any, field: str = "session_id"
) -> tuple[WorkflowHandle, WorkflowExecutionDescription]:
    """The session's handle and description, if `session_id` is a session id (else 400) of `workspace`'s (else
    404, the same as for no session)."""
    return await own_workflow(client, workspace, session_id, field, "session", SESSION_WORKFLOW)


async def own_workflow(
    client: Client, workspace: str, value: Any, field: str, kind: str, workflow_type: str
) -> tuple[WorkflowHandle, WorkflowExecutionDescription]:
    """The handle and description of the object `value` names, when its workflow's id is the object's id (a session,
    a dream): an id of `kind` (else 400), of a `workflow_type` workflow of `workspace`'s (else 404, as for none)."""
    object_id = id_of(value, field, kind)
    if len(object_id) > MAX_ID_LENGTH or not object_id.isascii() or not object_id.isprintable():
        raise not_found(kind, object_id)
    handle = client.get_workflow_handle(object_id)
    try:
        description = await handle.describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise not_found(kind, object_id) from exc
        raise
    if (
        description.workflow_type != workflow_type
        or description.typed_search_attributes.get(WORKSPACE_KEY) != workspace
    ):
        raise not_found(kind, object_id)
    return handle, description


async def sessions_made_by(records: Records, workspace: str, params: Any) -> Callable[[Mapping[str, Any]], bool]:
    """Which sessions (by their agent snapshot) a listing's `agent_id` and `agent_version` keep: the agent id is
    checked like every other (400 for another kind, 404 for another workspace's)."""
    agent_id, version = params.get("agent_id"), whole(params.get("agent_version"), "agent_version")
    if agent_id is None:
        if version is not None:
            raise invalid("agent_version filters by a version of agent_id: give agent_id too")
        return lambda agent: True
    await own_record(records, workspace, agent_id, "agent", "agent_id")
    return lambda agent: agent.get("id") == agent_id and version in (None, agent.get("version"))


WORKSPACE_HEADER = "anthropic-workspace-id"
"""The SDK's `workspace_id`: "if sent, it must match" the key's workspace (a corral key acts on one workspace)."""


def check_selected_workspace(selected: str | None, workspace: str) -> None:
    """A request that selects a workspace selects its key's, or gets the 404 of a workspace that is not there."""
    if selected is not None and selected != workspace:
        raise not_found("workspace", selected)


def _a(kind: str) -> str:
    return f"{'an' if kind[0].lower() in 'aeiou' else 'a'} {kind}"
