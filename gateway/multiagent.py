"""An agent's `multiagent` config over the API: its two forms checked, merged on update, and pinned, as the SDK's
types describe them (`BetaManagedAgentsMultiagentParams` and the types it names).

- `{type: coordinator, agents}`: a roster of 1-20 entries: an agent id, `{type: agent, id, version}`, `{type:
  self}` (at most one) or `{type: advisor, model}` (at most one).
- `{type: multiagent_20261001, advisor?, subagents?, workflows?}`: the advisor (default disabled), the threads it
  may spawn (default enabled: inline agents enabled, no predefined agents) and the workflow runs it may start (the
  same shape: the agents a run's tasks may run). On an update over a stored config of the same type, it merges
  level by level: an omitted key keeps its stored value, `null` takes its default, an object of another `type`
  replaces the stored one, a sent list replaces the stored list. Another type replaces the whole config.

The stored form is the config with every key present and every agent pinned (`{type: agent, id, version}`, an id
without a version taking the agent's latest version when the coordinator is saved); `self` stays `self`, so it
always means the coordinator's own version. Every agent named is checked for its kind and the caller's workspace
(another workspace's agent is not found, as one that never existed), is not archived, and coordinates no threads
of its own (depth 1). A session resolves the stored form into full snapshots (`gateway/multiagent_session.py`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from corral.contract.coordinator import (
    CONSULT_ADVISOR,
    MESSAGE_THREAD,
    SPAWN_THREAD,
    START_WORKFLOW_RUN,
    WAIT_FOR_THREADS,
)
from corral.records import Records
from gateway.errors import ApiError, invalid
from gateway.owned import id_of, own_record

COORDINATOR = "coordinator"
MULTIAGENT_20261001 = "multiagent_20261001"
MAX_AGENTS = 20
RESERVED_TOOL_NAMES = (SPAWN_THREAD, MESSAGE_THREAD, WAIT_FOR_THREADS, CONSULT_ADVISOR, START_WORKFLOW_RUN)
"""The coordinator's own tools (`corral/contract/coordinator.py`): no tool of a multi-agent agent may take them."""

DISABLED: dict[str, Any] = {"type": "disabled"}
ENABLED_SPAWNING: dict[str, Any] = {"type": "enabled", "inline_agents": {"type": "enabled"}, "predefined_agents": []}
DEFAULTS: dict[str, dict[str, Any]] = {
    "advisor": DISABLED,
    "subagents": ENABLED_SPAWNING,
    "workflows": ENABLED_SPAWNING,
}
"""Each member of `multiagent_20261001` when omitted on create or sent as null."""


def multiagent_body(sent: Any, stored: dict[str, Any] | None) -> dict[str, Any] | None:
    """The config an agent create (`stored` None) or update asks for, merged over `stored` and checked for its
    shape (400 naming the field); its agents are pinned afterwards (`pin_multiagent`, which reads records)."""
    if sent is None:
        return None
    if not isinstance(sent, dict) or sent.get("type") not in (COORDINATOR, MULTIAGENT_20261001):
        raise invalid(f"multiagent.type must be {COORDINATOR!r} or {MULTIAGENT_20261001!r} (send null for none)")
    if sent["type"] == COORDINATOR:
        _known(sent, ("type", "agents"), "multiagent")
        if "agents" not in sent:
            raise invalid("multiagent.agents is required: the roster of 1-20 agents the coordinator may spawn")
        return {"type": COORDINATOR, "agents": _roster(sent["agents"], "multiagent.agents", advisor=True, least=1)}
    _known(sent, ("type", *DEFAULTS), "multiagent")
    same = stored is not None and stored.get("type") == MULTIAGENT_20261001
    fresh = {"type": MULTIAGENT_20261001, **DEFAULTS}
    merged: dict[str, Any] = copy.deepcopy(stored if same and stored is not None else fresh)
    for member, default in DEFAULTS.items():
        if member not in sent:
            continue
        where = f"multiagent.{member}"
        if sent[member] is None:
            merged[member] = copy.deepcopy(default)
        elif member == "advisor":
            merged[member] = _advisor(sent[member], where)
        else:
            merged[member] = _spawning(sent[member], merged.get(member), where)
    for member in ("subagents", "workflows"):
        value = merged[member]
        if (
            value["type"] == "enabled"
            and value["inline_agents"]["type"] == "disabled"
            and not value["predefined_agents"]
        ):
            raise invalid(f"multiagent.{member}.predefined_agents must name at least one agent when inline_agents is "
                          "disabled")  # fmt: skip
    return merged


def _known(value: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise invalid(f"{where}: unknown field(s) {', '.join(unknown)} (a {value.get('type')!r} takes "
                      f"{', '.join(allowed)})")  # fmt: skip


def _typed(value: Any, types: tuple[str, ...], where: str) -> str:
    if not isinstance(value, dict) or value.get("type") not in types:
        raise invalid(f"{where} must be an object whose type is {' or '.join(repr(t) for t in types)}")
    return str(value["type"])


def _advisor(sent: Any, where: str) -> dict[str, Any]:
    if _typed(sent, ("enabled", "disabled"), where) == "disabled":
        _known(sent, ("type",), where)
        return dict(DISABLED)
    _known(sent, ("type", "model"), where)
    return {"type": "enabled", "model": _model(sent.get("model"), f"{where}.model")}


def _model(model: Any, where: str) -> str:
    if not isinstance(model, str) or not model:
        raise invalid(f"{where} is required: the advisor's model id")
    return model


def _spawning(sent: Any, stored: dict[str, Any] | None, where: str) -> dict[str, Any]:
    """`subagents` or `workflows`, merged over the stored member when both are enabled."""
    if _typed(sent, ("enabled", "disabled"), where) == "disabled":
        _known(sent, ("type",), where)
        return dict(DISABLED)
    _known(sent, ("type", "inline_agents", "predefined_agents"), where)
    merged = copy.deepcopy(stored if stored is not None and stored.get("type") == "enabled" else ENABLED_SPAWNING)
    if "inline_agents" in sent:
        inline = sent["inline_agents"]
        if inline is None:
            merged["inline_agents"] = {"type": "enabled"}
        else:
            merged["inline_agents"] = {"type": _typed(inline, ("enabled", "disabled"), f"{where}.inline_agents")}
            _known(inline, ("type",), f"{where}.inline_agents")
    if "predefined_agents" in sent:
        listed = sent["predefined_agents"]
        merged["predefined_agents"] = [] if listed is None else _roster(listed, f"{where}.predefined_agents")
    return merged


def _roster(entries: Any, where: str, advisor: bool = False, least: int = 0) -> list[dict[str, Any]]:
    """A roster or a `predefined_agents` list in its stored shape (agents not pinned yet), its entries distinct."""
    if not isinstance(entries, list) or not least <= len(entries) <= MAX_AGENTS:
        raise invalid(f"{where} must be a list of {least}-{MAX_AGENTS} agents")
    return _distinct([_entry(entry, f"{where}[{index}]", advisor) for index, entry in enumerate(entries)], where)


def _entry(entry: Any, where: str, advisor: bool) -> dict[str, Any]:
    if isinstance(entry, str):
        return {"type": "agent", "id": id_of(entry, where, "agent"), "version": None}
    kinds = ("agent", "self", "advisor") if advisor else ("agent", "self")
    if not isinstance(entry, dict) or entry.get("type") not in kinds:
        shapes = "an agent id, {type: 'agent', id, version}, {type: 'self'}" + (", {type: 'advisor', model}"
                                                                                  if advisor else "")  # fmt: skip
        raise invalid(f"{where} must be {shapes}")
    if entry["type"] == "self":
        _known(entry, ("type",), where)
        return {"type": "self"}
    if entry["type"] == "advisor":
        _known(entry, ("type", "model"), where)
        return {"type": "advisor", "model": _model(entry.get("model"), f"{where}.model")}
    _known(entry, ("type", "id", "version"), where)
    version = entry.get("version")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 1):
        raise invalid(f"{where}.version must be a positive integer")
    return {"type": "agent", "id": id_of(entry.get("id"), f"{where}.id", "agent"), "version": version}


def _distinct(entries: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """At most one `self` and one advisor, and no agent twice (at whatever versions)."""
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        key = entry.get("id") or entry["type"]
        if key in seen and entry.get("id"):
            raise invalid(f"{where}[{index}]: agent {key!r} is already listed; entries must name distinct agents")
        if key in seen:
            raise invalid(f"{where}[{index}]: at most one {key!r} entry (`self` is this agent)")
        seen.add(key)
    return entries


def rosters(multiagent: dict[str, Any]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Each list of agents in a stored config, with the field that names it."""
    if multiagent["type"] == COORDINATOR:
        yield "multiagent.agents", multiagent["agents"]
        return
    for member in ("subagents", "workflows"):
        if multiagent[member]["type"] == "enabled":
            yield f"multiagent.{member}.predefined_agents", multiagent[member]["predefined_agents"]


async def pin_multiagent(
    records: Records, workspace: str, multiagent: dict[str, Any] | None, own_id: str | None
) -> dict[str, Any] | None:
    """The config with every agent checked and pinned: of `workspace` (else 404, as for none), not archived,
    without a multiagent config of its own; an agent named without a version takes its latest. The agent's own id
    (`own_id`, on an update) is `self`, as the agent view shows `self`."""
    if multiagent is None:
        return None
    pinned = copy.deepcopy(multiagent)
    for where, entries in rosters(pinned):
        for index, entry in enumerate(entries):
            if entry["type"] == "agent" and entry["id"] == own_id:
                entries[index] = {"type": "self"}
            elif entry["type"] == "agent":
                entries[index] = await _pinned(records, workspace, entry, f"{where}[{index}]")
        _distinct(entries, where)
    return pinned


async def _pinned(records: Records, workspace: str, entry: dict[str, Any], where: str) -> dict[str, Any]:
    agent_id, version = entry["id"], entry.get("version")
    try:
        latest = await own_record(records, workspace, agent_id, "agent", where)
        record = latest if version in (None, latest.version) else await own_record(
            records, workspace, agent_id, "agent", where, version
        )  # fmt: skip
    except ApiError as exc:
        raise ApiError(exc.status, f"{where}: {exc.message}", error_code=exc.error_code) from exc
    if latest.archived_at is not None:
        raise invalid(f"{where}: agent {agent_id!r} is archived")
    if record.body.get("multiagent"):
        raise invalid(f"{where}: agent {agent_id!r} (version {record.version}) has a multiagent config of its own; "
                      "a roster is one level deep")  # fmt: skip
    return {"type": "agent", "id": agent_id, "version": record.version}


def check_reserved_tool_names(body: dict[str, Any]) -> None:
    """A multi-agent agent's own tools may not take a coordinator tool's name (400 naming the tool)."""
    if not body.get("multiagent"):
        return
    for index, tool in enumerate(body.get("tools") or []):
        name = tool.get("name") if isinstance(tool, dict) else None
        if name in RESERVED_TOOL_NAMES:
            raise invalid(f"tools[{index}].name: {name!r} is reserved for the coordinator's own tools in an agent "
                          f"with a multiagent config ({', '.join(RESERVED_TOOL_NAMES)}); rename the tool")  # fmt: skip


def multiagent_view(multiagent: dict[str, Any] | None, own_id: str, own_version: int) -> dict[str, Any] | None:
    """The stored config as an agent shows it (the SDK's `BetaManagedAgentsMultiagent`): every agent a reference
    with its version, `self` this agent at the version shown."""
    if not multiagent:
        return None
    view = copy.deepcopy(multiagent)
    for _, entries in rosters(view):
        for index, entry in enumerate(entries):
            if entry["type"] == "self":
                entries[index] = {"type": "agent", "id": own_id, "version": own_version}
    return view
