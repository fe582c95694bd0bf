"""Tenants stay apart on every route: one row per route, verb and id position, driven by the official `anthropic`
SDK against a real gateway process (logged in to the OpenBao dev server) on the real Temporal dev server.

Workspace A makes one of everything: an agent (two versions), an environment, a session that has run a turn, a
session with a repository resource, a vault with a credential, a skill with two versions. Then, for every row:
- workspace B names A's id in the row's position: 404, as for an id that does not exist;
- A names one of its own ids of the wrong kind there (an agent id where an environment id belongs): 400 naming
  the field;
and afterwards everything of A's reads exactly as before (versions, events, credentials, resources, listings), and
B's listings show nothing of A's. `test_every_route_has_a_row` fails when a route is added without its rows.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types.beta.sessions.beta_managed_agents_user_define_outcome_event_params import (
    BetaManagedAgentsUserDefineOutcomeEventParams as OutcomeParams,
)
from starlette.routing import Route

from corral.apikeys import create_key
from corral.contract.threads import primary_thread_id
from corral.contract.work import WorkItem, WorkRequest
from corral.records import Records
from corral.work_queue import WorkQueues
from gateway.app import create_app
from tests.chaos._processes import role_process, until_healthy
from tests.conftest import Stack, unique
from tests.ports import free_port
from tests.proxy_servers.devvault import shared_dev_vault
from tests.waits import until

pytestmark = pytest.mark.timeout(600)

Client = anthropic.AsyncAnthropic
JSON = dict[str, Any]
"""What a corral extension (which the SDK has no method for) answers, through the SDK's own client."""


@dataclass(frozen=True)
class Ids:
    """One workspace's objects, by the attribute a row's id position reads."""

    agent: str
    environment: str
    session: str
    vault: str
    repo_session: str = ""
    resource: str = ""
    credential: str = ""
    event: str = ""
    thread: str = ""
    hosted: str = ""
    """A self-hosted environment (the one kind with keys), whose work queue has an item (`work`)."""
    work: str = ""
    worker_key: str = ""
    """The text of the environment key `env_key` (the caller's own, as its worker holds it: not an id position)."""
    env_key: str = ""
    memory_store: str = ""
    memory: str = ""
    memory_version: str = ""
    """A version of `memory` that is no longer its current one."""
    skill: str = ""
    skill_version: str = ""
    """A version of `skill` (it has two, so that one could be deleted)."""
    file: str = ""
    dream: str = ""
    webhook_endpoint: str = ""
    deployment: str = ""
    deployment_run: str = ""
    """A manual run of `deployment` (whose environment was archived: its run made no session)."""


WRONG_KIND = {
    "agent": "environment",
    "environment": "agent",
    "session": "vault",
    "repo_session": "agent",
    "resource": "session",
    "vault": "session",
    "credential": "agent",
    "event": "vault",
    "thread": "session",
    "hosted": "agent",
    "env_key": "agent",
    "work": "session",
    "memory_store": "memory",
    "memory": "memory_version",
    "memory_version": "memory",
    "skill": "agent",
    "skill_version": "skill",
    "file": "session",
    "dream": "memory_store",
    "webhook_endpoint": "vault",
    "deployment": "agent",
    "deployment_run": "deployment",
}
"""For each id position, the attribute of a real id of another kind (of the same workspace) to put there."""

Call = Callable[[Client, Ids, Ids], Awaitable[Any]]
"""A row's request: (client, the ids it names, the caller's own ids for the positions not under test)."""


@dataclass(frozen=True)
class Row:
    method: str
    route: str
    param: str
    """The route's path parameter under test, or `body:<field>` / `query:<name>` for an id in the body or query."""
    position: str
    """The `Ids` attribute the position takes."""
    field: str
    """The field a 400 for the wrong kind names."""
    call: Call
    cross: int | None = 404
    """What another workspace's id there gets, with every other id the caller's own: 404, as for no such id. An
    event id (or the thread an interrupt names) is looked for in the caller's own session, which says it has none
    (400); a resource id (`repo1`) names
    a resource within its session, so another workspace's is reached only through its session (None: no check)."""


def rows() -> list[Row]:
    agents, environments, sessions, vaults = "/v1/agents", "/v1/environments", "/v1/sessions", "/v1/vaults"
    agent, env, session, vault = agents + "/{id}", environments + "/{id}", sessions + "/{id}", vaults + "/{id}"
    resource, credential = session + "/resources/{resource_id}", vault + "/credentials/{credential_id}"
    thread = session + "/threads/{thread_id}"
    bearer = {"type": "static_bearer", "mcp_server_url": "https://mcp.example/mcp", "token": "t0k-" + "x" * 8}
    confirm: Call = lambda c, t, o: c.beta.sessions.events.send(  # noqa: E731
        o.session, events=[{"type": "user.tool_confirmation", "tool_use_id": t.event, "result": "allow"}]
    )
    interrupt: Call = lambda c, t, o: c.beta.sessions.events.send(  # noqa: E731
        o.session, events=[{"type": "user.interrupt", "session_thread_id": t.thread}]
    )
    work_queue = env + "/work"
    files = "/v1/files"
    file = files + "/{id}"
    work = work_queue + "/{work_id}"
    skill, skill_version = "/v1/skills/{id}", "/v1/skills/{id}/versions/{version}"
    skill_files = [("tools/SKILL.md", SKILL_MD)]

    def worker(c: Client, own: Ids) -> Any:  # the caller's own environment key, as the SDK's worker holds it
        return c.with_options(api_key=own.worker_key).beta.environments.work

    return [
        Row("GET", agent, "id", "agent", "agent_id", lambda c, t, o: c.beta.agents.retrieve(t.agent)),
        Row("POST", agent, "id", "agent", "agent_id",
            lambda c, t, o: c.beta.agents.update(t.agent, version=2, system="x")),
        Row("POST", agent + "/archive", "id", "agent", "agent_id", lambda c, t, o: c.beta.agents.archive(t.agent)),
        Row("GET", agent + "/versions", "id", "agent", "agent_id",
            lambda c, t, o: c.beta.agents.versions.list(t.agent)),
        Row("POST", agents, "body:multiagent.agents", "agent", "multiagent.agents[0]",
            lambda c, t, o: c.beta.agents.create(name="lead", model="m",
                                                 multiagent={"type": "coordinator", "agents": [t.agent]})),
        Row("POST", agent, "body:multiagent.subagents", "agent", "multiagent.subagents.predefined_agents[0]",
            lambda c, t, o: c.beta.agents.update(o.agent, multiagent={
                "type": "multiagent_20261001", "subagents": {"type": "enabled", "predefined_agents": [t.agent]}})),
        Row("GET", env, "id", "environment", "environment_id",
            lambda c, t, o: c.beta.environments.retrieve(t.environment)),
        Row("POST", env, "id", "environment", "environment_id",
            lambda c, t, o: c.beta.environments.update(t.environment, name="taken")),
        Row("DELETE", env, "id", "environment", "environment_id",
            lambda c, t, o: c.beta.environments.delete(t.environment)),
        Row("POST", env + "/archive", "id", "environment", "environment_id",
            lambda c, t, o: c.beta.environments.archive(t.environment)),
        Row("POST", env + "/keys", "id", "hosted", "environment_id",
            lambda c, t, o: c.post(f"/v1/environments/{t.hosted}/keys", cast_to=JSON)),
        Row("GET", env + "/keys", "id", "hosted", "environment_id",
            lambda c, t, o: c.get(f"/v1/environments/{t.hosted}/keys", cast_to=JSON)),
        *(
            Row("POST", env + "/keys/{key_id}/revoke", param, position, field,
                lambda c, t, o: c.post(f"/v1/environments/{t.hosted}/keys/{t.env_key}/revoke", cast_to=JSON))
            for param, position, field in (("id", "hosted", "environment_id"), ("key_id", "env_key", "key_id"))
        ),
        Row("GET", work_queue + "/poll", "id", "hosted", "environment_id",
            lambda c, t, o: worker(c, o).poll(t.hosted)),
        Row("GET", work_queue + "/stats", "id", "hosted", "environment_id",
            lambda c, t, o: c.beta.environments.work.stats(t.hosted)),
        Row("GET", work_queue, "id", "hosted", "environment_id",
            lambda c, t, o: worker(c, o).list(t.hosted)),
        *(
            Row(method, route, param, position, field, call)
            for param, position, field in (("id", "hosted", "environment_id"), ("work_id", "work", "work_id"))
            for method, route, call in (
                ("POST", work + "/ack", lambda c, t, o: worker(c, o).ack(t.work, environment_id=t.hosted)),
                ("POST", work + "/heartbeat", lambda c, t, o: worker(c, o).heartbeat(
                    t.work, environment_id=t.hosted, expected_last_heartbeat="NO_HEARTBEAT")),
                ("POST", work + "/stop", lambda c, t, o: worker(c, o).stop(t.work, environment_id=t.hosted)),
                ("GET", work, lambda c, t, o: c.beta.environments.work.retrieve(t.work, environment_id=t.hosted)),
                ("POST", work, lambda c, t, o: c.beta.environments.work.update(
                    t.work, environment_id=t.hosted, metadata={"taken": "yes"})),
            )
        ),
        Row("POST", sessions, "body:agent", "agent", "agent",
            lambda c, t, o: c.beta.sessions.create(agent=t.agent, environment_id=o.environment)),
        Row("POST", sessions, "body:agent.id", "agent", "agent.id",
            lambda c, t, o: c.beta.sessions.create(agent={"type": "agent", "id": t.agent},
                                                   environment_id=o.environment)),
        Row("POST", sessions, "body:environment_id", "environment", "environment_id",
            lambda c, t, o: c.beta.sessions.create(agent=o.agent, environment_id=t.environment)),
        Row("POST", sessions, "body:vault_ids", "vault", "vault_ids[1]",
            lambda c, t, o: c.beta.sessions.create(agent=o.agent, environment_id=o.environment,
                                                   vault_ids=[o.vault, t.vault])),
        Row("GET", sessions, "query:agent_id", "agent", "agent_id",
            lambda c, t, o: c.beta.sessions.list(agent_id=t.agent)),
        Row("GET", session, "id", "session", "session_id", lambda c, t, o: c.beta.sessions.retrieve(t.session)),
        Row("POST", session, "id", "session", "session_id",
            lambda c, t, o: c.beta.sessions.update(t.session, title="x")),
        Row("DELETE", session, "id", "session", "session_id", lambda c, t, o: c.beta.sessions.delete(t.session)),
        Row("POST", session + "/archive", "id", "session", "session_id",
            lambda c, t, o: c.beta.sessions.archive(t.session)),
        Row("GET", session + "/events", "id", "session", "session_id",
            lambda c, t, o: c.beta.sessions.events.list(t.session)),
        Row("POST", session + "/events", "id", "session", "session_id",
            lambda c, t, o: c.beta.sessions.events.send(t.session, events=[{"type": "user.interrupt"}])),
        Row("POST", session + "/events", "body:events[].tool_use_id", "event", "events[0].tool_use_id", confirm, 400),
        Row("POST", session + "/events", "body:events[].session_thread_id", "thread", "events[0].session_thread_id",
            interrupt, 400),
        Row("GET", session + "/events/stream", "id", "session", "session_id",
            lambda c, t, o: c.beta.sessions.events.stream(t.session)),
        Row("GET", session + "/threads", "id", "session", "session_id",
            lambda c, t, o: c.beta.sessions.threads.list(t.session)),
        *(
            Row(method, route, param, position, field, call)
            for param, position, field in (("id", "session", "session_id"), ("thread_id", "thread", "thread_id"))
            for method, route, call in (
                ("GET", thread, lambda c, t, o: c.beta.sessions.threads.retrieve(t.thread, session_id=t.session)),
                ("POST", thread + "/archive",
                 lambda c, t, o: c.beta.sessions.threads.archive(t.thread, session_id=t.session)),
                ("GET", thread + "/events",
                 lambda c, t, o: c.beta.sessions.threads.events.list(t.thread, session_id=t.session)),
                ("GET", thread + "/stream",
                 lambda c, t, o: c.beta.sessions.threads.events.stream(t.thread, session_id=t.session)),
            )
        ),
        Row("GET", session + "/resources", "id", "repo_session", "session_id",
            lambda c, t, o: c.beta.sessions.resources.list(t.repo_session)),
        Row("POST", session + "/resources", "id", "repo_session", "session_id",
            lambda c, t, o: c.beta.sessions.resources.add(t.repo_session, type="file", file_id="file_x")),
        *(
            Row(method, resource, param, position, field, call, cross)
            for param, position, field, cross in (("id", "repo_session", "session_id", 404),
                                                  ("resource_id", "resource", "resource_id", None))
            for method, call in (
                ("GET", lambda c, t, o: c.beta.sessions.resources.retrieve(t.resource, session_id=t.repo_session)),
                ("POST", lambda c, t, o: c.beta.sessions.resources.update(
                    t.resource, session_id=t.repo_session, authorization_token="ghp_taken")),
                ("DELETE", lambda c, t, o: c.beta.sessions.resources.delete(t.resource, session_id=t.repo_session)),
            )
        ),
        Row("POST", agents, "body:skills", "skill", "skills[0].skill_id",
            lambda c, t, o: c.beta.agents.create(name="x", model="m",
                                                 skills=[{"type": "custom", "skill_id": t.skill}])),
        Row("GET", skill, "id", "skill", "skill_id", lambda c, t, o: c.beta.skills.retrieve(t.skill)),
        Row("DELETE", skill, "id", "skill", "skill_id", lambda c, t, o: c.beta.skills.delete(t.skill)),
        Row("GET", skill + "/versions", "id", "skill", "skill_id",
            lambda c, t, o: c.beta.skills.versions.list(t.skill)),
        Row("POST", skill + "/versions", "id", "skill", "skill_id",
            lambda c, t, o: c.beta.skills.versions.create(t.skill, files=skill_files)),
        *(
            Row(method, route, param, position, field, call)
            for param, position, field in (("id", "skill", "skill_id"), ("version", "skill_version", "version"))
            for method, route, call in (
                ("GET", skill_version,
                 lambda c, t, o: c.beta.skills.versions.retrieve(t.skill_version, skill_id=t.skill)),
                ("DELETE", skill_version,
                 lambda c, t, o: c.beta.skills.versions.delete(t.skill_version, skill_id=t.skill)),
                ("GET", skill_version + "/content",
                 lambda c, t, o: c.beta.skills.versions.download(t.skill_version, skill_id=t.skill)),
            )
        ),
        Row("GET", vault, "id", "vault", "vault_id", lambda c, t, o: c.beta.vaults.retrieve(t.vault)),
        Row("POST", vault, "id", "vault", "vault_id", lambda c, t, o: c.beta.vaults.update(t.vault, display_name="x")),
        Row("DELETE", vault, "id", "vault", "vault_id", lambda c, t, o: c.beta.vaults.delete(t.vault)),
        Row("POST", vault + "/archive", "id", "vault", "vault_id", lambda c, t, o: c.beta.vaults.archive(t.vault)),
        Row("GET", vault + "/credentials", "id", "vault", "vault_id",
            lambda c, t, o: c.beta.vaults.credentials.list(t.vault)),
        Row("POST", vault + "/credentials", "id", "vault", "vault_id",
            lambda c, t, o: c.beta.vaults.credentials.create(t.vault, auth=bearer)),  # type: ignore[arg-type]
        *(
            Row(method, route, param, position, field, call)
            for param, position, field in (("id", "vault", "vault_id"),
                                           ("credential_id", "credential", "credential_id"))
            for method, route, call in (
                ("GET", credential,
                 lambda c, t, o: c.beta.vaults.credentials.retrieve(t.credential, vault_id=t.vault)),
                ("POST", credential,
                 lambda c, t, o: c.beta.vaults.credentials.update(t.credential, vault_id=t.vault, display_name="x")),
                ("DELETE", credential,
                 lambda c, t, o: c.beta.vaults.credentials.delete(t.credential, vault_id=t.vault)),
                ("POST", credential + "/archive",
                 lambda c, t, o: c.beta.vaults.credentials.archive(t.credential, vault_id=t.vault)),
                ("POST", credential + "/mcp_oauth_validate",
                 lambda c, t, o: c.beta.vaults.credentials.mcp_oauth_validate(t.credential, vault_id=t.vault)),
            )
        ),
        Row("GET", file, "id", "file", "file_id", lambda c, t, o: c.beta.files.retrieve_metadata(t.file)),
        Row("GET", file + "/content", "id", "file", "file_id", lambda c, t, o: c.beta.files.download(t.file)),
        Row("DELETE", file, "id", "file", "file_id", lambda c, t, o: c.beta.files.delete(t.file)),
        # A listing by ids drops another workspace's (checked in tests/test_api_files.py): no 404 to see here.
        Row("GET", files, "query:ids[]", "file", "ids[0]", lambda c, t, o: c.beta.files.list(ids=[t.file]),
            cross=None),
        Row("POST", session + "/events", "body:rubric.file_id", "file", "events[0].rubric.file_id",
            lambda c, t, o: c.beta.sessions.events.send(o.session, events=[file_rubric(t.file)])),
        Row("POST", sessions, "body:initial_events.rubric.file_id", "file", "initial_events[0].rubric.file_id",
            lambda c, t, o: c.beta.sessions.create(agent=o.agent, environment_id=o.environment,
                                                   initial_events=[file_rubric(t.file)])),
        *memory_rows(),
        *dream_rows(),
        *webhook_rows(),
        *deployment_rows(),
    ]  # fmt: skip


def deployment_rows() -> list[Row]:
    deployments, deployment = "/v1/deployments", "/v1/deployments/{id}"
    hello: Any = [{"type": "user.message", "content": [{"type": "text", "text": "hello"}]}]
    create: Call = lambda c, t, o: c.beta.deployments.create(  # noqa: E731
        agent=t.agent, environment_id=t.environment, name="d", initial_events=hello, vault_ids=[t.vault]
    )
    by_id = ("id", "deployment", "deployment_id")
    return [
        Row("POST", deployments, "body:agent", "agent", "agent", create),
        Row("POST", deployments, "body:environment_id", "environment", "environment_id", create),
        Row("POST", deployments, "body:vault_ids", "vault", "vault_ids[0]", create),
        Row("GET", deployments, "query:agent_id", "agent", "agent_id",
            lambda c, t, o: c.beta.deployments.list(agent_id=t.agent)),
        Row("GET", deployment, *by_id, lambda c, t, o: c.beta.deployments.retrieve(t.deployment)),
        Row("POST", deployment, *by_id, lambda c, t, o: c.beta.deployments.update(t.deployment, name="taken")),
        Row("POST", deployment, "body:environment_id", "environment", "environment_id",
            lambda c, t, o: c.beta.deployments.update(o.deployment, environment_id=t.environment)),
        Row("POST", deployment + "/archive", *by_id, lambda c, t, o: c.beta.deployments.archive(t.deployment)),
        Row("POST", deployment + "/pause", *by_id, lambda c, t, o: c.beta.deployments.pause(t.deployment)),
        Row("POST", deployment + "/unpause", *by_id, lambda c, t, o: c.beta.deployments.unpause(t.deployment)),
        Row("POST", deployment + "/run", *by_id, lambda c, t, o: c.beta.deployments.run(t.deployment)),
        Row("GET", "/v1/deployment_runs/{id}", "id", "deployment_run", "deployment_run_id",
            lambda c, t, o: c.beta.deployment_runs.retrieve(t.deployment_run)),
        Row("GET", "/v1/sessions", "query:deployment_id", "deployment", "deployment_id",
            lambda c, t, o: c.beta.sessions.list(deployment_id=t.deployment)),
        # Upstream: a deployment_id that does not exist lists no runs (200); another workspace's is the same.
        Row("GET", "/v1/deployment_runs", "query:deployment_id", "deployment", "deployment_id",
            lambda c, t, o: c.beta.deployment_runs.list(deployment_id=t.deployment), cross=None),
    ]  # fmt: skip


def dream_inputs(ids: Ids) -> Any:
    return [{"type": "memory_store", "memory_store_id": ids.memory_store},
            {"type": "sessions", "session_ids": [ids.session]}]  # fmt: skip


def dream_rows() -> list[Row]:
    dreams, dream = "/v1/dreams", "/v1/dreams/{dream_id}"
    create: Call = lambda c, t, o: c.beta.dreams.create(inputs=dream_inputs(t), model="claude-sonnet-4-6")  # noqa: E731
    return [
        Row("POST", dreams, "body:inputs.memory_store_id", "memory_store", "inputs[memory_store].memory_store_id",
            create),
        Row("POST", dreams, "body:inputs.session_ids", "session", "inputs[sessions].session_ids[0]", create),
        Row("GET", dream, "dream_id", "dream", "dream_id", lambda c, t, o: c.beta.dreams.retrieve(t.dream)),
        Row("POST", dream + "/cancel", "dream_id", "dream", "dream_id", lambda c, t, o: c.beta.dreams.cancel(t.dream)),
        Row("POST", dream + "/archive", "dream_id", "dream", "dream_id",
            lambda c, t, o: c.beta.dreams.archive(t.dream)),
    ]  # fmt: skip


def webhook_action(action: str) -> Call:
    return lambda c, t, o: c.post(f"/v1/webhook_endpoints/{t.webhook_endpoint}/{action}", cast_to=JSON)


def webhook_rows() -> list[Row]:
    """The webhook endpoints (a corral extension: the SDK's own client, with no method of its own for it)."""
    one = "/v1/webhook_endpoints/{id}"
    path = "/v1/webhook_endpoints/"
    by_id = ("id", "webhook_endpoint", "webhook_endpoint_id")
    return [
        Row("GET", one, *by_id, lambda c, t, o: c.get(path + t.webhook_endpoint, cast_to=JSON)),
        Row("POST", one, *by_id,
            lambda c, t, o: c.post(path + t.webhook_endpoint, body={"description": "taken"}, cast_to=JSON)),
        Row("DELETE", one, *by_id, lambda c, t, o: c.delete(path + t.webhook_endpoint, cast_to=JSON)),
        *(Row("POST", one + "/" + action, *by_id, webhook_action(action))
          for action in ("rotate_secret", "enable", "disable")),
        Row("GET", one + "/deliveries", *by_id,
            lambda c, t, o: c.get(path + t.webhook_endpoint + "/deliveries", cast_to=JSON)),
    ]  # fmt: skip


def memory_rows() -> list[Row]:
    store = "/v1/memory_stores/{memory_store_id}"
    memory, version = store + "/memories/{memory_id}", store + "/memory_versions/{memory_version_id}"
    by_store = ("memory_store_id", "memory_store", "memory_store_id")
    return [
        *(
            Row(method, route, *by_store, call)
            for method, route, call in (
                ("GET", store, lambda c, t, o: c.beta.memory_stores.retrieve(t.memory_store)),
                ("POST", store, lambda c, t, o: c.beta.memory_stores.update(t.memory_store, name="taken")),
                ("DELETE", store, lambda c, t, o: c.beta.memory_stores.delete(t.memory_store)),
                ("POST", store + "/archive", lambda c, t, o: c.beta.memory_stores.archive(t.memory_store)),
                ("GET", store + "/memories", lambda c, t, o: c.beta.memory_stores.memories.list(t.memory_store)),
                ("POST", store + "/memories", lambda c, t, o: c.beta.memory_stores.memories.create(
                    t.memory_store, path="/taken.md", content="x")),
                ("GET", store + "/memory_versions",
                 lambda c, t, o: c.beta.memory_stores.memory_versions.list(t.memory_store)),
            )
        ),
        *(
            Row(method, route, param, position, field, call)
            for param, position, field in (by_store, ("memory_id", "memory", "memory_id"))
            for method, route, call in (
                ("GET", memory,
                 lambda c, t, o: c.beta.memory_stores.memories.retrieve(t.memory, memory_store_id=t.memory_store)),
                ("POST", memory, lambda c, t, o: c.beta.memory_stores.memories.update(
                    t.memory, memory_store_id=t.memory_store, content="taken")),
                ("DELETE", memory,
                 lambda c, t, o: c.beta.memory_stores.memories.delete(t.memory, memory_store_id=t.memory_store)),
            )
        ),
        *(
            Row(method, route, param, position, field, call)
            for param, position, field in (by_store, ("memory_version_id", "memory_version", "memory_version_id"))
            for method, route, call in (
                ("GET", version, lambda c, t, o: c.beta.memory_stores.memory_versions.retrieve(
                    t.memory_version, memory_store_id=t.memory_store)),
                ("POST", version + "/redact", lambda c, t, o: c.beta.memory_stores.memory_versions.redact(
                    t.memory_version, memory_store_id=t.memory_store)),
            )
        ),
    ]  # fmt: skip


def file_rubric(file_id: str) -> OutcomeParams:
    return {"type": "user.define_outcome", "description": "d", "rubric": {"type": "file", "file_id": file_id}}


LISTINGS = {
    ("GET", "/v1/agents"): "agent",
    ("GET", "/v1/environments"): "environment",
    ("GET", "/v1/sessions"): "session",
    ("GET", "/v1/vaults"): "vault",
    ("GET", "/v1/memory_stores"): "memory_store",
    ("GET", "/v1/skills"): "skill",
    ("GET", "/v1/files"): "file",
    ("GET", "/v1/dreams"): "dream",
    ("GET", "/v1/webhook_endpoints"): "webhook_endpoint",
    ("GET", "/v1/deployments"): "deployment",
    ("GET", "/v1/deployment_runs"): "deployment_run",
}
"""Routes that take no id and list the caller's objects: B's listing must show none of A's."""
NO_ID = {("POST", "/v1/agents"), ("POST", "/v1/environments"), ("POST", "/v1/vaults"), ("GET", "/healthz"),
         ("POST", "/v1/memory_stores"), ("POST", "/v1/skills"), ("POST", "/v1/files"),
         ("POST", "/v1/webhook_endpoints"), ("POST", "/v1/deployments")}  # fmt: skip
SKILL_MD = b"---\nname: tools\ndescription: Useful tools.\n---\n"
"""Routes that take no id at all (a create makes a new one in the caller's workspace)."""


def served_routes(stack: Stack) -> set[tuple[str, str, str]]:
    """Every (method, path, path parameter) the gateway serves; a route without parameters has `""`."""
    found = set()
    for route in create_app(stack.client).routes:
        assert isinstance(route, Route)
        params = re.findall(r"{(\w+)}", route.path) or [""]
        for method in route.methods or ():
            if method != "HEAD":
                found |= {(method, route.path, param) for param in params}
    return found


async def test_every_route_has_a_row(stack: Stack) -> None:
    covered = {(row.method, row.route, row.param) for row in rows() if ":" not in row.param}
    covered |= {(method, path, "") for method, path in (*LISTINGS, *NO_ID)}
    covered |= {(row.method, row.route, "") for row in rows() if ":" in row.param}  # ids in the body or query
    missing = served_routes(stack) - covered
    assert missing == set(), f"routes with no isolation row: {sorted(missing)}"
    assert {(m, p) for m, p, _ in covered} <= {(m, p) for m, p, _ in served_routes(stack)}, "a row for no route"


# ---- the gateway, and A's and B's objects ----------------------------------------------------------------------


@dataclass
class Gateway:
    url: str
    records: Records

    async def client(self, workspace: str) -> Client:
        key, _ = await create_key(self.records, unique(workspace))
        return anthropic.AsyncAnthropic(base_url=self.url, api_key=key, max_retries=0)


@pytest.fixture
async def gateway(stack: Stack, tmp_path: Path) -> AsyncIterator[Gateway]:
    dev_vault = shared_dev_vault()
    port = free_port()
    address = stack.client.service_client.config.target_host
    argv = [sys.executable, "-m", "gateway", "--port", str(port), "--temporal", address,
            "--harness-queue", stack.harness_queue, "--model-queue", stack.model_queue,
            "--gateway-queue", unique("gateway")]  # fmt: skip
    env = {"VAULT_ADDR": dev_vault.address, "VAULT_TOKEN": dev_vault.root_token.get_secret_value(),
           "CORRAL_VAULT_MOUNT": dev_vault.mount}  # fmt: skip
    with role_process("gateway", argv, tmp_path, **env) as process:
        url = f"http://127.0.0.1:{port}"
        await until_healthy(url, process)
        yield Gateway(url, Records(stack.client, task_queue=stack.harness_queue))


async def objects(stack: Stack, client: Client) -> Ids:
    """A workspace's objects: an agent with two versions, an environment, a vault with a credential, a session that
    has run a turn, and one with a repository resource."""
    agent = await client.beta.agents.create(name="helper", model=stack.script([{"text": "ok"}], loop=True))
    environment = await client.beta.environments.create(name="plain")
    vault = await client.beta.vaults.create(display_name="tools")
    hello = [{"type": "user.message", "content": [{"type": "text", "text": "hello"}]}]
    session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id, vault_ids=[vault.id],
                                                initial_events=hello)  # type: ignore[arg-type]  # fmt: skip
    ids = Ids(agent.id, environment.id, session.id, vault.id)
    await client.beta.agents.update(agent.id, version=1, system="be brief")

    async def idle() -> bool:
        return "session.status_idle" in [e.type async for e in client.beta.sessions.events.list(session.id)]

    await until(idle, "A's session went idle after its turn")
    event = await anext(e async for e in client.beta.sessions.events.list(session.id))
    repository = {"type": "github_repository", "url": "https://git.example/acme/widgets.git",
                  "authorization_token": "ghp_canary" + uuid.uuid4().hex}  # fmt: skip
    repo_session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id,
                                                     resources=[repository])  # type: ignore[list-item]  # fmt: skip
    credential = await client.beta.vaults.credentials.create(
        vault.id, auth={"type": "static_bearer", "mcp_server_url": "https://mcp.example/mcp", "token": "t0k-a"}
    )
    [resource] = repo_session.resources
    assert resource.type == "github_repository"
    hosted = await client.beta.environments.create(name="laptop", config={"type": "self_hosted"})
    env_key: dict[str, Any] = await client.post(f"/v1/environments/{hosted.id}/keys", cast_to=JSON)
    store = await client.beta.memory_stores.create(name="notes")
    memory = await client.beta.memory_stores.memories.create(store.id, path="/a.md", content="one")
    await client.beta.memory_stores.memories.update(memory.id, memory_store_id=store.id, content="two")
    ids = dataclasses.replace(ids, memory_store=store.id, memory=memory.id, memory_version=memory.memory_version_id)
    # A deployment, and a run of it that made no session (its environment archived), so A's sessions stay two.
    doomed = await client.beta.environments.create(name="doomed")
    deployment = await client.beta.deployments.create(agent=agent.id, environment_id=doomed.id, name="nightly",
                                                      initial_events=hello)  # type: ignore[arg-type]  # fmt: skip
    await client.beta.environments.archive(doomed.id)
    deployment_run = await client.beta.deployments.run(deployment.id)
    assert deployment_run.error is not None and deployment_run.error.type == "environment_archived_error"
    ids = dataclasses.replace(ids, deployment=deployment.id, deployment_run=deployment_run.id)
    skill = await client.beta.skills.create(files=[("tools/SKILL.md", SKILL_MD)])
    hook = await client.post("/v1/webhook_endpoints", body={"url": "https://hooks.example/in", "events": ["all"]},
                             cast_to=JSON)  # fmt: skip
    ids = dataclasses.replace(ids, webhook_endpoint=hook["id"])
    skill_version = await client.beta.skills.versions.create(skill.id, files=[("tools/SKILL.md", SKILL_MD)])
    return dataclasses.replace(ids, repo_session=repo_session.id, resource=resource.id, credential=credential.id,
                               event=event.id, thread=primary_thread_id(session.id), hosted=hosted.id,
                               env_key=env_key["id"], worker_key=env_key["key"],
                               work=await work_item(stack, hosted.id), skill=skill.id,
                               skill_version=skill_version.id,
                               file=(await client.beta.files.upload(file=("notes.md", b"notes"))).id,
                               dream=(await client.beta.dreams.create(inputs=dream_inputs(ids),
                                                                      model=agent.model.id)).id)  # fmt: skip


async def work_item(stack: Stack, environment_id: str) -> str:
    """An item in the environment's work queue, as a session's request for hands makes it."""
    queues = WorkQueues(stack.client, stack.harness_queue)
    workspace = (await Records(stack.client, task_queue=stack.harness_queue).get_any(environment_id)).workspace
    session_id = f"sesn_{uuid.uuid4().hex[:26]}"
    await queues.request(environment_id, WorkRequest(session_id=session_id, workspace=workspace))
    items: list[WorkItem] = []

    async def queued() -> bool:
        items[:] = await queues.items(environment_id)
        return bool(items)

    await until(queued, "the work item is queued")
    return items[0].id


async def snapshot(client: Client, a: Ids) -> dict[str, Any]:
    """Everything A can read of its objects: after any refused request, exactly the same."""
    return {
        "agent": (await client.beta.agents.retrieve(a.agent)).model_dump(),
        "agent versions": [v.model_dump() async for v in client.beta.agents.versions.list(a.agent)],
        "environment": (await client.beta.environments.retrieve(a.environment)).model_dump(),
        "work item": (await client.beta.environments.work.retrieve(a.work, environment_id=a.hosted)).model_dump(),
        "sessions": [(await client.beta.sessions.retrieve(s)).model_dump() for s in (a.session, a.repo_session)],
        "events": [e.model_dump() async for e in client.beta.sessions.events.list(a.session)],
        "threads": [(t.id, t.status, t.archived_at) async for t in client.beta.sessions.threads.list(a.session)],
        "resources": [r.model_dump() async for r in client.beta.sessions.resources.list(a.repo_session)],
        "vault": (await client.beta.vaults.retrieve(a.vault)).model_dump(),
        "credentials": [c.model_dump() async for c in client.beta.vaults.credentials.list(a.vault)],
        "environment keys": await environment_keys(client, a),
        "memory store": (await client.beta.memory_stores.retrieve(a.memory_store)).model_dump(),
        "memories": [
            m.model_dump() async for m in client.beta.memory_stores.memories.list(a.memory_store, view="full")
        ],
        "memory versions": [
            v.model_dump() async for v in client.beta.memory_stores.memory_versions.list(a.memory_store, view="full")
        ],
        "skill": (await client.beta.skills.retrieve(a.skill)).model_dump(),
        "skill versions": [v.model_dump() async for v in client.beta.skills.versions.list(a.skill)],
        "file": (await client.beta.files.retrieve_metadata(a.file)).model_dump(),
        "webhook endpoint": await client.get(f"/v1/webhook_endpoints/{a.webhook_endpoint}", cast_to=JSON),
        "deployment": (await client.beta.deployments.retrieve(a.deployment)).model_dump(),
        "deployment run": (await client.beta.deployment_runs.retrieve(a.deployment_run)).model_dump(),
        "listings": await listed(client),
    }


async def environment_keys(client: Client, a: Ids) -> list[dict[str, Any]]:
    listing: dict[str, Any] = await client.get(f"/v1/environments/{a.hosted}/keys", cast_to=JSON)
    return list(listing["data"])


async def listed(client: Client) -> dict[str, list[str]]:
    return {
        "agent": [x.id async for x in client.beta.agents.list()],
        "environment": [x.id async for x in client.beta.environments.list()],
        "session": [x.id async for x in client.beta.sessions.list()],
        "vault": [x.id async for x in client.beta.vaults.list()],
        "memory_store": [x.id async for x in client.beta.memory_stores.list()],
        "skill": [x.id async for x in client.beta.skills.list()],
        "file": [x.id async for x in client.beta.files.list()],
        "dream": [x.id async for x in client.beta.dreams.list()],
        "webhook_endpoint": [x["id"] for x in (await client.get("/v1/webhook_endpoints", cast_to=JSON))["data"]],
        "deployment": [x.id async for x in client.beta.deployments.list()],
        "deployment_run": [x.id async for x in client.beta.deployment_runs.list()],
    }


async def outcome(call: Awaitable[Any]) -> tuple[int, str]:
    """The status and error message a request got (200 and "" when it succeeded)."""
    try:
        result = await call
        if hasattr(result, "close"):  # a stream that opened: close it
            await result.close()
    except anthropic.APIStatusError as exc:
        error = exc.body.get("error") if isinstance(exc.body, dict) else None
        if not isinstance(error, dict):
            return exc.status_code, f"not the API's error shape: {exc.body!r}"
        return exc.status_code, f"{error.get('type')}: {error.get('message')}"
    return 200, ""


async def test_another_workspaces_ids_are_404_and_the_wrong_kind_is_400_on_every_route(
    stack: Stack, gateway: Gateway
) -> None:
    client_a, client_b = await gateway.client("tenant-a"), await gateway.client("tenant-b")
    a, b = await objects(stack, client_a), await objects(stack, client_b)
    listings_a = {"agent": [a.agent], "environment": sorted([a.environment, a.hosted]), "vault": [a.vault],
                  "session": sorted([a.session, a.repo_session]), "memory_store": [a.memory_store],
                  "skill": [a.skill], "file": [a.file], "dream": [a.dream], "deployment": [a.deployment],
                  "deployment_run": [a.deployment_run], "webhook_endpoint": [a.webhook_endpoint]}  # fmt: skip

    async def listed_fully() -> bool:  # visibility has caught up with A's objects: B's listings now mean something
        found = await listed(client_a)
        keys = [key["id"] for key in await environment_keys(client_a, a)]
        dream = await client_a.beta.dreams.retrieve(a.dream)  # its transcripts are files of A's, of its session's
        transcripts = (
            [f.id async for f in client_a.beta.files.list(scope_id=dream.session_id)] if dream.session_id else []
        )
        sort = {"session": sorted(found["session"]), "environment": sorted(found["environment"]),
                "file": sorted(set(found["file"]) - set(transcripts))}  # fmt: skip
        return {**found, **sort} == listings_a and keys == [a.env_key] and bool(transcripts)

    await until(listed_fully, "A's listings show A's objects")
    before = await snapshot(client_a, a)

    wrong: list[str] = []
    for row in rows():
        theirs = dataclasses.replace(b, **{row.position: getattr(a, row.position)})  # A's id here, B's elsewhere
        status, message = (row.cross, "not_found_error") if row.cross is None else await outcome(
            row.call(client_b, theirs, b)
        )  # fmt: skip
        if status != row.cross or (status == 404 and not message.startswith("not_found_error")):
            wrong.append(f"{row.method} {row.route} {row.param}, from another workspace: {status} {message}")
        mixed = dataclasses.replace(a, **{row.position: getattr(a, WRONG_KIND[row.position])})
        status, message = await outcome(row.call(client_a, mixed, a))
        if status != 400 or not message.startswith(f"invalid_request_error: {row.field}"):
            wrong.append(f"{row.method} {row.route} {row.param}, the wrong kind: {status} {message}")
    assert wrong == [], "\n".join(wrong)

    assert await snapshot(client_a, a) == before, "a refused request changed something of A's"
    seen_by_b = await listed(client_b)
    assert all(not set(seen_by_b[kind]) & set(ids) for kind, ids in listings_a.items()), seen_by_b
    assert sorted(seen_by_b["session"]) == sorted([b.session, b.repo_session]), "B's refused creates made none"

    async def made_by(**query: Any) -> list[str]:
        return sorted([s.id async for s in client_a.beta.sessions.list(**query)])

    # A listing by agent keeps that agent's sessions (the first made with version 1, the second with version 2).
    assert await made_by(agent_id=a.agent) == sorted([a.session, a.repo_session])
    assert await made_by(agent_id=a.agent, agent_version=1) == [a.session]
    assert await made_by(agent_id=a.agent, agent_version=2) == [a.repo_session]
    for refused_filter in ({"agent_version": 1},):
        with pytest.raises(anthropic.BadRequestError):  # a filter corral cannot apply is refused, never ignored
            await made_by(**refused_filter)


async def test_a_session_takes_an_environment_id_only(stack: Stack, gateway: Gateway) -> None:
    """The defect: `environment_id` could name any record of the workspace (a vault, an agent) and the session
    started with it as its sandbox recipe."""
    client = await gateway.client("tenant-env")
    agent = await client.beta.agents.create(name="helper", model=stack.script([{"text": "ok"}]))
    vault = await client.beta.vaults.create(display_name="not an environment")
    for other in (vault.id, agent.id, "sesn_" + uuid.uuid4().hex[:26], "nonsense"):
        with pytest.raises(anthropic.BadRequestError, match=r"^(Error code: )?400 .*environment_id") as refused:
            await client.beta.sessions.create(agent=agent.id, environment_id=other)
        assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError, match="environment"):
        await client.beta.sessions.create(agent=agent.id, environment_id="env_" + "0" * 26)
    assert [s async for s in client.beta.sessions.list()] == [], "no session was started"


async def test_a_request_selects_only_its_keys_workspace(gateway: Gateway) -> None:
    """The SDK's `workspace_id` (the `anthropic-workspace-id` header) "must match" the key's workspace: naming
    another one reaches nothing of it, and writes nothing anywhere."""
    mine, theirs = unique("tenant-own"), unique("tenant-other")
    key, _ = await create_key(gateway.records, mine)
    await create_key(gateway.records, theirs)
    client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key=key, max_retries=0)
    agent = await client.beta.agents.create(name="a", model="claude-sonnet-4-6", workspace_id=mine)
    assert (await client.beta.agents.retrieve(agent.id, workspace_id=mine)).id == agent.id
    for call in (
        client.beta.agents.retrieve(agent.id, workspace_id=theirs),
        client.beta.agents.create(name="b", model="claude-sonnet-4-6", workspace_id=theirs),
        client.beta.agents.list(workspace_id=theirs),
    ):
        with pytest.raises(anthropic.NotFoundError, match="workspace"):
            await call

    async def only_the_first() -> bool:
        return [a.id async for a in client.beta.agents.list()] == [agent.id]

    await until(only_the_first, "the key's workspace lists its one agent")
    theirs_key, _ = await create_key(gateway.records, theirs)
    other = anthropic.AsyncAnthropic(base_url=gateway.url, api_key=theirs_key, max_retries=0)
    assert [a.id async for a in other.beta.agents.list()] == [], "nothing was made in the workspace named"
