"""How an environment looks through the API and what corral runs for it: pure functions, like gateway/shapes.py.

An environment is stored as the API shows it (its record's body). A `cloud` one is a sandbox recipe corral runs on
its Docker engine (`environment_recipe`, validated at the edge, so a bad one is a 400 on create, never a failed
session); a `self_hosted` one is its type alone: its hands are a worker the user runs (corral.contract.work).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import ValidationError

from corral.contract.sandbox import Environment
from corral.envkeys import SELF_HOSTED
from corral.names import sandbox_engine_problem
from gateway.errors import ApiError, invalid
from gateway.shapes import check_metadata, patch_metadata, problem, when

CLOUD = "cloud"
"""A sandbox corral runs. The other type, `SELF_HOSTED` (corral.envkeys), is a worker the user runs (the SDK's
`EnvironmentWorker`): it takes no other config field, and an environment's type never changes (400
`invalid_config_type_change`, either way)."""
SUPPORTED_PACKAGES = ("apt", "pip")
ALL_PACKAGES = ("apt", "cargo", "gem", "go", "npm", "pip")
ENGINE = "engine"
"""corral's extension of a `cloud` config: the sandbox engine pool that provisions the environment's sandboxes (the
workers started with `CORRAL_SANDBOX_ENGINE=<name>`, on their own Docker engine). Absent: the default pool. Shown
only when set, so an environment without it looks exactly as upstream's."""


def environment_body(request: dict[str, Any], current: dict[str, Any] | None = None) -> dict[str, Any]:
    """The stored form of an environment (create, or update over `current`): a `cloud` config normalized and
    validated as corral's sandbox recipe, or a `self_hosted` one, which is its type alone."""
    known = {"name", "description", "metadata", "config", "scope"}
    unknown = sorted(set(request) - known)
    if unknown:
        raise invalid(f"unknown environment field(s): {', '.join(unknown)}")
    body = dict(current or {})
    if current is None:
        if not isinstance(request.get("name"), str) or not request["name"]:
            raise invalid("name is required")
        body["metadata"] = check_metadata(request.get("metadata"))
        body["config"] = {"type": CLOUD, "networking": {"type": "limited", "allowed_hosts": []}, "packages": {}}
    elif "metadata" in request:
        body["metadata"] = patch_metadata(body.get("metadata", {}), request["metadata"])
    for field in ("name", "description"):
        if field in request:
            if request[field] is not None and not isinstance(request[field], str):
                raise invalid(f"{field} must be a string")
            body[field] = request[field]
    config = request.get("config")
    if config is not None:
        kind = _config_type(config, config_type(current) if current is not None else CLOUD)
        if current is not None and kind != config_type(current):
            raise ApiError(400, f"config.type: this environment is {config_type(current)}, and an environment's type "
                                f"cannot change (make a new {kind} environment)",
                           error_code="invalid_config_type_change")  # fmt: skip
        if kind == SELF_HOSTED:
            extra = sorted(set(config) - {"type"})
            if extra:
                raise invalid(f"config: a self_hosted config has no field but type (not {', '.join(extra)}): its "
                              "worker runs on your machine, with what that machine has")  # fmt: skip
            body["config"] = {"type": SELF_HOSTED}
            return body
        merged = dict(body["config"])
        for key in ("networking", "packages"):
            if config.get(key) is not None:
                merged[key] = config[key]
        if ENGINE in config:  # unlike the other keys, an explicit null is meaningful: back to the default pool
            merged.pop(ENGINE, None)
            if config[ENGINE] is not None:
                merged[ENGINE] = check_engine(config[ENGINE])
        body["config"] = merged
    if config_type(body) == CLOUD:
        environment_recipe(body)
    return body


def config_type(body: dict[str, Any]) -> str:
    """`cloud` (a sandbox corral runs) or `self_hosted` (a worker on the user's machine) of a stored environment."""
    config = body.get("config") or {}
    return SELF_HOSTED if config.get("type") == SELF_HOSTED else CLOUD


def _config_type(config: Any, default: str) -> str:
    """The type a request's `config` names; left out, `default` (the environment's own, `cloud` for a new one)."""
    if not isinstance(config, dict):
        raise invalid("config must be an object: {type: 'cloud', ...} or {type: 'self_hosted'}")
    kind = config.get("type", default)
    if kind not in (CLOUD, SELF_HOSTED):
        raise invalid(f"config.type must be `cloud` (a sandbox on corral's Docker engine) or `self_hosted` (a worker "
                      f"you run, such as the SDK's EnvironmentWorker), not {str(kind)[:64]!r}")  # fmt: skip
    return str(kind)


def check_engine(engine: Any) -> str:
    """`config.engine` as corral's recipe takes it, or a 400 that says what a pool's name may be."""
    if not isinstance(engine, str):
        raise invalid("config.engine must be a string: the name of a sandbox engine pool (or null for the default)")
    problem = sandbox_engine_problem(engine)
    if problem is not None:
        raise invalid(f"config.engine: {problem}")
    return engine


def environment_recipe(body: dict[str, Any]) -> Environment:
    """corral's sandbox recipe for an environment. `limited` networking with no allowed host is corral's `none`."""
    config = body.get("config") or {}
    networking = config.get("networking") or {"type": "limited", "allowed_hosts": []}
    packages = config.get("packages") or {}
    if not isinstance(networking, dict) or not isinstance(packages, dict):
        raise invalid("config.networking and config.packages must be objects")
    if networking.get("allow_mcp_servers"):
        raise invalid("config.networking.allow_mcp_servers: MCP servers are reached through corral's proxy, "
                      "never from the sandbox; leave it false")  # fmt: skip
    unsupported = [kind for kind in ALL_PACKAGES if kind not in SUPPORTED_PACKAGES and packages.get(kind)]
    if unsupported:
        raise invalid(f"config.packages: corral installs apt and pip packages only, not {', '.join(unsupported)}")
    if networking.get("type") == "limited":
        hosts = list(networking.get("allowed_hosts") or [])
        corral_networking: dict[str, Any] = {"type": "limited", "allowed_hosts": hosts} if hosts else {"type": "none"}
    elif networking.get("type") == "unrestricted":
        corral_networking = {"type": "unrestricted"}
    else:
        raise invalid("config.networking.type must be `limited` or `unrestricted`")
    try:
        return Environment.model_validate(
            {
                "networking": corral_networking,
                "packages": {kind: list(packages.get(kind) or []) for kind in SUPPORTED_PACKAGES},
                **({ENGINE: config[ENGINE]} if config.get(ENGINE) is not None else {}),
            }
        )
    except ValidationError as exc:
        raise invalid(problem(exc, "config")) from exc


def environment_view(record_id: str, body: dict[str, Any], created: datetime, updated: datetime,
                     archived: datetime | None) -> dict[str, Any]:  # fmt: skip
    view = {
        "id": record_id,
        "type": "environment",
        "name": body.get("name"),
        "description": body.get("description"),
        "metadata": body.get("metadata") or {},
        "scope": "organization",
        "created_at": when(created),
        "updated_at": when(updated),
        "archived_at": when(archived),
    }
    if config_type(body) == SELF_HOSTED:
        return {**view, "config": {"type": SELF_HOSTED}}
    return {**view, "config": _cloud_config_view(body)}


def _cloud_config_view(body: dict[str, Any]) -> dict[str, Any]:
    config = body.get("config") or {}
    networking = dict(config.get("networking") or {"type": "limited", "allowed_hosts": []})
    if networking["type"] == "limited":
        networking = {
            "type": "limited",
            "allowed_hosts": list(networking.get("allowed_hosts") or []),
            "allow_mcp_servers": False,
            "allow_package_managers": bool(networking.get("allow_package_managers")),
        }
    packages = config.get("packages") or {}
    engine = {ENGINE: config[ENGINE]} if config.get(ENGINE) is not None else {}
    return {
        "type": CLOUD,
        "networking": networking,
        "packages": {"type": "packages", **{kind: list(packages.get(kind) or []) for kind in ALL_PACKAGES}},
        **engine,
    }
