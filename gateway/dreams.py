"""`/v1/dreams`: create, retrieve, list, cancel and archive dreams (corral.contract.dreams, workflows/dreams.py).

A dream is a `DreamWorkflow` whose id is the dream's; its start input is in its memo, so a listing reads each one's
input from visibility and its state with one query. Every id is checked for its kind and its workspace: the store,
each session, the dream itself (404 for another workspace's, as for none).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from corral.contract.dreams import (
    MAX_DREAM_INSTRUCTIONS,
    MAX_DREAM_SESSIONS,
    DreamInput,
    DreamModel,
    DreamOutputBehavior,
    DreamState,
    dream_view,
)
from corral.contract.records import SEARCH_ATTRIBUTE_ARCHIVED, SEARCH_ATTRIBUTE_WORKSPACE
from corral.contract.search_attributes import ARCHIVED_KEY, STATUS_KEY, WORKSPACE_KEY
from corral.knowledge_db import KnowledgeDB
from corral.memory_stores import MemoryStoreNotFound, MemoryStores
from corral.names import (
    DREAM_ID_PREFIX,
    DREAM_WORKFLOW,
    QUERY_DREAM,
    SEARCH_ATTRIBUTE_STATUS,
    UPDATE_ARCHIVE_DREAM,
    UPDATE_CANCEL_DREAM,
)
from corral.record_ids import new_record_id
from gateway.errors import invalid, not_found
from gateway.http import Authed, body, flag
from gateway.owned import id_of, own_session, own_workflow
from gateway.pages import page_limit, timestamp
from gateway.shapes import problem

STATUSES = ("pending", "running", "completed", "failed", "canceled")


class Dreams:
    def __init__(self, client: Client, db: KnowledgeDB, harness_queue: str, model_queue: str) -> None:
        self.client = client
        self.stores = MemoryStores(db)
        self.db = db
        self.harness_queue = harness_queue
        self.model_queue = model_queue

    async def create(self, request: Request, workspace: str) -> Response:
        payload = await body(request)
        unknown = sorted(set(payload) - {"inputs", "model", "instructions", "output_behavior"})
        if unknown:
            raise invalid(f"unknown dream field(s): {', '.join(unknown)}")
        store_id, session_ids = _inputs(payload.get("inputs"))
        store_id = id_of(store_id, "inputs[memory_store].memory_store_id", "memory store")
        try:
            store = await self.db.run(self.stores.get_store, workspace, store_id)
        except MemoryStoreNotFound as exc:
            raise not_found("memory store", store_id) from exc
        for index, session_id in enumerate(session_ids):
            await own_session(self.client, workspace, session_id, f"inputs[sessions].session_ids[{index}]")
        model = payload.get("model")
        instructions = payload.get("instructions")
        if instructions is not None and (not isinstance(instructions, str)
                                         or not 1 <= len(instructions) <= MAX_DREAM_INSTRUCTIONS):  # fmt: skip
            raise invalid(f"instructions must be 1 to {MAX_DREAM_INSTRUCTIONS} characters")
        try:
            behavior = DreamOutputBehavior.model_validate(payload.get("output_behavior") or {})
            input = DreamInput(
                dream_id=new_record_id(DREAM_ID_PREFIX.removesuffix("_")), workspace=workspace,
                memory_store_id=store_id, memory_store_name=store.name, session_ids=sorted(session_ids),
                model=DreamModel(id=model) if isinstance(model, str) else DreamModel.model_validate(model),
                instructions=instructions, output_behavior=behavior, model_task_queue=self.model_queue,
                created_at=datetime.now(UTC),
            )  # fmt: skip
        except ValidationError as exc:
            raise invalid(problem(exc, "dream")) from exc
        if behavior.type == "update_existing" and behavior.memory_store_id != store_id:
            raise invalid("output_behavior.memory_store_id must be the input memory store for update_existing")
        if behavior.type == "create_new" and behavior.memory_store_id is not None:
            raise invalid("output_behavior: create_new takes no memory_store_id (the dream makes the store)")
        if store.archived_at is not None:
            raise invalid(f"memory store {store_id!r} is archived: it cannot be dreamed over")
        await self.client.start_workflow(
            DREAM_WORKFLOW, input, id=input.dream_id, task_queue=self.harness_queue,
            memo={"input": input.model_dump(mode="json")},
            search_attributes=TypedSearchAttributes([
                SearchAttributePair(WORKSPACE_KEY, workspace), SearchAttributePair(STATUS_KEY, "pending"),
                SearchAttributePair(ARCHIVED_KEY, "false"),
            ]),
            static_summary=f"dream over {len(session_ids)} session(s) and store {store_id}",
        )  # fmt: skip
        return JSONResponse(dream_view(input, DreamState()))

    async def _own(self, workspace: str, value: Any) -> tuple[WorkflowHandle, DreamInput]:
        handle, description = await own_workflow(self.client, workspace, value, "dream_id", "dream", DREAM_WORKFLOW)
        return handle, DreamInput.model_validate((await description.memo())["input"])

    async def retrieve(self, request: Request, workspace: str) -> Response:
        handle, input = await self._own(workspace, request.path_params["dream_id"])
        return JSONResponse(dream_view(input, await handle.query(QUERY_DREAM, result_type=DreamState)))

    async def cancel(self, request: Request, workspace: str) -> Response:
        return await self._change(request, workspace, UPDATE_CANCEL_DREAM)

    async def archive(self, request: Request, workspace: str) -> Response:
        return await self._change(request, workspace, UPDATE_ARCHIVE_DREAM)

    async def _change(self, request: Request, workspace: str, update: str) -> Response:
        handle, input = await self._own(workspace, request.path_params["dream_id"])
        try:
            state = await handle.execute_update(update, result_type=DreamState)
        except WorkflowUpdateFailedError as exc:
            raise invalid(getattr(exc.cause, "message", None) or str(exc)) from exc
        return JSONResponse(dream_view(input, state))

    async def list(self, request: Request, workspace: str) -> Response:
        params = request.query_params
        limit = min(page_limit(params.get("limit")), 100)
        clauses = [f"WorkflowType = '{DREAM_WORKFLOW}'", f"{SEARCH_ATTRIBUTE_WORKSPACE} = '{workspace}'"]
        if not flag(params.get("include_archived")):
            clauses.append(f"{SEARCH_ATTRIBUTE_ARCHIVED} = 'false'")
        statuses = params.getlist("statuses[]")
        bad = sorted(set(statuses) - set(STATUSES))
        if bad:
            raise invalid(f"statuses[]: unknown status {', '.join(bad)} (one of {', '.join(STATUSES)})")
        if statuses:
            clauses.append(f"{SEARCH_ATTRIBUTE_STATUS} IN ({', '.join(repr(s) for s in statuses)})")
        for key, operator in (("gt", ">"), ("gte", ">="), ("lt", "<"), ("lte", "<=")):
            value = params.get(f"created_at[{key}]")
            if value is not None:
                clauses.append(f"StartTime {operator} '{timestamp(value, f'created_at[{key}]')}'")
        found = sorted([e async for e in self.client.list_workflows(" AND ".join(clauses))], key=lambda e: e.id,
                       reverse=True)  # fmt: skip  # ids sort by creation time: newest first
        page = params.get("page")
        if page is not None:
            id_of(page, "page", "dream")
            found = [execution for execution in found if execution.id < page]
        data = []
        for execution in found[:limit]:
            input = DreamInput.model_validate((await execution.memo())["input"])
            state = await self.client.get_workflow_handle(execution.id).query(QUERY_DREAM, result_type=DreamState)
            data.append(dream_view(input, state))
        next_page = found[limit - 1].id if len(found) > limit else None
        return JSONResponse({"data": data, "next_page": next_page})


def _inputs(value: Any) -> tuple[Any, list[str]]:
    """The one memory store and the 1 to 100 sessions of a dream's `inputs`."""
    if not isinstance(value, list) or len(value) != 2 or not all(isinstance(item, dict) for item in value):
        raise invalid("inputs must be exactly one {type: memory_store, memory_store_id} and one "
                      "{type: sessions, session_ids: [...]}")  # fmt: skip
    by_type = {item.get("type"): item for item in value}
    if set(by_type) != {"memory_store", "sessions"}:
        raise invalid("inputs must hold one memory_store input and one sessions input")
    session_ids = by_type["sessions"].get("session_ids")
    if not isinstance(session_ids, list) or not 1 <= len(session_ids) <= MAX_DREAM_SESSIONS:
        raise invalid(f"inputs[sessions].session_ids must list 1 to {MAX_DREAM_SESSIONS} sessions")
    if len(set(map(str, session_ids))) != len(session_ids):
        raise invalid("inputs[sessions].session_ids lists a session twice")
    return by_type["memory_store"].get("memory_store_id"), session_ids


def dream_routes(gateway: Any, authed: Authed) -> list[Route]:
    """`/v1/dreams` (`gateway` is the app's `Gateway`)."""
    dreams = Dreams(gateway.client, gateway.knowledge, gateway.harness_queue, gateway.model_queue)
    return [
        Route("/v1/dreams", authed(dreams.create), methods=["POST"]),
        Route("/v1/dreams", authed(dreams.list), methods=["GET"]),
        Route("/v1/dreams/{dream_id}", authed(dreams.retrieve), methods=["GET"]),
        Route("/v1/dreams/{dream_id}/cancel", authed(dreams.cancel), methods=["POST"]),
        Route("/v1/dreams/{dream_id}/archive", authed(dreams.archive), methods=["POST"]),
    ]
