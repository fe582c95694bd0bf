"""Deployments (`/v1/deployments`): a saved agent, environment, resources, vaults and initial events, run on a cron
schedule or on demand. Each is a record (kind `deployment`, not versioned: an update replaces it) and, when it has a
schedule, a Temporal Schedule of the same id (`gateway/deployment_schedules.py`) whose fires open deployment runs
(`gateway/deployment_runs.py`). Shapes and checks are `gateway/deployment_shapes.py`.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.records import RecordArchived, RecordView
from corral.webhooks import webhook_event
from gateway.deployment_shapes import deployment_body, deployment_view
from gateway.errors import invalid
from gateway.http import Authed, body, flag, whole
from gateway.owned import own_record, record_prefix
from gateway.pages import instant
from gateway.records import MAX_RECORDS_PER_PAGE, RecordResource
from gateway.vaults import check_vault_ids

if TYPE_CHECKING:
    from gateway.app import Gateway

KIND = "deployment"
STATUSES = ("active", "paused")


class Deployments(RecordResource):
    kind = KIND
    plural = "deployments"
    created_at_bounds = ("created_at[gte]", "created_at[lte]")

    def make_body(self, request: dict[str, Any], current: dict[str, Any] | None = None) -> dict[str, Any]:
        return deployment_body(request, current)

    async def settle(self, workspace: str, made: dict[str, Any], current: RecordView | None) -> dict[str, Any]:
        """The agent pinned: an id is its latest version, `{type: 'agent', id, version}` that version; either must
        exist in the workspace and not be archived (an unchanged agent is not read again)."""
        reference = made["agent"]
        if current is not None and reference == current.body.get("agent"):
            return made
        if isinstance(reference, str):
            agent_id, version, field = reference, None, "agent"
        elif isinstance(reference, dict) and reference.get("type", "agent") == "agent" and reference.get("id"):
            agent_id, version, field = reference["id"], reference.get("version"), "agent.id"
            if version is not None and (not isinstance(version, int) or version < 1):
                raise invalid("agent.version must be a positive integer")
        else:
            raise invalid("agent must be an agent id or {type: 'agent', id, version}")
        agent = await own_record(self.gateway.records, workspace, agent_id, "agent", field, version)
        if agent.archived_at is not None:
            raise invalid(f"agent {agent_id!r} is archived")
        return {**made, "agent": {"type": "agent", "id": agent.id, "version": agent.version}}

    async def check(self, workspace: str, made: dict[str, Any]) -> None:
        environment = await own_record(self.gateway.records, workspace, made["environment_id"], "environment",
                                       "environment_id")  # fmt: skip
        if environment.archived_at is not None:
            raise invalid(f"environment {environment.id!r} is archived")
        await check_vault_ids(self.gateway.records, workspace, made["vault_ids"])

    async def view(self, record: RecordView) -> dict[str, Any]:
        last: datetime | None = None
        upcoming: list[datetime] = []
        if record.body.get("schedule") is not None and record.archived_at is None:
            last, upcoming = await self.gateway.schedules.times(record.id)
        return deployment_view(record, last, upcoming)

    async def emit(self, event_type: str, deployment_id: str, workspace: str) -> None:
        await self.gateway.webhooks.emit([webhook_event(event_type, deployment_id, workspace)])

    def routes(self, authed: Authed) -> list[Route]:
        base, one = "/v1/deployments", "/v1/deployments/{id}"
        return [
            Route(base, authed(self.create), methods=["POST"]),
            Route(base, authed(self.list), methods=["GET"]),
            Route(one, authed(self.retrieve), methods=["GET"]),
            Route(one, authed(self.update), methods=["POST"]),
            Route(one + "/archive", authed(self.archive), methods=["POST"]),
            Route(one + "/pause", authed(self.pause), methods=["POST"]),
            Route(one + "/unpause", authed(self.unpause), methods=["POST"]),
        ]

    # ---- endpoints ------------------------------------------------------------------------------------------

    async def create(self, request: Request, workspace: str) -> Response:
        made = await self.settle(workspace, self.make_body(await body(request)), None)
        await self.check(workspace, made)
        record = await self.gateway.records.create(KIND, workspace, made, record_prefix(KIND))
        try:
            await self.gateway.schedules.sync(record.id, workspace, record.body)
        except BaseException:  # no deployment whose schedule does not exist: it is archived, and the error shown
            await self.gateway.records.archive(record.id, workspace, kind=KIND)
            raise
        await self.emit("deployment.created", record.id, workspace)
        return JSONResponse(await self.view(record))

    async def retrieve(self, request: Request, workspace: str) -> Response:
        return JSONResponse(await self.view(await self.get(workspace, request.path_params["id"])))

    async def update(self, request: Request, workspace: str) -> Response:
        current = await self.get(workspace, request.path_params["id"])
        made = await self.settle(workspace, self.make_body(await body(request), current.body), current)
        await self.check(workspace, made)
        record = await self.put(current, made)
        await self.gateway.schedules.sync(record.id, workspace, record.body)
        await self.emit("deployment.updated", record.id, workspace)
        return JSONResponse(await self.view(record))

    async def put(self, current: RecordView, made: dict[str, Any]) -> RecordView:
        try:
            return await self.gateway.records.put(current.id, current.workspace, made, kind=KIND)
        except RecordArchived as exc:
            raise invalid(f"deployment {current.id!r} is archived and cannot change") from exc

    async def archive(self, request: Request, workspace: str) -> Response:
        current = await self.get(workspace, request.path_params["id"])
        if current.archived_at is None:
            if current.body.get("schedule") is not None:  # kept: the Schedule that knew it is deleted
                last, _ = await self.gateway.schedules.times(current.id)
                current = await self.put(current, {**current.body, "last_run_at": last.isoformat() if last else None})
            await self.gateway.schedules.remove(current.id)
            record = await self.gateway.records.archive(current.id, workspace, kind=KIND)
            await self.emit("deployment.archived", record.id, workspace)
        else:
            record = current
        return JSONResponse(await self.view(record))

    async def pause(self, request: Request, workspace: str) -> Response:
        current = await self.get(workspace, request.path_params["id"])
        record = await pause_deployment(self.gateway, current, {"type": "manual"})
        return JSONResponse(await self.view(record))

    async def unpause(self, request: Request, workspace: str) -> Response:
        current = await self.get(workspace, request.path_params["id"])
        record = current
        if current.body.get("status") == "paused":
            record = await self.put(current, {**current.body, "status": "active", "paused_reason": None})
            await self.gateway.schedules.sync(record.id, workspace, record.body)
            await self.emit("deployment.unpaused", record.id, workspace)
        elif current.archived_at is not None:
            raise invalid(f"deployment {current.id!r} is archived and cannot change")
        return JSONResponse(await self.view(record))

    async def list(self, request: Request, workspace: str) -> Response:
        """Filtered by `agent_id` and `status` here, over the records' own pages: each page read asks for as many
        records as are still missing, so a cursor is always the last record looked at."""
        params = request.query_params
        limit = whole(params.get("limit"), "limit") or 20
        if not 1 <= limit <= MAX_RECORDS_PER_PAGE:
            raise invalid(f"limit must be from 1 to {MAX_RECORDS_PER_PAGE}")
        include_archived = flag(params.get("include_archived"))
        status = params.get("status")
        if status is not None and status not in STATUSES:
            raise invalid("status must be active or paused")
        if status is not None and include_archived:
            raise invalid("status cannot be combined with include_archived (an archived deployment reports active)")
        agent_id = params.get("agent_id")
        if agent_id is not None:
            await own_record(self.gateway.records, workspace, agent_id, "agent", "agent_id")
        gte = instant(params.get("created_at[gte]"), "created_at[gte]")
        lte = instant(params.get("created_at[lte]"), "created_at[lte]", round_up=False)
        found: list[RecordView] = []
        page = params.get("page")
        while True:
            try:
                records, page = await self.gateway.records.list(
                    KIND, workspace, include_archived=include_archived, limit=limit - len(found), page=page,
                    created_at_gte=gte, created_at_lte=lte,
                )  # fmt: skip
            except ValueError as exc:
                raise invalid(f"page: {exc}") from exc
            found += [r for r in records if (agent_id is None or r.body["agent"]["id"] == agent_id)
                      and (status is None or r.body.get("status", "active") == status)]  # fmt: skip
            if page is None or len(found) >= limit:
                break
        return JSONResponse({"data": [await self.view(r) for r in found], "next_page": page})


async def pause_deployment(gateway: Gateway, current: RecordView, reason: dict[str, Any]) -> RecordView:
    """Pause a deployment (by hand, or after a failed scheduled fire) and its Schedule; already paused: unchanged."""
    if current.archived_at is not None:
        raise invalid(f"deployment {current.id!r} is archived and cannot change")
    if current.body.get("status") == "paused":
        return current
    record = await gateway.records.put(current.id, current.workspace,
                                       {**current.body, "status": "paused", "paused_reason": reason},
                                       kind=KIND)  # fmt: skip
    await gateway.schedules.sync(record.id, record.workspace, record.body)
    await gateway.webhooks.emit([webhook_event("deployment.paused", record.id, record.workspace)])
    return record


def deployment_routes(gateway: Gateway, authed: Authed) -> list[Route]:
    return Deployments(gateway).routes(authed)
