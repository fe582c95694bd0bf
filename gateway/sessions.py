"""Sessions over HTTP: a session is a `SessionWorkflow` whose log is its events (`gateway/events.py`).

Workspaces: a session started here carries the `CorralWorkspace` search attribute, and every request checks it,
answering 404 for another workspace's session. The agent (the version pinned at creation) and the environment id
ride in the workflow's memo, so a listing needs no query per session.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from corral.client import new_session_id, start_session
from corral.contract.knowledge import SessionKnowledge
from corral.contract.pricing import PRICES_ENVIRONMENT_VARIABLE, NotBudgetable, parse_prices, price_in_force
from corral.contract.records import SEARCH_ATTRIBUTE_WORKSPACE
from corral.contract.sandbox import Environment
from corral.contract.session import SendEventsInput, SessionBudget, SessionInput, parse_user_events
from corral.contract.work import SelfHostedEnvironment
from corral.names import SESSION_WORKFLOW
from corral.records import Records, RecordView
from corral.webhooks import Webhooks, webhook_event
from corral.work_queue import WorkQueues
from gateway.environment_config import SELF_HOSTED, config_type, environment_recipe
from gateway.errors import ApiError, invalid
from gateway.events import write_events
from gateway.file_rubrics import resolve_file_rubrics
from gateway.hands import check_hands
from gateway.http import Authed, body
from gateway.multiagent_session import DEFAULT_LIMITS, SessionLimits, resolve_multiagent
from gateway.owned import WORKSPACE_KEY, own_record, own_session, sessions_made_by
from gateway.pages import page_limit, session_after, session_cursor, timestamp
from gateway.repositories import (
    forget_repository_tokens,
    repository_views,
    session_repositories,
    store_repository_tokens,
)
from gateway.session_knowledge import KnowledgeResolver
from gateway.session_knowledge import knowledge_resources as split_resources
from gateway.session_status import SESSION_STATUSES, STATUS_KEY, api_status, session_view, view, waiting
from gateway.shapes import (
    agent_body,
    agent_config,
    agent_view,
    budget_limit,
    check_metadata,
)
from gateway.vaults import check_vault_ids

if TYPE_CHECKING:
    from gateway.app import Gateway


INITIAL_EVENT_TYPES = frozenset({"user.message", "user.define_outcome", "system.message"})
"""What a session may be created with (upstream's `initial_events`)."""
OVERRIDABLE = frozenset({"model", "system", "tools", "mcp_servers", "skills"})
"""What an `agent_with_overrides` may replace (skills are checked for their shape as on agents)."""


class Sessions:
    """The session endpoints, over one Temporal client."""

    def __init__(self, client: Client, records: Records, work_queues: WorkQueues, harness_queue: str,
                 model_queue: str, limits: SessionLimits = DEFAULT_LIMITS,
                 knowledge: KnowledgeResolver | None = None, webhooks: Webhooks | None = None) -> None:  # fmt: skip
        self.client = client
        self.webhooks = webhooks
        """The workspace's webhook endpoints: a session made where one is emits its events (None: never)."""
        self.knowledge = knowledge
        """Resolves files, memory stores and skills (gateway/session_knowledge.py); None: a session has none."""
        self.records = records
        self.work_queues = work_queues
        self.harness_queue = harness_queue
        self.model_queue = model_queue
        self.limits = limits
        """What a multi-agent session may spawn and start in all (threads, workflow runs, threads per run)."""

    # ---- endpoints ------------------------------------------------------------------------------------------

    async def create(self, workspace: str, request: dict[str, Any], *, session_id: str | None = None,
                     deployment_id: str | None = None) -> dict[str, Any]:  # fmt: skip
        """`POST /v1/sessions`; a deployment run gives the `session_id` (made from the run's) and its
        `deployment_id`: a session of that id that exists already (a retried run) is only given its initial events
        again, which carry ids, so the session takes each once."""
        known = {"agent", "environment_id", "title", "metadata", "vault_ids", "resources", "initial_events", "budget"}
        unknown = sorted(set(request) - known)
        if unknown:
            raise invalid(f"unknown session field(s): {', '.join(unknown)}")
        if session_id is not None:
            existing = await self._existing(workspace, session_id, request.get("initial_events") or [])
            if existing is not None:
                return existing
        repository_resources, knowledge_resources = split_resources(request.get("resources"))
        repositories = session_repositories(repository_resources)  # checked here; their tokens go to Vault
        agent = await self._agent(workspace, request.get("agent"))
        await check_hands(self.records, workspace, agent.body.get("tools"), "agent.tools", self.own_queues())
        environment_id = request.get("environment_id")
        if environment_id is None:
            raise invalid("environment_id is required")
        environment = await own_record(self.records, workspace, environment_id, "environment", "environment_id")
        if environment.archived_at is not None:
            raise ApiError(400, f"environment {environment_id!r} is archived", error_code="environment_archived")
        hands = session_environment(environment, workspace)
        if isinstance(hands, SelfHostedEnvironment):
            _check_self_hosted(repositories, agent, knowledge_resources)
        initial = request.get("initial_events") or []
        if not isinstance(initial, list) or len(initial) > 50:
            raise invalid("initial_events must be a list of at most 50 events")
        _check_initial_events(initial)  # before the session exists: a refused create leaves nothing behind
        title = request.get("title")
        if title is not None and not isinstance(title, str):
            raise invalid("title must be a string")
        vault_ids = request.get("vault_ids") or []
        if not isinstance(vault_ids, list) or not all(isinstance(v, str) for v in vault_ids):
            raise invalid("vault_ids must be a list of vault ids")
        await check_vault_ids(self.records, workspace, vault_ids)
        budget = _session_budget(request.get("budget"), agent.body)
        snapshot = agent_view(agent.id, agent.version, agent.body, agent.created_at, agent.updated_at, None)
        multiagent = await resolve_multiagent(self.records, workspace, agent.body.get("multiagent"), snapshot,
                                              self.limits, self.own_queues())  # fmt: skip
        snapshot["multiagent"] = multiagent.view if multiagent is not None else None
        knowledge: SessionKnowledge | None = None
        knowledge_views: list[dict[str, Any]] = []
        if self.knowledge is not None:
            knowledge, knowledge_views, snapshot["skills"] = await self.knowledge.session(
                workspace, knowledge_resources, agent.body.get("skills") or []
            )
            if isinstance(hands, SelfHostedEnvironment):
                knowledge.skills_dir = "skills"  # where the SDK's worker unpacks them, in its own directory
        elif knowledge_resources:
            raise invalid("resources: this gateway serves no files or memory stores")
        try:
            input = SessionInput(
                agent=agent_config(agent.body, multiagent),
                title=title,
                metadata=check_metadata(request.get("metadata")),
                environment=hands,
                vault_ids=vault_ids,
                resources=[repository.resource for repository in repositories],
                knowledge=knowledge,
                model_task_queue=self.model_queue,
                budget=budget,
                webhooks=await self._webhooks_on(workspace),
                deployment_id=deployment_id,
            )
        except ValidationError as exc:
            raise invalid(str(exc)) from exc
        resources = repository_views(repositories) + knowledge_views  # the view never has a token
        memo = {"agent": snapshot, "environment_id": environment_id, "vault_ids": vault_ids, "title": title,
                "metadata": input.metadata, "resources": resources,
                "budget": budget.model_dump(mode="json", exclude={"price"}) if budget else None}  # fmt: skip
        if deployment_id is not None:
            memo["deployment_id"] = deployment_id
        session_id = session_id or new_session_id()
        if isinstance(hands, SelfHostedEnvironment):  # its worker polls the queue before the first call asks it
            await self.work_queues.ensure(hands.environment_id, workspace)
        await store_repository_tokens(session_id, repositories)  # before the start, as `corral start --repo` does
        try:
            handle = await start_session(
                self.client,
                input,
                session_id=session_id,
                task_queue=self.harness_queue,
                search_attributes=TypedSearchAttributes(
                    [SearchAttributePair(WORKSPACE_KEY, workspace), SearchAttributePair(STATUS_KEY, "idle")]
                ),
                memo=memo,
            )
        except BaseException:
            await forget_repository_tokens(session_id, repositories)
            raise
        await self._tell("session.created", handle.id, workspace)
        if initial:
            await write_events(handle, initial)
        handle, description = await own_session(self.client, workspace, handle.id)
        return {**await view(handle, description), "resources": resources}

    async def _webhooks_on(self, workspace: str) -> bool:
        if self.webhooks is None:
            return False
        endpoints = self.webhooks.endpoints
        return await endpoints.db.run(endpoints.any_in, workspace)

    async def _tell(self, type: str, session_id: str, workspace: str) -> None:
        if self.webhooks is not None:
            await self.webhooks.tell(webhook_event(type, session_id, workspace, key=f"{session_id}/{type}"))

    async def _existing(self, workspace: str, session_id: str, initial: list[Any]) -> dict[str, Any] | None:
        """The session of that id, given its initial events again (taken once each, by their ids); None: none yet."""
        try:
            handle, description = await own_session(self.client, workspace, session_id)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        if initial:
            await write_events(handle, initial)
        return await view(handle, description)

    async def _agent(self, workspace: str, reference: Any) -> RecordView:
        """The agent version a session runs: by id (the latest), `{type: "agent", id, version}`, or
        `{type: "agent_with_overrides", id, version?, model?, system?, tools?, mcp_servers?}`, whose fields replace
        the agent's for this session only (the agent itself is unchanged)."""
        overrides: dict[str, Any] | None = None
        kind = reference.get("type", "agent") if isinstance(reference, dict) else None
        if isinstance(reference, str):
            agent_id, version = reference, None
        elif isinstance(reference, dict) and kind in ("agent", "agent_with_overrides") and reference.get("id"):
            agent_id, version = reference["id"], reference.get("version")
            if version is not None and (not isinstance(version, int) or version < 1):
                raise invalid("agent.version must be a positive integer")
            if kind == "agent_with_overrides":
                overrides = {key: value for key, value in reference.items() if key not in ("type", "id", "version")}
                unknown = sorted(set(overrides) - OVERRIDABLE)
                if unknown:
                    raise invalid(
                        f"agent: {', '.join(unknown)} cannot be overridden (only {', '.join(sorted(OVERRIDABLE))})"
                    )
        else:
            raise invalid(
                "agent must be an agent id, {type: 'agent', id, version} or {type: 'agent_with_overrides', id, ...}"
            )
        field = "agent" if isinstance(reference, str) else "agent.id"
        agent = await own_record(self.records, workspace, agent_id, "agent", field, version)
        if agent.archived_at is not None:
            raise ApiError(400, f"agent {agent_id!r} is archived", error_code="agent_archived")
        if overrides is not None:
            agent = agent.model_copy(update={"body": agent_body(overrides, current=agent.body)})
        return agent

    async def retrieve(self, workspace: str, session_id: str) -> dict[str, Any]:
        handle, description = await own_session(self.client, workspace, session_id)
        data = await view(handle, description)  # gateway/session_status.py: a status true at every point
        if waits := await waiting(self.client, description):
            data["waiting"] = waits  # only in a retrieve: a create or a listing does not pay for the queue figures
        return data

    async def list_sessions(self, workspace: str, params: Any) -> dict[str, Any]:
        limit = page_limit(params.get("limit"))
        order = params.get("order", "desc")
        if order not in ("asc", "desc"):
            raise invalid("order must be asc or desc")
        # Not a dream's own session (a child workflow of its dream): it is the dream's, and `dreams.retrieve` names it.
        clauses = [f"WorkflowType = '{SESSION_WORKFLOW}'", f"{SEARCH_ATTRIBUTE_WORKSPACE} = '{workspace}'",
                   "ParentWorkflowId IS NULL"]  # fmt: skip
        made_by = await sessions_made_by(self.records, workspace, params)
        statuses = set(params.getlist("statuses[]"))
        bad = sorted(statuses - SESSION_STATUSES)
        if bad:
            raise invalid(f"statuses[]: unknown status {', '.join(bad)}")
        for key, operator in (("gt", ">"), ("gte", ">="), ("lt", "<"), ("lte", "<=")):
            value = params.get(f"created_at[{key}]")
            if value is not None:
                clauses.append(f"StartTime {operator} '{timestamp(value, f'created_at[{key}]')}'")
        after = session_after(params["page"]) if params.get("page") else None
        query = " AND ".join(clauses)
        # Every matching session's listing entry (no query per session), sorted here: the dev server's visibility
        # has no ORDER BY. Fine for the thousands of sessions of a workspace; a cluster with advanced visibility
        # could push the order and the cursor into the query.
        found = [execution async for execution in self.client.list_workflows(query)]
        found.sort(key=lambda e: (e.start_time, e.id), reverse=order == "desc")
        if after is not None:
            found = [e for e in found if ((e.start_time.isoformat(), e.id) < after) == (order == "desc")
                     and (e.start_time.isoformat(), e.id) != after]  # fmt: skip
        include_archived = (params.get("include_archived") or "").lower() in ("true", "1")
        shown = [(execution, await execution.memo()) for execution in found]
        shown = [(e, memo) for e, memo in shown if include_archived or not memo.get("archived_at")]
        shown = [(e, memo) for e, memo in shown if made_by(memo.get("agent") or {})]
        deployment_id = params.get("deployment_id")
        if deployment_id is not None:  # the sessions its runs made (a deployment of the workspace's, else 404)
            await own_record(self.records, workspace, deployment_id, "deployment", "deployment_id")
            shown = [(e, memo) for e, memo in shown if memo.get("deployment_id") == deployment_id]
        store_id = await self._store_filter(workspace, params.get("memory_store_id"))
        if store_id is not None:  # the sessions the store is attached to
            shown = [(e, memo) for e, memo in shown
                     if store_id in {r.get("memory_store_id") for r in memo.get("resources") or []}]  # fmt: skip
        if statuses:  # the status the view shows (a closed or archived session is terminated, whatever it last wrote)
            shown = [(e, memo) for e, memo in shown
                     if api_status(memo, e.close_time, None, e.typed_search_attributes) in statuses]  # fmt: skip
        data = [
            session_view(e.id, memo, e.start_time, e.close_time, None, e.typed_search_attributes)
            for e, memo in shown[:limit]
        ]
        last = shown[limit - 1][0] if len(shown) > limit else None
        next_page = session_cursor(last.start_time, last.id) if last is not None else None
        return {"data": data, "next_page": next_page, "prev_page": None}

    async def _store_filter(self, workspace: str, value: Any) -> str | None:
        """A listing's `memory_store_id`: a memory store of the workspace (400 for another kind, 404 for none)."""
        if value is None:
            return None
        if self.knowledge is None:
            raise invalid("memory_store_id: this gateway serves no memory stores")
        return await self.knowledge.own_store(workspace, value, "memory_store_id")

    def own_queues(self) -> tuple[str, str]:
        """The task queues of this gateway's own workers, which no hand may name."""
        return self.harness_queue, self.model_queue


def session_environment(environment: RecordView, workspace: str) -> Environment | SelfHostedEnvironment:
    """What a session made in `environment` runs its built-in tools on: a sandbox made from a `cloud` environment's
    recipe, or the work queue of a `self_hosted` one, served by the user's own worker."""
    if config_type(environment.body) == SELF_HOSTED:
        return SelfHostedEnvironment(environment_id=environment.id, workspace=workspace)
    return environment_recipe(environment.body)


def _check_self_hosted(repositories: list[Any], agent: RecordView, knowledge: list[tuple[int, Any]]) -> None:
    """What a session in a self-hosted environment cannot have (400, before anything is written). Its memory stores
    and skills its worker syncs itself (with the session token: gateway/work_auth.py)."""
    if any(resource.get("type") == "file" for _, resource in knowledge):
        raise invalid("resources: a self-hosted environment's worker does not mount files (it runs the tools on its "
                      "own machine): copy the file there, or use a cloud environment")  # fmt: skip
    if repositories:
        raise invalid("resources: a self-hosted environment's worker does not mount resources (it runs the tools in "
                      "its own directory, on its own machine): check the repository out there, or use a cloud "
                      "environment")  # fmt: skip
    if agent.body.get("multiagent"):
        raise invalid("agent.multiagent: a multi-agent session cannot run in a self-hosted environment yet (its "
                      "threads' tools would need self-hosted hands too): use a cloud environment")  # fmt: skip


def _session_budget(raw: Any, agent: Mapping[str, Any]) -> SessionBudget | None:
    """The session's budget with the price in force for its model copied in (the table's, or `CORRAL_MODEL_PRICES`'s
    read here, never by the session); a model with no price is refused, as upstream does."""
    budget = budget_limit(raw)
    if budget is None:
        return None
    model = agent_config(dict(agent)).model
    try:
        price = price_in_force(model, parse_prices(os.environ.get(PRICES_ENVIRONMENT_VARIABLE)))
    except NotBudgetable as exc:
        raise ApiError(400, f"budget: {exc}", error_code="model_not_budgetable") from exc
    return budget.model_copy(update={"price": price})


def _check_initial_events(events: list[Any]) -> None:
    """A session's `initial_events`: user messages and at most one outcome, checked as a sent batch would be, so
    that the session's own validator, which takes one outcome at a time, cannot refuse them once it exists."""
    if not events:
        return
    try:
        parse_user_events(SendEventsInput(events=events))
    except (ValueError, ValidationError) as exc:
        raise invalid(f"initial_{exc}" if str(exc).startswith("events") else f"initial_events: {exc}") from None
    outcomes = 0
    for index, event in enumerate(events):
        if event.get("type") not in INITIAL_EVENT_TYPES:
            raise invalid(f"initial_events[{index}]: a session starts with user.message, user.define_outcome "
                          "and system.message events only")  # fmt: skip
        outcomes += event["type"] == "user.define_outcome"
        if outcomes > 1:
            raise invalid(f"initial_events[{index}]: one outcome at a time (a session pursues one until it ends)")


def session_routes(gateway: Gateway, authed: Authed) -> list[Route]:
    """Sessions made, listed and read (`gateway.sessions`; their events are `gateway/events.py`, and their changes,
    archive and delete `gateway/session_admin.py`)."""
    sessions: Sessions = gateway.sessions

    async def create(request: Request, workspace: str) -> Response:
        given = await body(request)
        if "initial_events" in given:  # a file rubric becomes its text before anything checks the events
            given["initial_events"] = await resolve_file_rubrics(gateway.files, workspace, given["initial_events"],
                                                                 "initial_events")  # fmt: skip
        return JSONResponse(await sessions.create(workspace, given))

    async def retrieve(request: Request, workspace: str) -> Response:
        return JSONResponse(await sessions.retrieve(workspace, request.path_params["id"]))

    async def listing(request: Request, workspace: str) -> Response:
        return JSONResponse(await sessions.list_sessions(workspace, request.query_params))

    return [
        Route("/v1/sessions", authed(create), methods=["POST"]),
        Route("/v1/sessions", authed(listing), methods=["GET"]),
        Route("/v1/sessions/{id}", gateway.credentials.for_session(retrieve), methods=["GET"]),  # a worker's too
    ]
