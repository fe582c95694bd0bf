"""What a deployment request may say, checked at the edge (400 naming the problem), and how a deployment shows.

A deployment's record body is the request's fields as checked (the agent pinned to a version by
`gateway/deployments.py`), its `status` and `paused_reason`, and, once archived, the `last_run_at` its deleted
Schedule had. The cron expression is stored as given and handed to Temporal normalised (`temporal_cron`).
"""

from __future__ import annotations

import re
import zoneinfo
from typing import Any

from gateway.errors import invalid
from gateway.repositories import session_repositories
from gateway.session_knowledge import knowledge_resources as split_resources
from gateway.sessions import _check_initial_events
from gateway.shapes import budget_limit, check_metadata, patch_metadata, when

MAX_INITIAL_EVENTS = 50
MAX_RESOURCES = 500
MAX_VAULTS = 50
DEPLOYMENT_FIELDS = frozenset({"agent", "environment_id", "name", "description", "initial_events", "resources",
                               "vault_ids", "budget", "metadata", "schedule"})  # fmt: skip
NOT_CLEARED = ("agent", "environment_id", "name", "initial_events")
"""What an update may change and never clear (null is refused)."""
REPLACED = ("budget", "resources", "schedule", "vault_ids")
"""What an update replaces whole, null clearing it (metadata is patched; description replaced)."""

CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12),
               ("day of week", 0, 7))  # fmt: skip
_CRON_ITEM = re.compile(r"^(?:\*|(?P<low>\d+)(?:-(?P<high>\d+))?)(?:/(?P<step>\d+))?$")


def cron_problem(expression: Any) -> str | None:
    """Why `expression` is not a 5-field POSIX cron expression (DOW 0-7, no L/W/#/?/@ shortcuts), or None."""
    if not isinstance(expression, str) or not expression.strip():
        return "schedule.expression must be a 5-field cron expression like '0 9 * * 1-5'"
    if expression.strip().startswith("@"):
        return f"schedule.expression: shortcuts like {expression.split()[0]!r} are not supported; write the 5 fields"
    fields = expression.split()
    if len(fields) != 5:
        return (f"schedule.expression must have 5 fields (minute hour day-of-month month day-of-week), "
                f"not {len(fields)}: {expression!r}")  # fmt: skip
    for text, (name, lowest, highest) in zip(fields, CRON_FIELDS, strict=True):
        for item in text.split(","):
            match = _CRON_ITEM.match(item)
            if match is None:
                return (f"schedule.expression: {name} field {text!r} is not numbers, ranges, steps and '*' "
                        "(L, W, #, ? and names are not supported)")  # fmt: skip
            values = [int(v) for v in (match["low"], match["high"]) if v is not None]
            if any(not lowest <= value <= highest for value in values):
                return f"schedule.expression: {name} field {text!r} is outside {lowest}-{highest}"
            if len(values) == 2 and values[0] > values[1]:
                return f"schedule.expression: {name} field {text!r} has a range that runs backwards"
            if match["step"] is not None and int(match["step"]) < 1:
                return f"schedule.expression: {name} field {text!r} has a step of 0"
    return None


def temporal_cron(expression: str) -> str:
    """The expression as Temporal's schedule spec takes it: the day of week spelled out as 0-6 (7 is Sunday)."""
    fields = expression.split()
    if fields[4] == "*":
        return " ".join(fields)
    days: set[int] = set()
    for item in fields[4].split(","):
        match = _CRON_ITEM.match(item)
        assert match is not None  # checked by cron_problem
        low = 0 if match["low"] is None else int(match["low"])
        high = 7 if match["low"] is None else int(match["high"] or match["low"])
        if match["step"] is not None and match["high"] is None and match["low"] is not None:
            high = 7
        days.update(day % 7 for day in range(low, high + 1, int(match["step"] or 1)))
    return " ".join([*fields[:4], ",".join(str(day) for day in sorted(days))])


def check_schedule(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.get("type", "cron") != "cron":
        raise invalid("schedule must be {type: 'cron', expression, timezone} or null")
    unknown = sorted(set(raw) - {"type", "expression", "timezone"})
    if unknown:
        raise invalid(f"schedule: unknown field(s) {', '.join(unknown)}")
    problem = cron_problem(raw.get("expression"))
    if problem:
        raise invalid(problem)
    timezone = raw.get("timezone")
    if not isinstance(timezone, str) or not timezone:
        raise invalid("schedule.timezone is required: an IANA time zone like 'UTC' or 'Europe/Berlin'")
    try:
        zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise invalid(f"schedule.timezone: {timezone[:64]!r} is not an IANA time zone (like 'Europe/Berlin')") from exc
    return {"type": "cron", "expression": " ".join(raw["expression"].split()), "timezone": timezone}


def check_initial_events(raw: Any) -> list[dict[str, Any]]:
    """1 to 50 events a session takes at its start (a deployment saved with events no session takes would fail
    every fire: refused here instead, with the session's own reason)."""
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_INITIAL_EVENTS:
        raise invalid(f"initial_events must be a list of 1 to {MAX_INITIAL_EVENTS} events")
    if any(isinstance(event, dict) and "id" in event for event in raw):
        raise invalid("initial_events: an event's id is the deployment's to give (one per run)")
    _check_initial_events(raw)
    return raw


def check_resources(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_RESOURCES:
        raise invalid(f"resources must be a list of at most {MAX_RESOURCES} resources")
    for index, resource in enumerate(raw):
        if isinstance(resource, dict) and resource.get("authorization_token") is not None:
            raise invalid(f"resources[{index}]: a deployment keeps no repository token yet (it would be stored with "
                          "the deployment): use a public repository, or a vault credential")  # fmt: skip
    repositories, _ = split_resources(raw)
    session_repositories(repositories)  # their shape, as a session checks it
    return raw


def check_vault_list(raw: Any) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw) or len(raw) > MAX_VAULTS:
        raise invalid(f"vault_ids must be a list of at most {MAX_VAULTS} vault ids")
    return raw


def check_name(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip() or len(raw) > 256:
        raise invalid("name must be a non-empty string of at most 256 characters")
    return raw


def deployment_body(request: dict[str, Any], current: dict[str, Any] | None = None) -> dict[str, Any]:
    """The body a create (`current` None) or an update asks for; `agent` stays the request's reference until the
    resource pins it. Status is never the request's: pause and unpause set it."""
    if not isinstance(request, dict):
        raise invalid("the body must be a JSON object")
    unknown = sorted(set(request) - DEPLOYMENT_FIELDS)
    if unknown:
        raise invalid(f"unknown deployment field(s): {', '.join(unknown)}")
    if current is None:
        missing = [name for name in NOT_CLEARED if request.get(name) is None]
        if missing:
            raise invalid(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required")
        body: dict[str, Any] = {"status": "active", "paused_reason": None, "metadata": {}}
    else:
        cleared = [name for name in NOT_CLEARED if name in request and request[name] is None]
        if cleared:
            raise invalid(f"{', '.join(cleared)} cannot be cleared")
        body = dict(current)
    for name in NOT_CLEARED + REPLACED + ("description",):
        if name in request or current is None:
            body[name] = request.get(name)
    body["name"] = check_name(body["name"])
    if body.get("description") is not None and not isinstance(body["description"], str):
        raise invalid("description must be a string or null")
    if not isinstance(body["environment_id"], str):
        raise invalid("environment_id must be an environment id (env_…)")
    body["initial_events"] = check_initial_events(body["initial_events"])
    body["resources"] = check_resources(body.get("resources"))
    body["vault_ids"] = check_vault_list(body.get("vault_ids"))
    body["schedule"] = check_schedule(body.get("schedule"))
    if body.get("budget") is not None:
        budget_limit(body["budget"])  # its shape; the price is the session's to copy in at each fire
    if current is None:
        body["metadata"] = check_metadata(request.get("metadata"))
    elif "metadata" in request:
        body["metadata"] = patch_metadata(current.get("metadata") or {}, request["metadata"])
    return body


def deployment_view(record: Any, last_run_at: Any = None, upcoming: list[Any] | None = None) -> dict[str, Any]:
    """A deployment as the SDK reads it (`BetaManagedAgentsDeployment`); the schedule's times come from Temporal."""
    body = record.body
    schedule = None
    if body.get("schedule") is not None:
        archived = record.archived_at is not None
        schedule = {**body["schedule"], "last_run_at": when(last_run_at) if not archived else body.get("last_run_at"),
                    "upcoming_runs_at": [] if archived else [when(t) for t in (upcoming or [])]}  # fmt: skip
    view = {
        "type": "deployment",
        "id": record.id,
        "name": body["name"],
        "description": body.get("description"),
        "agent": body["agent"],
        "environment_id": body["environment_id"],
        "initial_events": body["initial_events"],
        "resources": body.get("resources") or [],
        "vault_ids": body.get("vault_ids") or [],
        "metadata": body.get("metadata") or {},
        "schedule": schedule,
        "status": "active" if record.archived_at is not None else body.get("status", "active"),
        "paused_reason": None if record.archived_at is not None else body.get("paused_reason"),
        "created_at": when(record.created_at),
        "updated_at": when(record.updated_at),
        "archived_at": when(record.archived_at),
    }
    if body.get("budget") is not None:
        view["budget"] = body["budget"]
    return view
