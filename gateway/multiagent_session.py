"""A session's multi-agent config, resolved when the session is made: the agent's stored `multiagent`
(`gateway/multiagent.py`) becomes the harness's `Multiagent`, whose roster holds a full snapshot of each pinned
agent version, and whose `view` is the API's resolved form that `session.agent.multiagent` shows (the SDK's
`BetaManagedAgentsSessionMultiagent`: every key present, each agent a full `agent` snapshot).

A roster agent archived after the coordinator was saved still runs as pinned: the session takes the snapshot, as
it takes the coordinator's own version. Its hands are checked for the workspace, as the coordinator's are.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from corral.contract.agent import Multiagent, ThreadAgent
from corral.records import Records
from gateway.errors import invalid
from gateway.hands import check_hands
from gateway.multiagent import COORDINATOR, rosters
from gateway.owned import own_record
from gateway.session_status import AGENT_ONLY
from gateway.shapes import agent_config, agent_view

DEFAULT_MAX_THREADS: int = Multiagent.model_fields["max_threads"].default
"""Threads a session may spawn in all, unless the gateway is told otherwise (`CORRAL_MAX_THREADS_PER_SESSION`)."""


@dataclass(frozen=True)
class SessionLimits:
    """The limits the gateway gives every multi-agent session it makes (its operator's, from the environment)."""

    max_threads: int = DEFAULT_MAX_THREADS
    """Threads a session may spawn in all (`CORRAL_MAX_THREADS_PER_SESSION`)."""
    max_runs: int = Multiagent.model_fields["max_runs"].default
    """Workflow runs a session may start in all (`CORRAL_MAX_WORKFLOW_RUNS_PER_SESSION`)."""
    max_threads_per_run: int = Multiagent.model_fields["max_threads_per_run"].default
    """Threads one workflow run may spawn in all (`CORRAL_MAX_THREADS_PER_WORKFLOW_RUN`)."""


DEFAULT_LIMITS = SessionLimits()


def limit_problem(field: str, value: int) -> str | None:
    """Why `value` cannot be the `Multiagent` limit `field` (the contract's bounds), or None."""
    try:
        Multiagent.model_validate({field: value})
    except ValidationError as exc:
        return exc.errors()[0]["msg"]
    return None


def snapshot_view(view: dict[str, Any]) -> dict[str, Any]:
    """An agent's view as a session's snapshot of it: no record times or metadata, no multiagent (a thread's agent
    never coordinates)."""
    return {key: value for key, value in view.items() if key not in (*AGENT_ONLY, "multiagent")}


async def resolve_multiagent(
    records: Records, workspace: str, stored: dict[str, Any] | None, coordinator: dict[str, Any],
    limits: SessionLimits, own_queues: Iterable[str] = (),
) -> Multiagent | None:  # fmt: skip
    """The harness's form of `stored` (None for a single-thread agent). `coordinator` is the session's snapshot of
    its own agent, which `self` stands for. Workflow runs come of `multiagent_20261001`'s `workflows` (their
    predefined agents pinned as subagents are); the coordinator form runs none."""
    if not stored:
        return None
    view: dict[str, Any] = {**stored}
    agents: dict[str, list[ThreadAgent]] = {}
    for where, entries in rosters(stored):
        resolved: list[dict[str, Any]] = []
        agents[where] = []
        for index, entry in enumerate(entries):
            if entry["type"] == "advisor":
                resolved.append(dict(entry))
            elif entry["type"] == "self":
                resolved.append(snapshot_view(coordinator))
                agents[where].append(ThreadAgent(type="self"))
            else:
                field = f"agent.{where}[{index}]"
                record = await own_record(records, workspace, entry["id"], "agent", field, entry["version"])
                await check_hands(records, workspace, record.body.get("tools"), f"{field}.tools", own_queues)
                resolved.append(snapshot_view(agent_view(record.id, record.version, record.body, record.created_at,
                                                         record.updated_at, None)))  # fmt: skip
                config = agent_config(record.body)
                agents[where].append(ThreadAgent(type="agent", id=record.id, version=record.version, config=config))
        member = where.split(".")[1]
        if member == "agents":
            view["agents"] = resolved
        else:
            view[member] = {**stored[member], "predefined_agents": resolved}
    try:
        if stored["type"] == COORDINATOR:
            advisor = next((e["model"] for e in stored["agents"] if e["type"] == "advisor"), None)
            return Multiagent(type=COORDINATOR, agents=agents["multiagent.agents"], subagents=True,
                              inline_agents=False, advisor_model=advisor, max_threads=limits.max_threads,
                              runs=False, view=view)  # fmt: skip
        subagents, workflows = stored["subagents"], stored["workflows"]
        enabled, runs = subagents["type"] == "enabled", workflows["type"] == "enabled"
        advisor = stored["advisor"]["model"] if stored["advisor"]["type"] == "enabled" else None
        return Multiagent(
            type=stored["type"],
            agents=agents.get("multiagent.subagents.predefined_agents", []),
            subagents=enabled,
            inline_agents=enabled and subagents["inline_agents"]["type"] == "enabled",
            advisor_model=advisor,
            max_threads=limits.max_threads,
            workflows=workflows,
            runs=runs,
            run_agents=agents.get("multiagent.workflows.predefined_agents", []),
            run_inline_agents=runs and workflows["inline_agents"]["type"] == "enabled",
            max_runs=limits.max_runs,
            max_threads_per_run=limits.max_threads_per_run,
            view=view,
        )
    except ValidationError as exc:
        raise invalid(f"agent.multiagent: {exc.errors()[0]['msg']}") from exc
