"""How corral's objects look through the API, and how the API's objects become corral's: pure functions.

Agents are stored as the API shows them (their records' bodies); what corral runs is derived from them here, and
validated at the edge, so a bad agent is a 400 on create, never a failed session. Environments have their own
module (gateway/environment_config.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import ValidationError

from corral.contract.agent import Multiagent
from corral.contract.events import SessionEvent
from corral.contract.session import AgentConfig, SessionBudget
from corral.names import reserved_task_queue_problem
from gateway.agent_skills import skills_body, skills_view
from gateway.errors import invalid
from gateway.multiagent import check_reserved_tool_names, multiagent_body, multiagent_view

BUILT_IN_TOOLS = ["bash", "edit", "read", "write", "glob", "grep", "web_fetch", "web_search"]
ALWAYS_ALLOW = {"type": "always_allow"}
ALWAYS_ASK = {"type": "always_ask"}
MAX_METADATA = 16


def when(moment: datetime | None) -> str | None:
    """RFC 3339, as the SDK parses it."""
    return moment.isoformat().replace("+00:00", "Z") if moment is not None else None


def problem(error: ValidationError, where: str) -> str:
    """A pydantic error as one line a person can act on."""
    parts = []
    for item in error.errors()[:5]:
        location = ".".join(str(part) for part in item["loc"])
        parts.append(f"{where}{'.' + location if location else ''}: {item['msg']}")
    return "; ".join(parts)


def check_metadata(metadata: Any, where: str = "metadata") -> dict[str, str]:
    if metadata is None:
        return {}
    strings = isinstance(metadata, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    if not strings:
        raise invalid(f"{where} must be an object of strings")
    if len(metadata) > MAX_METADATA:
        raise invalid(f"{where} holds at most {MAX_METADATA} pairs, not {len(metadata)}")
    for key, value in metadata.items():
        if len(key) > 64 or len(value) > 512:
            raise invalid(f"{where}: keys are at most 64 characters and values at most 512 ({key[:64]!r})")
    return dict(metadata)


def patch_metadata(current: dict[str, str], patch: Any) -> dict[str, str]:
    """Upstream's metadata update: a string sets a key, null (or "") removes it, others stay."""
    if patch is None:
        return current
    if not isinstance(patch, dict):
        raise invalid("metadata must be an object")
    merged = dict(current)
    for key, value in patch.items():
        if value is None or value == "":
            merged.pop(key, None)
        elif isinstance(value, str):
            merged[key] = value
        else:
            raise invalid(f"metadata.{key} must be a string or null")
    return check_metadata(merged)


# ---- agents ---------------------------------------------------------------------------------------------------


def model_id(model: Any) -> str:
    if isinstance(model, str) and model:
        return model
    if isinstance(model, dict) and isinstance(model.get("id"), str) and model["id"]:
        return str(model["id"])
    raise invalid("model must be a model name or an object with an id")


def agent_config(body: dict[str, Any], multiagent: Multiagent | None = None) -> AgentConfig:
    """The corral agent an API agent runs (with its multiagent config as a session resolved it); a 400 that says
    what is wrong when corral cannot run it."""
    try:
        return AgentConfig.model_validate(
            {
                "model": model_id(body.get("model")),
                "name": body.get("name"),
                "system": body.get("system") or None,
                # Agents stored before policies were written in get them here: a session runs what the API shows.
                "tools": [_with_default_policy(tool) for tool in body.get("tools") or []],
                "mcp_servers": body.get("mcp_servers") or [],
                "multiagent": multiagent,
            }
        )
    except ValidationError as exc:
        raise invalid(problem(exc, "agent")) from exc


def agent_body(request: dict[str, Any], current: dict[str, Any] | None = None) -> dict[str, Any]:
    """The stored form of an agent from a create (no `current`) or an update request: omitted fields keep their
    value, metadata is patched, lists are replaced. Validated as a whole."""
    known = {"name", "model", "description", "system", "metadata", "tools", "mcp_servers", "skills", "version",
             "execution_identity", "multiagent"}  # fmt: skip
    unknown = sorted(set(request) - known)
    if unknown:
        raise invalid(f"unknown agent field(s): {', '.join(unknown)}")
    identity = request.get("execution_identity")
    if identity not in (None, {"type": "service_account"}):
        raise invalid("execution_identity: corral runs every agent as its service account")
    body = dict(current or {})
    if current is None:
        if not isinstance(request.get("name"), str) or not request["name"]:
            raise invalid("name is required")
        if "model" not in request:
            raise invalid("model is required")
        body["metadata"] = check_metadata(request.get("metadata"))
    elif "metadata" in request:
        body["metadata"] = patch_metadata(body.get("metadata", {}), request["metadata"])
    for field in ("name", "description", "system"):
        if field in request:
            value = request[field]
            if field == "name" and (not isinstance(value, str) or not value):
                raise invalid("name cannot be empty")
            if value is not None and not isinstance(value, str):
                raise invalid(f"{field} must be a string")
            body[field] = value or None if field != "name" else value
    if "model" in request:
        body["model"] = request["model"] if isinstance(request["model"], dict) else {"id": model_id(request["model"])}
        model_id(body["model"])
    for field in ("tools", "mcp_servers"):
        if field in request:
            body[field] = list(request[field] or [])
    if "skills" in request:  # whether each is the workspace's is checked after (I/O): `gateway.agents`
        body["skills"] = skills_body(request["skills"])
    if "multiagent" in request:  # its agents are pinned once the body is made (`gateway.multiagent.pin_multiagent`)
        body["multiagent"] = multiagent_body(request["multiagent"], body.get("multiagent"))
    check_reserved_tool_names(body)
    body["tools"] = [_with_default_policy(tool) for tool in body.get("tools") or []]
    for index, tool in enumerate(body["tools"]):  # by anyone: whether it is registered is checked after (I/O)
        queue = tool.get("task_queue") if isinstance(tool, dict) and tool.get("type") == "hand" else None
        reserved = reserved_task_queue_problem(queue) if isinstance(queue, str) else None
        if reserved is not None:
            raise invalid(f"tools[{index}].task_queue: {reserved}")
    agent_config(body)
    return body


DEFAULT_POLICIES = {"agent_toolset_20260401": ALWAYS_ALLOW, "mcp_toolset": ALWAYS_ASK}
"""Upstream's defaults: built-in tools run, MCP tools ask. corral's own default is `always_allow` everywhere."""


def _with_default_policy(tool: Any) -> Any:
    """A toolset with its default policy written in, so that what the API shows is what corral runs (a tool
    config with no policy of its own follows the toolset's default in both)."""
    if not isinstance(tool, dict) or not isinstance(tool.get("type"), str) or tool["type"] not in DEFAULT_POLICIES:
        return tool
    config = tool.get("default_config") or {}
    if not isinstance(config, dict):
        return tool  # malformed: `agent_config` says what is wrong
    policy = _policy(config.get("permission_policy"), DEFAULT_POLICIES[tool["type"]])
    return {**tool, "default_config": {**config, "permission_policy": policy}}


def _policy(policy: Any, default: dict[str, str]) -> dict[str, str]:
    return dict(policy) if isinstance(policy, dict) and policy.get("type") else dict(default)


def _tool_view(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as the API returns it: defaults made explicit (`enabled`, `permission_policy`)."""
    if tool.get("type") == "agent_toolset_20260401":
        default = tool.get("default_config") or {}
        enabled = default.get("enabled", True) is not False
        policy = _policy(default.get("permission_policy"), ALWAYS_ALLOW)
        configs = [
            {
                **config,
                "type": config.get("type", config["name"]),
                "enabled": config.get("enabled", enabled) is not False,
                "permission_policy": _policy(config.get("permission_policy"), policy),
            }
            for config in tool.get("configs") or []
        ]
        default_config = {"enabled": enabled, "permission_policy": policy}
        return {"type": tool["type"], "configs": configs, "default_config": default_config}
    if tool.get("type") == "mcp_toolset":
        default = tool.get("default_config") or {}
        enabled = default.get("enabled", True) is not False
        policy = _policy(default.get("permission_policy"), ALWAYS_ASK)
        configs = [
            {"name": config["name"], "enabled": config.get("enabled", enabled) is not False,
             "permission_policy": _policy(config.get("permission_policy"), policy)}
            for config in tool.get("configs") or []
        ]  # fmt: skip
        return {"type": "mcp_toolset", "mcp_server_name": tool["mcp_server_name"], "configs": configs,
                "default_config": {"enabled": enabled, "permission_policy": policy}}  # fmt: skip
    return dict(tool)


def agent_view(record_id: str, version: int, body: dict[str, Any], created: datetime, updated: datetime,
               archived: datetime | None) -> dict[str, Any]:  # fmt: skip
    model = body.get("model") or {}
    return {
        "id": record_id,
        "type": "agent",
        "name": body.get("name"),
        "version": version,
        "created_at": when(created),
        "updated_at": when(updated),
        "archived_at": when(archived),
        "description": body.get("description"),
        "system": body.get("system"),
        "metadata": body.get("metadata") or {},
        "model": {
            "id": model.get("id"),
            "speed": model.get("speed") or "standard",
            "effort": model.get("effort"),
            "inference_geo": model.get("inference_geo"),
        },
        "execution_identity": {"type": "service_account"},
        "mcp_servers": [{"type": "url", **server} for server in body.get("mcp_servers") or []],
        "skills": skills_view(body),
        "tools": [_tool_view(tool) for tool in body.get("tools") or []],
        "multiagent": multiagent_view(body.get("multiagent"), record_id, version),
    }


# ---- events ---------------------------------------------------------------------------------------------------


def event_view(event: SessionEvent) -> dict[str, Any]:
    """A log event as the API shows it: corral's events already carry upstream's types and fields; `processed_at`
    is set on every event the session has taken. A run's end keeps its `report` (what the coordinator reads) off
    the wire, where upstream shows the `result` only."""
    data = event.model_dump(mode="json", exclude_none=False)
    data.pop("client_id", None)
    if data["type"] == "workflow_run.status_ended":
        data.pop("report", None)
    if data.get("session_thread_id", "") is None:  # set only where a thread's event is cross-posted or routed
        del data["session_thread_id"]
    if data.get("processed_at") is None and not data["type"].startswith(("user.", "system.")):
        data["processed_at"] = data.get("created_at")
    return data


def budget_limit(raw: Any) -> SessionBudget | None:
    """A request's `budget` (None: none, or removed), checked; its price is never the client's to set."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or "price" in raw:
        raise invalid("budget must be {type: 'limit', max_list_cost: {amount, currency: 'USD'}} or null")
    try:
        return SessionBudget.model_validate(raw)
    except ValidationError as exc:
        raise invalid(f"budget: {exc}") from exc
